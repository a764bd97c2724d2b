// A tour of coltrain's collective API, one call after another, each result checked: the blocking
// collectives, the variable-count ones, split into groups, the non-blocking calls with their
// requests, and point-to-point messages. docs/collectives.md describes every call.
//
//   mpiexec -n 4 build/samples/collectives_tour            # MPI, then TCP
//   COLTRAIN_BACKEND=tcp scripts/launch_local 3 build/samples/collectives_tour
#include <coltrain/coltrain.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace {

using coltrain::comm::Backend;
using coltrain::comm::Communicator;
using coltrain::comm::ReduceOp;
using coltrain::comm::Request;

// Counts the calls whose result was wrong on any rank, and prints one line per call on rank 0.
class Checker {
 public:
  Checker(Communicator& comm, const coltrain::Logger& logger) : comm_(comm), logger_(logger) {}

  void check(const std::string& call, bool right) {
    std::int32_t wrong_ranks = right ? 0 : 1;
    comm_.allreduce(std::span(&wrong_ranks, 1));
    if (wrong_ranks != 0) ++failures_;
    logger_.print_root("  ", wrong_ranks == 0 ? "ok    " : "WRONG ", call,
                       wrong_ranks == 0 ? "" : " (" + std::to_string(wrong_ranks) + " ranks)");
  }
  int failures() const { return failures_; }

 private:
  Communicator& comm_;
  const coltrain::Logger& logger_;
  int failures_ = 0;
};

int tour(Communicator& comm, const coltrain::Logger& logger) {
  Checker checker(comm, logger);
  const int rank = comm.rank();
  const int size = comm.size();
  const auto p = static_cast<std::size_t>(size);
  const int root = size - 1;
  const int rank_sum = size * (size - 1) / 2;
  logger.print_root("backend ", name_of(comm.backend()), ", ", size, " ranks");

  // allreduce: every rank gets the sum.
  std::vector<double> values(4, rank);
  comm.allreduce(std::span(values));
  checker.check("allreduce", values == std::vector<double>(4, rank_sum));

  // broadcast: the root's data everywhere.
  std::vector<float> weights(3, static_cast<float>(rank));
  comm.broadcast(std::span(weights), root);
  checker.check("broadcast", weights == std::vector<float>(3, static_cast<float>(root)));

  // allgather: every rank's block, in rank order.
  const std::int32_t mine = rank * 10;
  std::vector<std::int32_t> everyone(p);
  comm.allgather(std::span(&mine, 1), std::span(everyone));
  bool right = true;
  for (std::size_t r = 0; r < p; ++r) right &= everyone[r] == static_cast<std::int32_t>(r * 10);
  checker.check("allgather", right);

  // reduce_scatter: rank r gets block r of the sum.
  std::vector<std::int64_t> blocks(2 * p, 1);
  std::vector<std::int64_t> my_block(2);
  comm.reduce_scatter(std::span<const std::int64_t>(blocks), std::span(my_block));
  checker.check("reduce_scatter", my_block == std::vector<std::int64_t>(2, size));

  // reduce: the maximum, on the root only.
  std::vector<std::int32_t> at_root(1);
  const std::int32_t contribution = rank;
  comm.reduce(std::span(&contribution, 1), std::span(at_root), root, ReduceOp::kMax);
  checker.check("reduce", rank != root || at_root[0] == size - 1);

  // alltoall: block j of my input goes to rank j.
  std::vector<std::int32_t> outgoing(p);
  std::vector<std::int32_t> incoming(p);
  for (std::size_t j = 0; j < p; ++j) outgoing[j] = rank * 100 + static_cast<std::int32_t>(j);
  comm.alltoall(std::span<const std::int32_t>(outgoing), std::span(incoming));
  right = true;
  for (std::size_t j = 0; j < p; ++j)
    right &= incoming[j] == static_cast<std::int32_t>(j) * 100 + rank;
  checker.check("alltoall", right);

  // gather and scatter, rooted at the last rank.
  std::vector<std::int32_t> gathered(rank == root ? p : 0);
  comm.gather(std::span(&mine, 1), std::span(gathered), root);
  right = true;
  for (std::size_t r = 0; r < gathered.size(); ++r)
    right &= gathered[r] == static_cast<std::int32_t>(r * 10);
  checker.check("gather", right);
  std::vector<std::int32_t> piece(1);
  comm.scatter(std::span<const std::int32_t>(gathered), std::span(piece), root);
  checker.check("scatter", piece[0] == rank * 10);

  // allgatherv: rank r contributes r + 1 elements.
  std::vector<std::size_t> counts(p);
  std::iota(counts.begin(), counts.end(), std::size_t{1});
  const std::vector<float> variable(counts[static_cast<std::size_t>(rank)],
                                    static_cast<float>(rank));
  std::vector<float> all_variable(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  comm.allgatherv(std::span(variable), std::span(all_variable),
                  std::span<const std::size_t>(counts));
  right = true;
  for (std::size_t r = 0, at = 0; r < p; ++r)
    for (std::size_t k = 0; k < counts[r]; ++k)
      right &= all_variable[at++] == static_cast<float>(r);
  checker.check("allgatherv", right);

  // alltoallv: one element to every rank, two to the next one.
  std::vector<std::size_t> send_counts(p, 1);
  std::vector<std::size_t> recv_counts(p, 1);
  send_counts[static_cast<std::size_t>((rank + 1) % size)] += 1;
  recv_counts[static_cast<std::size_t>((rank + size - 1) % size)] += 1;
  std::vector<std::size_t> send_offsets(p), recv_offsets(p);
  std::exclusive_scan(send_counts.begin(), send_counts.end(), send_offsets.begin(), std::size_t{0});
  std::exclusive_scan(recv_counts.begin(), recv_counts.end(), recv_offsets.begin(), std::size_t{0});
  const std::vector<double> to_send(p + 1, rank);
  std::vector<double> received(p + 1);
  comm.alltoallv(std::span(to_send), std::span<const std::size_t>(send_counts),
                 std::span<const std::size_t>(send_offsets), std::span(received),
                 std::span<const std::size_t>(recv_counts),
                 std::span<const std::size_t>(recv_offsets));
  right = true;
  for (std::size_t r = 0; r < p; ++r)
    for (std::size_t k = 0; k < recv_counts[r]; ++k)
      right &= received[recv_offsets[r] + k] == static_cast<double>(r);
  checker.check("alltoallv", right);

  // split: even and odd ranks, each group ordered by rank.
  std::optional<Communicator> half = comm.split(rank % 2, rank);
  std::int32_t group_sum = rank;
  half->allreduce(std::span(&group_sum, 1));
  std::int32_t expected_group_sum = 0;
  for (int r = rank % 2; r < size; r += 2) expected_group_sum += r;
  checker.check("split (by parity), then allreduce on the half",
                half->rank() == rank / 2 && group_sum == expected_group_sum);

  // Non-blocking calls: issue several, compute meanwhile, then wait; they complete in order.
  std::vector<std::vector<float>> buckets(4, std::vector<float>(1 << 16, 1.0f));
  std::vector<Request> requests;
  for (auto& bucket : buckets) requests.push_back(comm.iallreduce(std::span(bucket)));
  double work = 0;  // stands for the computation that overlaps the communication
  for (int i = 1; i < 200000; ++i) work += 1.0 / i;
  coltrain::comm::wait_all(requests);
  right = work > 0;
  for (const auto& bucket : buckets)
    right &= bucket == std::vector<float>(1 << 16, static_cast<float>(size));
  checker.check("iallreduce x4, overlapped with computation, wait_all", right);

  Request barrier = comm.ibarrier();
  barrier.wait();
  checker.check("ibarrier", barrier.test());

  // send/recv: a halo exchange around the ring, receives posted first; a tag tells messages apart.
  if (size > 1) {
    const int right_rank = (rank + 1) % size;
    const int left_rank = (rank + size - 1) % size;
    const std::vector<double> halo(8, rank);
    std::vector<double> from_left(8, -1.0);
    Request receive = comm.irecv(std::span(from_left), left_rank, /*tag=*/1);
    Request send = comm.isend(std::span<const double>(halo), right_rank, /*tag=*/1);
    const Request exchange[] = {receive, send};
    coltrain::comm::wait_all(exchange);
    checker.check("isend/irecv around the ring, wait_all",
                  from_left == std::vector<double>(8, left_rank));

    // Blocking send and recv: the last rank reports a count to rank 0.
    std::vector<std::int64_t> report(1, rank == root ? 42 : 0);
    if (rank == root) comm.send(std::span<const std::int64_t>(report), 0, /*tag=*/2);
    if (rank == 0) comm.recv(std::span(report), root, /*tag=*/2);
    checker.check("send/recv, rank " + std::to_string(root) + " to rank 0",
                  rank != 0 || report[0] == 42);
  }
  return checker.failures();
}

}  // namespace

int main() {
  try {
    const coltrain::LaunchEnv env = coltrain::detect_launch_env();
    const coltrain::Logger logger(env.rank, env.world_size);
    logger.print_root("coltrain ", coltrain::BuildConfig::kVersion,
                      " collectives tour: ", env.world_size, " ranks");
    const bool mpi_launch =
        env.launcher == coltrain::Launcher::kMpich || env.launcher == coltrain::Launcher::kOpenMpi;
    int failures = 0;
    for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
      if (backend == Backend::kMpi && !(coltrain::BuildConfig::kWithMpi && mpi_launch)) continue;
      Communicator comm = Communicator::from_env(backend);
      failures += tour(comm, logger);
    }
    logger.print_root(failures == 0 ? "every call gave the expected result"
                                    : std::to_string(failures) + " calls gave wrong results");
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_tour: %s\n", e.what());
    return 1;
  }
}
