// Communicator::split and the non-blocking calls, on both backends at every world size the suite
// runs with: exact results on the new communicators interleaved with the parent's calls, a parent
// and its split driven from two threads at once, and many outstanding requests completing in
// issue order, mixed with blocking calls.
#include <catch2/catch.hpp>

#include "collective_fixtures.hpp"

#include <coltrain/comm.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using coltrain::testing::shared_communicator;
using coltrain::testing::world_rank;
using coltrain::testing::world_size;

namespace {

// The sum of `ranks`' world ranks plus `salt` each, as an allreduce over them gives it.
std::int64_t sum_over(const std::vector<int>& ranks, std::int64_t salt) {
  std::int64_t sum = 0;
  for (int rank : ranks) sum += rank + salt;
  return sum;
}

std::vector<int> ranks_where(bool (*member)(int rank, int size)) {
  std::vector<int> ranks;
  for (int r = 0; r < world_size(); ++r)
    if (member(r, world_size())) ranks.push_back(r);
  return ranks;
}

// Each new rank's world rank, in new-rank order, as an allgather on `group` reports them.
std::vector<int> world_ranks_of(Communicator& group) {
  std::vector<int> gathered(static_cast<std::size_t>(group.size()));
  const int mine = world_rank();
  group.allgather(std::span<const int>(&mine, 1), std::span(gathered));
  return gathered;
}

}  // namespace

TEST_CASE("split by parity gives communicators that work interleaved with the parent's calls",
          "[split]") {
  const Backend backend = GENERATE(Backend::kMpi, Backend::kTcp);
  CAPTURE(name_of(backend), world_size());
  Communicator& world = shared_communicator(backend);
  const int rank = world.rank();
  std::optional<Communicator> half = world.split(rank % 2, rank);
  REQUIRE(half.has_value());
  const std::vector<int> expected_members =
      ranks_where(+[](int r, int) { return r % 2 == world_rank() % 2; });
  CHECK(half->size() == static_cast<int>(expected_members.size()));
  CHECK(half->rank() == rank / 2);
  CHECK(half->backend() == backend);
  CHECK(world_ranks_of(*half) == expected_members);

  std::vector<int> all(static_cast<std::size_t>(world.size()));
  std::iota(all.begin(), all.end(), 0);
  for (std::int64_t round = 0; round < 3; ++round) {
    std::int64_t on_world = rank + round;
    world.allreduce(std::span(&on_world, 1));
    std::int64_t on_half = rank + round;
    half->allreduce(std::span(&on_half, 1));
    std::vector<double> broadcast(100, rank);
    world.broadcast(std::span(broadcast), world.size() - 1);
    CHECK(on_world == sum_over(all, round));
    CHECK(on_half == sum_over(expected_members, round));
    CHECK(broadcast == std::vector<double>(100, world.size() - 1));
  }
}

TEST_CASE("split orders the new ranks by key, then by the old rank", "[split]") {
  const Backend backend = GENERATE(Backend::kMpi, Backend::kTcp);
  CAPTURE(name_of(backend), world_size());
  Communicator& world = shared_communicator(backend);
  const int rank = world.rank();

  std::optional<Communicator> reversed = world.split(0, -rank);
  REQUIRE(reversed.has_value());
  CHECK(reversed->rank() == world.size() - 1 - rank);
  std::vector<int> backwards(static_cast<std::size_t>(world.size()));
  std::iota(backwards.rbegin(), backwards.rend(), 0);
  CHECK(world_ranks_of(*reversed) == backwards);

  std::optional<Communicator> tied = world.split(7, 1);  // equal keys: the old order
  REQUIRE(tied.has_value());
  CHECK(tied->rank() == rank);

  std::optional<Communicator> alone = world.split(rank, 0);
  REQUIRE(alone.has_value());
  CHECK(alone->size() == 1);
  std::vector<float> data{1.5F, -2.0F};
  alone->allreduce(std::span(data));
  CHECK(data == std::vector<float>{1.5F, -2.0F});
}

TEST_CASE("a negative color gives no communicator, and the others go on without that rank",
          "[split]") {
  const Backend backend = GENERATE(Backend::kMpi, Backend::kTcp);
  CAPTURE(name_of(backend), world_size());
  Communicator& world = shared_communicator(backend);
  const int rank = world.rank();
  std::optional<Communicator> rest = world.split(rank == 0 ? -1 : 3, rank);
  CHECK(rest.has_value() == (rank != 0));
  if (rest) {
    CHECK(rest->size() == world.size() - 1);
    std::int32_t value = rank;
    rest->allreduce(std::span(&value, 1), ReduceOp::kMin);
    CHECK(value == 1);
  }
  world.barrier();
}

TEST_CASE("a parent and its split, each driven from its own thread, never mix their messages",
          "[split]") {
  const Backend backend = GENERATE(Backend::kMpi, Backend::kTcp);
  CAPTURE(name_of(backend), world_size());
  Communicator& world = shared_communicator(backend);
  std::optional<Communicator> copy = world.split(0, world.rank());
  REQUIRE(copy.has_value());
  constexpr int kRounds = 20;
  constexpr std::size_t kCount = 20000;
  std::vector<int> world_errors;
  std::vector<int> copy_errors;
  // The same calls on both, with different data: a message that strayed to the other
  // communicator would either fail its header check or land as a wrong sum.
  const auto drive = [](Communicator& comm, std::int32_t salt, std::vector<int>& errors) {
    for (int round = 0; round < kRounds; ++round) {
      std::vector<std::int32_t> data(kCount, comm.rank() + salt + round);
      comm.allreduce(std::span(data));
      std::int32_t expected = 0;
      for (int r = 0; r < comm.size(); ++r) expected += r + salt + round;
      if (std::any_of(data.begin(), data.end(), [&](std::int32_t v) { return v != expected; }))
        errors.push_back(round);
    }
  };
  std::thread other([&] { drive(*copy, 1000, copy_errors); });
  drive(world, 0, world_errors);
  other.join();
  CHECK(world_errors.empty());
  CHECK(copy_errors.empty());
}

TEST_CASE("many outstanding requests give exact results and complete in issue order",
          "[requests]") {
  const Backend backend = GENERATE(Backend::kMpi, Backend::kTcp);
  CAPTURE(name_of(backend), world_size());
  Communicator& comm = shared_communicator(backend);
  const int rank = comm.rank();
  const int size = comm.size();
  constexpr int kRequests = 24;
  constexpr std::size_t kCount = 5000;
  std::vector<std::vector<std::int64_t>> data;
  std::vector<Request> requests;
  for (int i = 0; i < kRequests; ++i) data.emplace_back(kCount, rank * 100 + i);
  for (int i = 0; i < kRequests; ++i) requests.push_back(comm.iallreduce(std::span(data[i])));
  // Completion in issue order: whenever a request is complete, every earlier one is too.
  for (int i = kRequests - 1; i >= 0; --i) {
    requests[static_cast<std::size_t>(i)].wait();
    for (int earlier = 0; earlier < i; ++earlier)
      CHECK(requests[static_cast<std::size_t>(earlier)].test());
  }
  std::int64_t ranks_sum = 0;
  for (int r = 0; r < size; ++r) ranks_sum += r * 100;
  for (int i = 0; i < kRequests; ++i) {
    CHECK(data[static_cast<std::size_t>(i)] ==
          std::vector<std::int64_t>(kCount, ranks_sum + static_cast<std::int64_t>(i) * size));
  }
  CHECK(Request().test());  // a default request is complete
}

TEST_CASE("every non-blocking call gives its blocking call's result, mixed with blocking calls",
          "[requests]") {
  const Backend backend = GENERATE(Backend::kMpi, Backend::kTcp);
  CAPTURE(name_of(backend), world_size());
  Communicator& comm = shared_communicator(backend);
  const int rank = comm.rank();
  const int size = comm.size();
  const auto p = static_cast<std::size_t>(size);
  const int root = size - 1;
  constexpr std::size_t kCount = 7;

  std::vector<float> summed(kCount, static_cast<float>(rank));
  std::vector<double> broadcast(kCount, rank);
  const std::vector<std::int64_t> mine(kCount, static_cast<std::int64_t>(rank));
  std::vector<std::int64_t> gathered(kCount * p);
  std::vector<std::int32_t> blocks(kCount * p);
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = rank * 1000 + static_cast<int>(i);
  std::vector<std::int32_t> scattered(kCount);
  std::vector<std::int32_t> exchanged(kCount * p);
  std::vector<std::int32_t> reduced(kCount * p);
  std::vector<std::int32_t> at_root(rank == root ? kCount * p : 0);
  std::vector<std::int64_t> gathered_at_root(rank == root ? kCount * p : 0);
  std::vector<std::size_t> counts(p);
  for (std::size_t r = 0; r < p; ++r) counts[r] = r % 3;  // 0, 1, 2, 0, 1
  const std::vector<std::int64_t> variable(counts[static_cast<std::size_t>(rank)],
                                           static_cast<std::int64_t>(rank + 1));
  std::vector<std::int64_t> gathered_variable(std::accumulate(counts.begin(), counts.end(), 0UL));
  std::vector<std::size_t> ones(p, 1);
  std::vector<std::size_t> offsets(p);
  std::iota(offsets.begin(), offsets.end(), 0);
  const std::vector<std::int32_t> to_each(p, rank);
  std::vector<std::int32_t> from_each(p);

  std::vector<Request> requests;
  requests.push_back(comm.iallreduce(std::span(summed)));
  requests.push_back(comm.ibroadcast(std::span(broadcast), root));
  std::int64_t blocking = rank;  // a blocking call between requests waits for them first
  comm.allreduce(std::span(&blocking, 1), ReduceOp::kMax);
  CHECK(requests[0].test());
  CHECK(requests[1].test());
  requests.push_back(comm.iallgather(std::span(mine), std::span(gathered)));
  requests.push_back(
      comm.ireduce_scatter(std::span<const std::int32_t>(blocks), std::span(scattered)));
  requests.push_back(comm.ialltoall(std::span<const std::int32_t>(blocks), std::span(exchanged)));
  requests.push_back(comm.ireduce(std::span<const std::int32_t>(blocks), std::span(at_root), root));
  requests.push_back(comm.igather(std::span(mine), std::span(gathered_at_root), root));
  requests.push_back(comm.iallgatherv(std::span(variable), std::span(gathered_variable),
                                      std::span<const std::size_t>(counts)));
  requests.push_back(comm.ialltoallv(std::span(to_each), std::span<const std::size_t>(ones),
                                     std::span<const std::size_t>(offsets), std::span(from_each),
                                     std::span<const std::size_t>(ones),
                                     std::span<const std::size_t>(offsets)));
  requests.push_back(comm.ibarrier());
  std::vector<std::int32_t> scatter_out(kCount);
  const std::span<const std::int32_t> scatter_in =
      rank == root ? std::span<const std::int32_t>(blocks) : std::span<const std::int32_t>();
  requests.push_back(comm.iscatter(scatter_in, std::span(scatter_out), root));
  wait_all(requests);

  CHECK(blocking == size - 1);
  CHECK(summed == std::vector<float>(kCount, static_cast<float>(size * (size - 1) / 2)));
  CHECK(broadcast == std::vector<double>(kCount, root));
  for (std::size_t i = 0; i < gathered.size(); ++i)
    CHECK(gathered[i] == static_cast<std::int64_t>(i / kCount));
  std::int32_t rank_thousands = 0;
  for (int r = 0; r < size; ++r) rank_thousands += r * 1000;
  for (std::size_t i = 0; i < kCount; ++i) {
    const auto index = static_cast<std::int32_t>(static_cast<std::size_t>(rank) * kCount + i);
    CHECK(scattered[i] == rank_thousands + size * index);
    CHECK(scatter_out[i] == root * 1000 + index);
  }
  for (std::size_t i = 0; i < exchanged.size(); ++i) {
    const auto from = static_cast<std::int32_t>(i / kCount);
    CHECK(exchanged[i] == from * 1000 + rank * static_cast<std::int32_t>(kCount) +
                              static_cast<std::int32_t>(i % kCount));
  }
  if (rank == root) {
    for (std::size_t i = 0; i < at_root.size(); ++i)
      CHECK(at_root[i] == rank_thousands + size * static_cast<std::int32_t>(i));
    CHECK(gathered_at_root == gathered);
  }
  std::size_t at = 0;
  for (std::size_t r = 0; r < p; ++r)
    for (std::size_t k = 0; k < counts[r]; ++k)
      CHECK(gathered_variable[at++] == static_cast<std::int64_t>(r + 1));
  for (std::size_t r = 0; r < p; ++r) CHECK(from_each[r] == static_cast<std::int32_t>(r));
}

TEST_CASE("requests of a split and of its parent progress independently", "[requests][split]") {
  const Backend backend = GENERATE(Backend::kMpi, Backend::kTcp);
  CAPTURE(name_of(backend), world_size());
  Communicator& world = shared_communicator(backend);
  std::optional<Communicator> half = world.split(world.rank() % 2, 0);
  REQUIRE(half.has_value());
  std::vector<std::int32_t> a(1000, 1);
  std::vector<std::int32_t> b(1000, 2);
  Request on_world = world.iallreduce(std::span(a));
  Request on_half = half->iallreduce(std::span(b));
  on_half.wait();
  on_world.wait();
  CHECK(a == std::vector<std::int32_t>(1000, world.size()));
  CHECK(b == std::vector<std::int32_t>(1000, 2 * half->size()));
}
