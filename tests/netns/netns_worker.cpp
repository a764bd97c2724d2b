// One rank of tests/netns/netns_job.sh's jobs across network namespaces: every collective at
// several sizes over TCP, each result checked exactly (small integers, so sums are exact in float),
// and one line on rank 0 saying how many passed. Exits 1 with the error on any failure.
#include <coltrain/comm.hpp>

#include <cstdio>
#include <exception>
#include <iostream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void expect(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error("wrong result: " + what);
}

}  // namespace

int main() {
  try {
    auto comm = coltrain::comm::Communicator::from_env(coltrain::comm::Backend::kTcp);
    const int rank = comm.rank();
    const int size = comm.size();
    int checked = 0;
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7},
                                    std::size_t{1000}, std::size_t{1} << 20}) {
      const std::string at = " of " + std::to_string(count) + " floats";
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i) data[i] = float((i % 13) * (rank + 1));
      comm.allreduce(std::span(data));
      for (std::size_t i = 0; i < count; ++i)
        expect(data[i] == float((i % 13) * size * (size + 1) / 2), "allreduce" + at);

      std::vector<float> root_data(count, float(rank == size - 1 ? 42 : -1));
      comm.broadcast(std::span(root_data), size - 1);
      for (const float value : root_data) expect(value == 42.0f, "broadcast" + at);

      std::vector<float> mine(count, float(rank));
      std::vector<float> all(count * static_cast<std::size_t>(size));
      comm.allgather(std::span<const float>(mine), std::span(all));
      for (std::size_t i = 0; i < all.size(); ++i)
        expect(all[i] == float(i / (count == 0 ? 1 : count)), "allgather" + at);
      comm.barrier();
      checked += 4;
    }
    if (rank == 0) std::printf("exact: %d collectives on %d ranks\n", checked, size);
  } catch (const std::exception& error) {
    std::cerr << "error: " << error.what() << '\n';
    return 1;
  }
  return 0;
}
