// AnyTransport (comm/transport/any_transport.hpp) over the in-process transport: messages and
// requests pass through unchanged, a default request is the transport's own default, a subgroup
// maps its ranks onto the whole transport's, and misuse is refused by name. The algorithms over it
// are tested by every Communicator test (the host algorithms run over nothing else) and by the
// hierarchical allreduce alone (test_allreduce_variants_alone.cpp).
#include <catch2/catch.hpp>

#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/algorithms/ring.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/transport/any_transport.hpp>

#include "../support/in_process_transport.hpp"
#include "algorithms_alone.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using Catch::Matchers::Contains;
using coltrain::testing::InProcessTransport;
using coltrain::testing::run_in_process;
using coltrain::testing::run_ranks;
using coltrain::testing::small_chunks;

namespace {

MessageHeader message_of(std::size_t bytes, std::uint64_t sequence) {
  MessageHeader header;
  header.collective = Collective::kSendRecv;
  header.algorithm = Algorithm::kNative;
  header.dtype = DataType::kUInt8;
  header.count = bytes;
  header.bytes = bytes;
  header.sequence = sequence;
  return header;
}

std::vector<std::byte> pattern(int rank, std::size_t bytes) {
  std::vector<std::byte> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i)
    data[i] = std::byte(static_cast<unsigned>(rank * 31 + i * 7));
  return data;
}

}  // namespace

// Catch's assertions are not thread-safe: the ranks' threads record what they saw, and the test's
// thread checks it.
TEST_CASE("AnyTransport passes messages, requests and ranks through", "[any_transport]") {
  const int p = 3;
  struct Seen {
    int rank = -1, size = -1;
    std::vector<std::byte> first, second;
  };
  std::vector<Seen> seen(p);
  run_ranks(p, [&](InProcessTransport& transport) {
    AnyTransport t(transport);
    Seen& mine = seen[static_cast<std::size_t>(transport.rank())];
    mine.rank = t.rank();
    mine.size = t.size();
    const int right = (t.rank() + 1) % p;
    const int left = (t.rank() + p - 1) % p;
    // Two messages each way in flight at once, waited on in the opposite order to their posting:
    // each request must still name its own message.
    const std::vector<std::byte> first = pattern(t.rank(), 5);
    const std::vector<std::byte> second = pattern(t.rank() + 10, 9);
    mine.first.assign(5, std::byte{0});
    mine.second.assign(9, std::byte{0});
    const AnyTransport::Request r1 = t.irecv(left, message_of(5, 1), mine.first);
    const AnyTransport::Request r2 = t.irecv(left, message_of(9, 2), mine.second);
    const AnyTransport::Request s1 = t.isend(right, message_of(5, 1), first);
    const AnyTransport::Request s2 = t.isend(right, message_of(9, 2), second);
    t.wait(r2);
    t.wait(r1);
    t.wait(s2);
    t.wait(s1);
    t.wait(AnyTransport::Request{});  // the transport's default request: complete, returns at once
  });
  for (int r = 0; r < p; ++r) {
    INFO("rank " << r);
    const Seen& mine = seen[static_cast<std::size_t>(r)];
    const int left = (r + p - 1) % p;
    CHECK(mine.rank == r);
    CHECK(mine.size == p);
    CHECK(mine.first == pattern(left, 5));
    CHECK(mine.second == pattern(left + 10, 9));
  }
}

TEST_CASE("AnyTransport's ring allreduce matches the transport's own", "[any_transport]") {
  const std::size_t count = 4099;
  const AlgorithmTuning tuning = small_chunks();
  for (const int p : {2, 3, 5}) {
    std::vector<std::vector<std::int64_t>> direct(p), erased(p);
    auto run = [&](bool through_any) {
      run_ranks(p, [&](InProcessTransport& transport) {
        std::vector<std::int64_t> in(count);
        for (std::size_t i = 0; i < count; ++i)
          in[i] = (transport.rank() + 1) * 1000003 - static_cast<std::int64_t>(i) * 7919;
        auto& out = (through_any ? erased : direct)[static_cast<std::size_t>(transport.rank())];
        out.assign(count, -1);
        MessageHeader call = message_of(0, 3);
        call.collective = Collective::kAllreduce;
        call.algorithm = Algorithm::kRing;
        call.dtype = DataType::kInt64;
        call.count = count;
        const ElementReduction sum = element_reduction<std::int64_t>(ReduceOp::kSum);
        const auto* input = reinterpret_cast<const std::byte*>(in.data());
        auto* output = reinterpret_cast<std::byte*>(out.data());
        AlgorithmScratch scratch;
        if (through_any) {
          AnyTransport t(transport);
          ring_allreduce(t, input, output, count, sum, call, tuning, scratch);
        } else {
          ring_allreduce(transport, input, output, count, sum, call, tuning, scratch);
        }
      });
    };
    run(false);
    run(true);
    INFO("p = " << p);
    CHECK(erased == direct);
    for (std::size_t i = 0; i < count; ++i) {
      std::int64_t expected = 0;
      for (int r = 0; r < p; ++r)
        expected += (r + 1) * 1000003 - static_cast<std::int64_t>(i) * 7919;
      REQUIRE(erased[0][i] == expected);
    }
  }
}

TEST_CASE("An AnyTransport subgroup maps its ranks onto the whole", "[any_transport]") {
  // World ranks 3 and 1 form a subgroup, in that order: 3 is its rank 0, 1 its rank 1.
  const std::vector<int> members = {3, 1};
  struct Seen {
    int rank = -1, size = -1;
    std::string refused;  // what subgroup() said, where it refused
    std::vector<std::byte> received;
  };
  std::vector<Seen> seen(4);
  auto message_of_refusal = [&](auto&& call) {
    try {
      call();
    } catch (const InvalidArgument& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  const auto outcome = run_in_process(4, [&](InProcessTransport& transport) {
    Seen& mine = seen[static_cast<std::size_t>(transport.rank())];
    const AnyTransport whole(transport);
    if (transport.rank() == 0 || transport.rank() == 2) {
      mine.refused = message_of_refusal([&] { whole.subgroup(members); });
      return;
    }
    AnyTransport group = whole.subgroup(members);
    mine.rank = group.rank();
    mine.size = group.size();
    mine.refused = message_of_refusal([&] { group.subgroup(members); });
    const std::vector<std::byte> sent = pattern(transport.rank(), 4);
    mine.received.assign(4, std::byte{0});
    const int other = 1 - group.rank();  // the subgroup's other rank
    AnyTransport::Request r = group.irecv(other, message_of(4, 0), mine.received);
    AnyTransport::Request s = group.isend(other, message_of(4, 0), sent);
    group.wait(s);
    group.wait(r);
  });
  for (const auto& error : outcome.errors) CHECK_FALSE(error);
  CHECK(outcome.undelivered == 0);
  for (const int outside : {0, 2}) {
    CHECK_THAT(seen[static_cast<std::size_t>(outside)].refused,
               Contains("rank " + std::to_string(outside)) &&
                   Contains("not among the subgroup's members"));
  }
  CHECK(seen[3].rank == 0);
  CHECK(seen[1].rank == 1);
  CHECK(seen[3].size == 2);
  CHECK_THAT(seen[1].refused, Contains("a subgroup of a subgroup"));
  CHECK(seen[3].received == pattern(1, 4));  // world rank 1's message reached world rank 3
  CHECK(seen[1].received == pattern(3, 4));
}
