// Communicator::send/recv and isend/irecv on both backends at every world size the suite runs
// with: exact data for every dtype and count, matching by tag, messages interleaved with blocking
// and non-blocking collectives without meeting them, receives posted before their sends, test(),
// and the errors: a count that differs, a rank or tag that is not one, a rank sending to itself.
#include <catch2/catch.hpp>

#include "collective_fixtures.hpp"

#include <coltrain/comm.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using Catch::Contains;
using coltrain::testing::same_bits;
using coltrain::testing::shared_communicator;
using coltrain::testing::to_element;
using coltrain::testing::world_rank;
using coltrain::testing::world_size;

namespace {

constexpr Backend kBackends[] = {Backend::kMpi, Backend::kTcp};

// What rank `from` sends with `tag`: distinct per sender, tag and index, exact in every dtype.
template <class T>
std::vector<T> message(int from, int tag, std::size_t count) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i)
    values[i] = to_element<T>(static_cast<double>((from * 37 + tag * 11 + i) % 200));
  return values;
}

template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i])) return false;
  return true;
}

// A communicator of its own over every rank, for cases that leave theirs broken.
Communicator own_communicator(Backend backend) {
  Communicator& world = shared_communicator(backend);
  std::optional<Communicator> copy = world.split(0, world.rank());
  REQUIRE(copy.has_value());
  return std::move(*copy);
}

}  // namespace

TEMPLATE_TEST_CASE("isend/irecv around a ring move every dtype exactly, counts 0 to 1 MB", "[p2p]",
                   float, double, std::int32_t, std::int64_t, coltrain::half, coltrain::bfloat16) {
  if (world_size() < 2) return;  // nothing to send to: the argument case covers one rank
  for (const Backend backend : kBackends) {
    Communicator& comm = shared_communicator(backend);
    const int rank = comm.rank();
    const int p = comm.size();
    const int right = (rank + 1) % p;
    const int left = (rank + p - 1) % p;
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000},
                                    (std::size_t{1} << 20) / sizeof(TestType) + 3}) {
      CAPTURE(name_of(backend), p, count);
      const std::vector<TestType> outgoing = message<TestType>(rank, 0, count);
      std::vector<TestType> incoming(count, to_element<TestType>(-1.0));
      Request received = comm.irecv(std::span(incoming), left);
      Request sent = comm.isend(std::span<const TestType>(outgoing), right);
      const Request both[] = {received, sent};
      wait_all(both);
      CHECK(same(incoming, message<TestType>(left, 0, count)));
    }
  }
}

TEST_CASE("messages are matched by tag, and in order within a tag", "[p2p]") {
  if (world_size() < 2) return;
  for (const Backend backend : kBackends) {
    CAPTURE(name_of(backend));
    Communicator& comm = shared_communicator(backend);
    const int rank = comm.rank();
    if (rank == 0) {
      // Tags 1, 2, then 1 again; rank 1 asks for tag 2 first.
      const std::vector<double> a = message<double>(0, 1, 5000);
      const std::vector<double> b = message<double>(0, 2, 3);
      const std::vector<double> c = message<double>(0, 1, 7);
      Request requests[] = {comm.isend(std::span<const double>(a), 1, 1),
                            comm.isend(std::span<const double>(b), 1, 2),
                            comm.isend(std::span<const double>(c), 1, 1)};
      wait_all(requests);
    } else if (rank == 1) {
      std::vector<double> b(3);
      comm.recv(std::span(b), 0, 2);
      CHECK(same(b, message<double>(0, 2, 3)));
      std::vector<double> a(5000);
      std::vector<double> c(7);
      comm.recv(std::span(a), 0, 1);
      comm.recv(std::span(c), 0, 1);
      CHECK(same(a, message<double>(0, 1, 5000)));
      CHECK(same(c, message<double>(0, 1, 7)));
    }
    comm.barrier();
  }
}

TEST_CASE("messages and collectives interleave without meeting each other's receives", "[p2p]") {
  if (world_size() < 2) return;
  for (const Backend backend : kBackends) {
    CAPTURE(name_of(backend), world_size());
    Communicator& comm = shared_communicator(backend);
    const int rank = comm.rank();
    const int p = comm.size();
    const int right = (rank + 1) % p;
    const int left = (rank + p - 1) % p;
    // Each rank sends before the allreduce and receives after it: the message is in the stream
    // ahead of the allreduce's data, and must be set aside for it.
    const std::vector<float> outgoing = message<float>(rank, 3, 300000);
    Request sent = comm.isend(std::span<const float>(outgoing), right, 3);
    std::vector<std::int64_t> value{rank};
    comm.allreduce(std::span(value));
    CHECK(value[0] == static_cast<std::int64_t>(p) * (p - 1) / 2);
    std::vector<float> incoming(300000);
    comm.recv(std::span(incoming), left, 3);
    sent.wait();
    CHECK(same(incoming, message<float>(left, 3, 300000)));

    // A receive posted first, then non-blocking collectives, then the send.
    std::vector<int> small(10, -1);
    Request receive = comm.irecv(std::span(small), left, 4);
    std::vector<double> sum(1000, 1.0);
    Request reduction = comm.iallreduce(std::span(sum));
    Request barrier = comm.ibarrier();
    const std::vector<int> payload = message<int>(rank, 4, 10);
    comm.send(std::span<const int>(payload), right, 4);
    const Request all[] = {receive, reduction, barrier};
    wait_all(all);
    CHECK(same(small, message<int>(left, 4, 10)));
    CHECK(sum == std::vector<double>(1000, p));
  }
}

TEST_CASE("every pair exchanges at once: receives posted first, then sends, then wait_all",
          "[p2p]") {
  if (world_size() < 2) return;
  for (const Backend backend : kBackends) {
    CAPTURE(name_of(backend), world_size());
    Communicator& comm = shared_communicator(backend);
    const int rank = comm.rank();
    const int p = comm.size();
    const std::size_t count = 200000;
    std::vector<std::vector<std::int32_t>> incoming(static_cast<std::size_t>(p));
    std::vector<std::vector<std::int32_t>> outgoing(static_cast<std::size_t>(p));
    std::vector<Request> requests;
    for (int peer = 0; peer < p; ++peer) {
      if (peer == rank) continue;
      incoming[static_cast<std::size_t>(peer)].assign(count, -1);
      requests.push_back(comm.irecv(std::span(incoming[static_cast<std::size_t>(peer)]), peer, 9));
    }
    for (int peer = 0; peer < p; ++peer) {
      if (peer == rank) continue;
      outgoing[static_cast<std::size_t>(peer)] = message<std::int32_t>(rank, peer, count);
      requests.push_back(comm.isend(
          std::span<const std::int32_t>(outgoing[static_cast<std::size_t>(peer)]), peer, 9));
    }
    wait_all(requests);
    for (int peer = 0; peer < p; ++peer) {
      if (peer == rank) continue;
      CHECK(
          same(incoming[static_cast<std::size_t>(peer)], message<std::int32_t>(peer, rank, count)));
    }
  }
}

TEST_CASE("test() reports a receive complete once its message has come", "[p2p]") {
  if (world_size() < 2) return;
  for (const Backend backend : kBackends) {
    CAPTURE(name_of(backend));
    Communicator& comm = shared_communicator(backend);
    const int rank = comm.rank();
    if (rank == 1) {
      std::vector<double> data(64);
      Request receive = comm.irecv(std::span(data), 0, 5);
      CHECK_FALSE(receive.test());  // rank 0 sends only after the barrier
      comm.barrier();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      bool done = false;
      while (!done && std::chrono::steady_clock::now() < deadline) {
        done = receive.test();
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      CHECK(done);
      CHECK(same(data, message<double>(0, 5, 64)));
    } else {
      comm.barrier();
      if (rank == 0) {
        const std::vector<double> data = message<double>(0, 5, 64);
        comm.send(std::span<const double>(data), 1, 5);
      }
    }
    comm.barrier();
  }
}

TEST_CASE("send/recv refuse a peer that is not one, this rank itself and a tag out of range",
          "[p2p]") {
  for (const Backend backend : kBackends) {
    CAPTURE(name_of(backend));
    Communicator& comm = shared_communicator(backend);
    std::vector<float> data(4);
    const std::span<const float> view(data);
    CHECK_THROWS_WITH(comm.send(view, comm.rank()), Contains("is this rank"));
    CHECK_THROWS_WITH(comm.send(view, comm.size()), Contains("is not a rank of this"));
    CHECK_THROWS_WITH(comm.recv(std::span(data), -1), Contains("is not a rank of this"));
    if (comm.size() > 1) {
      const int peer = (comm.rank() + 1) % comm.size();
      CHECK_THROWS_WITH(comm.send(view, peer, -1), Contains("tag -1 is outside 0..16000"));
      CHECK_THROWS_WITH(comm.isend(view, peer, Communicator::kMaxTag + 1),
                        Contains("is outside 0..16000"));
    }
    comm.barrier();  // still usable
  }
}

TEST_CASE("a receive whose count differs from the send's fails with MismatchError naming both",
          "[p2p][errors]") {
  if (world_size() < 2) return;
  for (const Backend backend : kBackends) {
    CAPTURE(name_of(backend));
    Communicator comm = own_communicator(backend);
    if (comm.rank() == 0) {
      const std::vector<float> data(10, 1.0f);
      comm.send(std::span<const float>(data), 1, 2);
    } else if (comm.rank() == 1) {
      std::vector<float> data(12);
      CHECK_THROWS_WITH(comm.recv(std::span(data), 0, 2),
                        Contains("count differs between ranks: rank 1 has 12, rank 0 has 10") &&
                            Contains("send_recv #0 (tag 2, f32, count 12)"));
    }
    // The communicator is left as it is: rank 1's is broken, and no further call is made on it.
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
