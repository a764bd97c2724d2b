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

TEST_CASE("AnyTransport passes messages, requests and ranks through", "[any_transport]") {
  const int p = 3;
  run_ranks(p, [&](InProcessTransport& transport) {
    AnyTransport t(transport);
    REQUIRE(t.rank() == transport.rank());
    REQUIRE(t.size() == p);
    const int right = (t.rank() + 1) % p;
    const int left = (t.rank() + p - 1) % p;
    // Two messages each way in flight at once, waited on in the opposite order to their posting:
    // each request must still name its own message.
    const std::vector<std::byte> first = pattern(t.rank(), 5);
    const std::vector<std::byte> second = pattern(t.rank() + 10, 9);
    std::vector<std::byte> in_first(5), in_second(9);
    const AnyTransport::Request r1 = t.irecv(left, message_of(5, 1), in_first);
    const AnyTransport::Request r2 = t.irecv(left, message_of(9, 2), in_second);
    const AnyTransport::Request s1 = t.isend(right, message_of(5, 1), first);
    const AnyTransport::Request s2 = t.isend(right, message_of(9, 2), second);
    t.wait(r2);
    t.wait(r1);
    t.wait(s2);
    t.wait(s1);
    t.wait(AnyTransport::Request{});  // the transport's default request: complete, returns at once
    CHECK(in_first == pattern(left, 5));
    CHECK(in_second == pattern(left + 10, 9));
  });
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
        if (through_any) {
          AnyTransport t(transport);
          ring_allreduce(t, input, output, count, sum, call, tuning);
        } else {
          ring_allreduce(transport, input, output, count, sum, call, tuning);
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
  std::vector<std::vector<std::byte>> received(4);
  const auto outcome = run_in_process(4, [&](InProcessTransport& transport) {
    const AnyTransport whole(transport);
    if (transport.rank() == 0 || transport.rank() == 2) {
      CHECK_THROWS_WITH(whole.subgroup(members),
                        Contains("rank " + std::to_string(transport.rank())) &&
                            Contains("not among the subgroup's members"));
      return;
    }
    AnyTransport group = whole.subgroup(members);
    CHECK(group.size() == 2);
    CHECK(group.rank() == (transport.rank() == 3 ? 0 : 1));
    CHECK_THROWS_WITH(group.subgroup(members), Contains("a subgroup of a subgroup"));
    const std::vector<std::byte> mine = pattern(transport.rank(), 4);
    std::vector<std::byte>& in = received[static_cast<std::size_t>(transport.rank())];
    in.assign(4, std::byte{0});
    const int other = 1 - group.rank();  // the subgroup's other rank
    AnyTransport::Request r = group.irecv(other, message_of(4, 0), in);
    AnyTransport::Request s = group.isend(other, message_of(4, 0), mine);
    group.wait(s);
    group.wait(r);
  });
  for (const auto& error : outcome.errors) CHECK_FALSE(error);
  CHECK(outcome.undelivered == 0);
  CHECK(received[3] == pattern(1, 4));  // world rank 1's message reached world rank 3
  CHECK(received[1] == pattern(3, 4));
}
