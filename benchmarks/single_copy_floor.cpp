// The floor of a 2-rank allreduce through single copy on this machine: the work each rank of
// ring_allreduce does over the TCP backend's shared memory, without the protocol around it. Two
// processes (a fork) at once, each over `--bytes` of floats: for every chunk of its half, copy the
// peer's chunk out of the peer's memory (process_vm_readv) and reduce it into its own output
// (reduce-scatter); then copy the peer's other half into its output (allgather). Prints the median
// time and the bus bandwidth it would mean, to set beside allreduce_bench's TCP figure.

#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/tensor/storage.hpp>

#include <CLI/CLI.hpp>

#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <vector>

namespace {

// Copies `bytes` at `remote` in process `pid` to `local`.
bool read_remote(pid_t pid, std::byte* local, const std::byte* remote, std::size_t bytes) {
  iovec to{local, bytes};
  iovec from{const_cast<std::byte*>(remote), bytes};
  return ::process_vm_readv(pid, &to, 1, &from, 1, 0) == static_cast<ssize_t>(bytes);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("2-rank allreduce work through process_vm_readv, without the protocol");
  std::size_t bytes = std::size_t{64} << 20;
  std::size_t chunk = std::size_t{256} << 10;
  int rounds = 10;
  app.add_option("--bytes", bytes, "allreduce size")->capture_default_str();
  app.add_option("--chunk", chunk, "bytes per copy")->capture_default_str();
  app.add_option("--rounds", rounds)->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  bytes = bytes / (2 * chunk) * (2 * chunk);
  if (bytes == 0) {
    std::fprintf(stderr, "single_copy_floor: --bytes must be at least twice --chunk\n");
    return 2;
  }
  const std::size_t half = bytes / 2;

  std::vector<float> slot(chunk / sizeof(float));
  int to_child[2], to_parent[2];
  if (::pipe(to_child) != 0 || ::pipe(to_parent) != 0) return 1;
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) return 1;
  const bool is_child = child == 0;
  const pid_t peer = is_child ? parent : child;
  const int to_peer = is_child ? to_parent[1] : to_child[1];
  const int from_peer = is_child ? to_child[0] : to_parent[0];
  const std::size_t mine = is_child ? half : 0;  // this process reduces [mine, mine + half)
  const std::size_t theirs = half - mine;

  // Each process allocates its buffers after the fork, as allreduce_bench's ranks do (on huge
  // pages; COLTRAIN_HUGE_PAGES=0: not), and tells the other where they are. (Buffers allocated
  // before the fork would share pages copy-on-write, which the first write splits.)
  coltrain::tensor::Storage<float, coltrain::tensor::Cpu> input(bytes / sizeof(float)),
      output(input.size());
  std::fill_n(input.data(), input.size(), 1.0f);
  std::byte* const mine_at[2] = {reinterpret_cast<std::byte*>(input.data()),
                                 reinterpret_cast<std::byte*>(output.data())};
  std::byte* theirs_at[2] = {};
  if (::write(to_peer, mine_at, sizeof mine_at) != static_cast<ssize_t>(sizeof mine_at) ||
      ::read(from_peer, theirs_at, sizeof theirs_at) != static_cast<ssize_t>(sizeof theirs_at))
    return 1;
  std::byte* const in = mine_at[0];
  std::byte* const out = mine_at[1];
  const std::byte* const peer_in = theirs_at[0];
  const std::byte* const peer_out = theirs_at[1];

  // Both processes start each round together, and neither leaves while the other reads from it.
  const auto meet = [&] {
    char token = 0;
    if (is_child) return ::write(to_peer, &token, 1) == 1 && ::read(from_peer, &token, 1) == 1;
    return ::read(from_peer, &token, 1) == 1 && ::write(to_peer, &token, 1) == 1;
  };
  std::vector<double> milliseconds;
  for (int round = 0; round < rounds + 1; ++round) {
    if (!meet()) return 1;
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t at = mine; at < mine + half; at += chunk) {
      if (!read_remote(peer, reinterpret_cast<std::byte*>(slot.data()), peer_in + at, chunk))
        return 1;
      coltrain::comm::reduce_into(reinterpret_cast<float*>(out + at),
                                  reinterpret_cast<const float*>(in + at), slot.data(),
                                  chunk / sizeof(float), coltrain::comm::ReduceOp::kSum);
    }
    for (std::size_t at = theirs; at < theirs + half; at += chunk)
      if (!read_remote(peer, out + at, peer_out + at, chunk)) return 1;
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    if (round > 0) milliseconds.push_back(took.count());  // the first faults the pages in
  }
  if (!meet()) return 1;
  if (is_child) return 0;
  int status = 0;
  ::waitpid(child, &status, 0);
  std::nth_element(milliseconds.begin(), milliseconds.begin() + milliseconds.size() / 2,
                   milliseconds.end());
  const double median = milliseconds[milliseconds.size() / 2];
  std::printf("%zu bytes, %zu-byte copies: median %.2f ms per rank, %.2f GB/s bus bandwidth\n",
              bytes, chunk, median, static_cast<double>(bytes) / (median * 1e6));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
