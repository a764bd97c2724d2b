// What a TCP job costs to start, per rank count: launched as a job of processes
// (scripts/launch_local, torchrun, srun...), every rank builds its communicator from the
// environment, and rank 0 reports the slowest rank's Communicator::from_env(), the time from the
// last rank's start to the last rank's ready communicator (the library's own share: the rest is
// waiting for processes the launcher has not started yet), the first barrier, and the largest
// resident memory (anonymous and shared-memory pages apart) and open descriptors of any rank.
// scripts/bench_rendezvous runs it over a series of rank counts and prints the table of
// docs/benchmarks.md.
//
//   scripts/launch_local 64 build/benchmarks/rendezvous_bench --csv rendezvous.csv

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/rendezvous/descriptor_limit.hpp>
#include <coltrain/core/error.hpp>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace coltrain;

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A field of /proc/self/status in MiB ("RssAnon:   1234 kB"); 0 where the kernel has none.
double status_mib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with(field + ":")) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  return 0.0;
}

// Every collective on int64 values that identify (rank, block, element), so any misplaced,
// missing or doubled contribution shows; per-rank buffers up to `max_elements`. Every rank makes
// every call whatever it finds, so that a wrong result cannot leave the ranks in different calls.
// Returns the first wrong call on this rank ("allgather of 1000 elements"), or an empty string.
std::string check_collectives(comm::Communicator& comm, std::size_t max_elements) {
  using V = std::int64_t;
  const auto p = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<V>(comm.rank());
  const V last = static_cast<V>(p) - 1;
  // Unique for every (rank, block, element) of the sizes used here.
  const auto tag = [](V rank, V block, V element) {
    return (rank << 40) + (block << 20) + element;
  };
  // The sum over ranks of (rank + j).
  const auto rank_sum = [&](std::size_t j) {
    return last * (last + 1) / 2 + static_cast<V>(p * j);
  };
  std::string first_wrong;
  const auto expect = [&](bool right, const char* collective, std::size_t count) {
    if (!right && first_wrong.empty())
      first_wrong = std::string(collective) + " of " + std::to_string(count) + " elements";
  };
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, max_elements}) {
    std::vector<V> data(n), reduced(n, -1);
    bool right = true;
    for (std::size_t i = 0; i < n; ++i) data[i] = me + static_cast<V>(i);
    comm.reduce(std::span<const V>(data), std::span(reduced), 0);
    for (std::size_t i = 0; me == 0 && i < n; ++i) right = right && reduced[i] == rank_sum(i);
    expect(right, "reduce", n);
    comm.allreduce(std::span(data));
    right = true;
    for (std::size_t i = 0; i < n; ++i) right = right && data[i] == rank_sum(i);
    expect(right, "allreduce", n);
    for (std::size_t i = 0; i < n; ++i) data[i] = me == last ? tag(last, 0, V(i)) : -1;
    comm.broadcast(std::span(data), static_cast<int>(last));
    right = true;
    for (std::size_t i = 0; i < n; ++i) right = right && data[i] == tag(last, 0, V(i));
    expect(right, "broadcast", n);

    // Blocked collectives: `blocked` elements in each rank's block.
    const std::size_t blocked = std::max<std::size_t>(1, std::min(n, max_elements / p));
    std::vector<V> mine(blocked), all(blocked * p, -1), exchanged(blocked * p, -1);
    for (std::size_t i = 0; i < blocked; ++i) mine[i] = tag(me, 0, V(i));
    comm.allgather(std::span<const V>(mine), std::span(all));
    right = true;
    for (std::size_t j = 0; j < blocked * p; ++j)
      right = right && all[j] == tag(V(j / blocked), 0, V(j % blocked));
    expect(right, "allgather", blocked);
    std::fill(all.begin(), all.end(), -1);
    comm.gather(std::span<const V>(mine), std::span(all), 0);
    right = true;
    for (std::size_t j = 0; me == 0 && j < blocked * p; ++j)
      right = right && all[j] == tag(V(j / blocked), 0, V(j % blocked));
    expect(right, "gather", blocked);
    for (std::size_t j = 0; j < blocked * p; ++j) all[j] = tag(me, V(j / blocked), V(j % blocked));
    comm.alltoall(std::span<const V>(all), std::span(exchanged));
    right = true;
    for (std::size_t j = 0; j < blocked * p; ++j)
      right = right && exchanged[j] == tag(V(j / blocked), me, V(j % blocked));
    expect(right, "alltoall", blocked);
    comm.scatter(std::span<const V>(all), std::span(mine), 0);
    right = true;
    for (std::size_t i = 0; i < blocked; ++i) right = right && mine[i] == tag(0, me, V(i));
    expect(right, "scatter", blocked);
    for (std::size_t j = 0; j < blocked * p; ++j) all[j] = me + static_cast<V>(j);
    comm.reduce_scatter(std::span<const V>(all), std::span(mine));
    right = true;
    for (std::size_t i = 0; i < blocked; ++i)
      right = right && mine[i] == rank_sum(static_cast<std::size_t>(me) * blocked + i);
    expect(right, "reduce_scatter", blocked);
  }
  return first_wrong;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The TCP rendezvous of a job of processes: time, memory and descriptors per rank"};
  std::string csv;
  app.add_option("--csv", csv, "append one row to this CSV file (rank 0; a header if it is new)");
  bool check = false;
  app.add_flag("--check", check, "then run every collective and check each result exactly");
  std::size_t max_elements = std::size_t{1} << 18;
  app.add_option("--max-elements", max_elements,
                 "largest per-rank buffer of --check, in int64 elements")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{1000}, std::size_t{1} << 28));
  CLI11_PARSE(app, argc, argv);

  try {
    const double started = seconds_since_epoch();
    auto comm = comm::Communicator::from_env();
    const double ready = seconds_since_epoch();
    comm.barrier();
    const double synchronised = seconds_since_epoch();

    // Maxima over the ranks (of the starts: the last one).
    double maxima[] = {ready - started,
                       synchronised - ready,
                       started,
                       ready,
                       status_mib("VmHWM"),
                       status_mib("RssAnon"),
                       status_mib("RssShmem"),
                       static_cast<double>(comm::detail::open_descriptor_count())};
    comm.allreduce(std::span<double>(maxima), comm::ReduceOp::kMax);
    if (check) {
      const std::string failed = check_collectives(comm, max_elements);
      double wrong_ranks = failed.empty() ? 0 : 1;
      comm.allreduce(std::span<double>(&wrong_ranks, 1));
      if (!failed.empty())
        std::fprintf(stderr, "rendezvous_bench: rank %d: %s wrong\n", comm.rank(), failed.c_str());
      if (comm.rank() == 0 && wrong_ranks > 0)
        std::fprintf(stderr, "rendezvous_bench: wrong results on %.0f of %d ranks\n", wrong_ranks,
                     comm.size());
      if (wrong_ranks > 0) return 1;
    }
    if (comm.rank() != 0) return 0;
    if (check)
      std::printf(
          "%d ranks: every collective exact (allreduce, broadcast, reduce, allgather, "
          "gather, alltoall, scatter, reduce_scatter; up to %zu int64 elements a rank)\n",
          comm.size(), max_elements);
    const double after_last_start = maxima[3] - maxima[2];
    std::printf(
        "%d ranks: from_env %.3f s (slowest rank), %.3f s after the last rank started; first "
        "barrier %.3f s; per rank at most %.1f MiB resident (peak; anonymous %.1f, shared memory "
        "%.1f), %.0f descriptors\n",
        comm.size(), maxima[0], after_last_start, maxima[1], maxima[4], maxima[5], maxima[6],
        maxima[7]);
    if (!csv.empty()) {
      const bool fresh = !std::filesystem::exists(csv);
      std::ofstream out(csv, std::ios::app);
      if (fresh)
        out << "ranks,from_env_s,after_last_start_s,first_barrier_s,peak_rss_mib,rss_anon_mib,"
               "rss_shmem_mib,descriptors\n";
      out << comm.size() << ',' << maxima[0] << ',' << after_last_start << ',' << maxima[1] << ','
          << maxima[4] << ',' << maxima[5] << ',' << maxima[6] << ',' << maxima[7] << '\n';
      if (!out) throw Error("rendezvous_bench: cannot write " + csv);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "rendezvous_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
