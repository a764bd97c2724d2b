// The host algorithms that move blocks without reducing them, each header alone over an in-process
// transport (tests/support/in_process_transport.hpp), one thread per rank, with no Communicator:
// pairwise and Bruck alltoall and pairwise alltoallv (alltoall.hpp), binomial gather and scatter
// (gather_scatter.hpp), the dissemination barrier (barrier.hpp), and the point-to-point groups of
// peer_transfers.hpp run over a transport. World sizes 1 to 9, every root, empty and uneven blocks;
// every element carries its sender, its receiver and its position, and every message sent must
// have been received. Ranks that disagree on a call fail with MismatchError where the message
// header sees the difference.
#include <catch2/catch.hpp>

#include <coltrain/comm/algorithms/alltoall.hpp>
#include <coltrain/comm/algorithms/barrier.hpp>
#include <coltrain/comm/algorithms/gather_scatter.hpp>
#include <coltrain/comm/algorithms/peer_transfers.hpp>
#include <coltrain/comm/protocol/message_header.hpp>

#include "../support/in_process_transport.hpp"
#include "algorithms_alone.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using coltrain::testing::ending;
using coltrain::testing::InProcessOutcome;
using coltrain::testing::InProcessTransport;
using coltrain::testing::run_in_process;
using coltrain::testing::run_ranks;

namespace {

using Values = std::vector<std::int64_t>;

const std::vector<int> kWorlds = {1, 2, 3, 4, 5, 6, 7, 8, 9};

// block_value is never negative: an element nobody wrote shows as -1.
constexpr std::int64_t kPoison = -1;

// Element i of the block rank `from` sends rank `to`: distinct per sender, receiver and position
// (blocks here hold fewer than 1000 elements), so a block delivered to the wrong rank, from the
// wrong rank or at the wrong place shows.
std::int64_t block_value(int from, int to, std::size_t i) {
  return std::int64_t{from} * 1'000'000 + std::int64_t{to} * 1000 + static_cast<std::int64_t>(i);
}

Values block(int from, int to, std::size_t count) {
  Values values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = block_value(from, to, i);
  return values;
}

MessageHeader call_of(Collective collective, Algorithm algorithm, std::size_t count,
                      std::uint64_t sequence, int root = 0) {
  MessageHeader call;
  call.collective = collective;
  call.algorithm = algorithm;
  call.dtype = DataType::kInt64;
  call.root = root;
  call.sequence = sequence;
  call.count = count;
  return call;
}

std::byte* bytes(Values& v) { return reinterpret_cast<std::byte*>(v.data()); }
const std::byte* bytes(const Values& v) { return reinterpret_cast<const std::byte*>(v.data()); }

constexpr std::size_t kElement = sizeof(std::int64_t);

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The elements rank `from` sends rank `to` in the alltoallv cases: a quarter of the blocks empty,
// the others of 1, 2 or 3 times `scale` elements, different in each direction.
std::size_t uneven_count(int from, int to, int shift, std::size_t scale) {
  return static_cast<std::size_t>((from + 2 * to + shift) % 4) * scale;
}

// Rank r's buffers for an alltoallv of uneven_count blocks, at offsets that are neither in rank
// order nor contiguous: the input holds its blocks in reverse rank order, one element apart; the
// output holds the blocks from ranks r, r+1, ... in that order, two elements apart. `expected` is
// the output a right alltoallv leaves, gaps still poisoned.
struct UnevenBuffers {
  Values input, output, expected;
  std::vector<std::size_t> send_bytes, send_offsets, receive_bytes, receive_offsets;
};

UnevenBuffers uneven_buffers(int r, int p, int shift, std::size_t scale) {
  const auto n = static_cast<std::size_t>(p);
  UnevenBuffers b;
  b.send_bytes.resize(n);
  b.send_offsets.resize(n);
  b.receive_bytes.resize(n);
  b.receive_offsets.resize(n);
  for (int to = p - 1; to >= 0; --to) {
    const auto u = static_cast<std::size_t>(to);
    const std::size_t count = uneven_count(r, to, shift, scale);
    b.send_bytes[u] = count * kElement;
    b.send_offsets[u] = b.input.size() * kElement;
    const Values values = block(r, to, count);
    b.input.insert(b.input.end(), values.begin(), values.end());
    b.input.push_back(kPoison);
  }
  for (int k = 0; k < p; ++k) {
    const int from = (r + k) % p;
    const auto u = static_cast<std::size_t>(from);
    const std::size_t count = uneven_count(from, r, shift, scale);
    b.receive_bytes[u] = count * kElement;
    b.receive_offsets[u] = b.expected.size() * kElement;
    const Values values = block(from, r, count);
    b.expected.insert(b.expected.end(), values.begin(), values.end());
    b.expected.insert(b.expected.end(), {kPoison, kPoison});
  }
  b.output.assign(b.expected.size(), kPoison);
  return b;
}

}  // namespace

TEST_CASE(
    "Algorithms alone: pairwise and Bruck alltoall deliver rank i's block j as rank j's "
    "block i",
    "[algorithms][alone]") {
  // Each rank calls both algorithms on every block size in one run, blocks growing and shrinking,
  // so that Bruck's scratch is reused by calls of other sizes; each call has its own sequence.
  const std::vector<std::size_t> counts = {130, 0, 3, 1, 257};
  for (const int p : kWorlds) {
    const auto n = static_cast<std::size_t>(p);
    // outputs[2 * c + algorithm][rank]
    std::vector<std::vector<Values>> outputs(2 * counts.size(), std::vector<Values>(n));
    run_ranks(p, [&](InProcessTransport& t) {
      const int r = t.rank();
      std::vector<std::byte> scratch;
      for (std::size_t c = 0; c < counts.size(); ++c) {
        const std::size_t count = counts[c];
        Values input;
        for (int to = 0; to < p; ++to) {
          const Values values = block(r, to, count);
          input.insert(input.end(), values.begin(), values.end());
        }
        for (std::size_t a = 0; a < 2; ++a) {
          const Algorithm algorithm = a == 0 ? Algorithm::kPairwise : Algorithm::kBruck;
          const MessageHeader call = call_of(Collective::kAlltoall, algorithm, count, 2 * c + a);
          Values& output = outputs[2 * c + a][static_cast<std::size_t>(r)];
          output.assign(count * n, kPoison);
          if (algorithm == Algorithm::kPairwise)
            pairwise_alltoall(t, bytes(input), bytes(output), count * kElement, call);
          else
            bruck_alltoall(t, bytes(input), bytes(output), count * kElement, call, scratch);
        }
      }
    });
    for (std::size_t c = 0; c < counts.size(); ++c) {
      for (std::size_t a = 0; a < 2; ++a) {
        for (int r = 0; r < p; ++r) {
          INFO((a == 0 ? "pairwise" : "Bruck")
               << ", p = " << p << ", " << counts[c] << " elements a block, rank " << r);
          Values expected;
          for (int from = 0; from < p; ++from) {
            const Values values = block(from, r, counts[c]);
            expected.insert(expected.end(), values.begin(), values.end());
          }
          REQUIRE(outputs[2 * c + a][static_cast<std::size_t>(r)] == expected);
        }
      }
    }
  }
}

TEST_CASE("Algorithms alone: pairwise alltoallv moves empty and uneven blocks between any offsets",
          "[algorithms][alone]") {
  // Blocks of 0 to 3 * scale elements at scattered offsets; the gaps between the output's blocks
  // must stay untouched.
  for (const int p : kWorlds) {
    for (const int shift : {0, 1}) {
      for (const std::size_t scale : {std::size_t{1}, std::size_t{37}}) {
        INFO("p = " << p << ", shift " << shift << ", scale " << scale);
        const auto n = static_cast<std::size_t>(p);
        std::vector<UnevenBuffers> buffers(n);
        for (int r = 0; r < p; ++r)
          buffers[static_cast<std::size_t>(r)] = uneven_buffers(r, p, shift, scale);
        run_ranks(p, [&](InProcessTransport& t) {
          UnevenBuffers& b = buffers[static_cast<std::size_t>(t.rank())];
          pairwise_alltoallv(
              t, bytes(b.input), b.send_bytes, b.send_offsets, bytes(b.output), b.receive_bytes,
              b.receive_offsets, kElement,
              call_of(Collective::kAlltoallv, Algorithm::kPairwise, b.input.size(), 3));
        });
        for (int r = 0; r < p; ++r) {
          INFO("rank " << r);
          const UnevenBuffers& b = buffers[static_cast<std::size_t>(r)];
          REQUIRE(b.output == b.expected);
        }
      }
    }
  }
}

TEST_CASE(
    "Algorithms alone: alltoallv ranks that disagree on a block's size fail with a "
    "MismatchError",
    "[algorithms][alone]") {
  // Rank 0 sends rank 1 three elements; rank 1 expects four. Rank 1's receive sees the count in the
  // header and names both; rank 0, whose own block from rank 1 agrees, finishes.
  const InProcessOutcome outcome = run_in_process(
      2,
      [&](InProcessTransport& t) {
        const int r = t.rank();
        const std::size_t from_0 = r == 1 ? 4 : 3;
        const std::vector<std::size_t> send_bytes = {3 * kElement, 3 * kElement};
        const std::vector<std::size_t> send_offsets = {0, 3 * kElement};
        const std::vector<std::size_t> receive_bytes = {from_0 * kElement, 3 * kElement};
        const std::vector<std::size_t> receive_offsets = {0, from_0 * kElement};
        Values input = block(r, 0, 3);
        const Values to_1 = block(r, 1, 3);
        input.insert(input.end(), to_1.begin(), to_1.end());
        Values output(from_0 + 3, kPoison);
        pairwise_alltoallv(t, bytes(input), send_bytes, send_offsets, bytes(output), receive_bytes,
                           receive_offsets, kElement,
                           call_of(Collective::kAlltoallv, Algorithm::kPairwise, 6, 3));
      },
      std::chrono::seconds(5));
  CHECK(ending(outcome.errors[0]).empty());
  const std::string error = ending(outcome.errors[1]);
  INFO(error);
  CHECK(contains(error, "count differs between ranks: rank 1 has 4, rank 0 has 3"));
}

TEST_CASE("Algorithms alone: binomial gather and scatter place every block, for every root",
          "[algorithms][alone]") {
  // Per world and root, one run makes a gather and a scatter call for each block size. A non-root
  // rank's gather output must stay untouched, and its scatter input is null, never to be read (the
  // Communicator passes empty buffers there).
  const std::vector<std::size_t> counts = {5, 0, 1, 300};
  for (const int p : kWorlds) {
    const auto n = static_cast<std::size_t>(p);
    for (int root = 0; root < p; ++root) {
      std::vector<std::vector<Values>> gathered(counts.size(), std::vector<Values>(n));
      std::vector<std::vector<Values>> scattered(counts.size(), std::vector<Values>(n));
      run_ranks(p, [&](InProcessTransport& t) {
        const int r = t.rank();
        const auto u = static_cast<std::size_t>(r);
        for (std::size_t c = 0; c < counts.size(); ++c) {
          const std::size_t count = counts[c];
          const Values mine = block(r, root, count);
          Values& gather_output = gathered[c][u];
          gather_output.assign(r == root ? count * n : count + 1, kPoison);
          binomial_gather(t, bytes(mine), bytes(gather_output), count * kElement, root,
                          call_of(Collective::kGather, Algorithm::kTree, count, 2 * c, root));
          Values scatter_input;
          for (int to = 0; r == root && to < p; ++to) {
            const Values values = block(root, to, count);
            scatter_input.insert(scatter_input.end(), values.begin(), values.end());
          }
          Values& scatter_output = scattered[c][u];
          scatter_output.assign(count, kPoison);
          binomial_scatter(t, r == root ? bytes(scatter_input) : nullptr, bytes(scatter_output),
                           count * kElement, root,
                           call_of(Collective::kScatter, Algorithm::kTree, count, 2 * c + 1, root));
        }
      });
      for (std::size_t c = 0; c < counts.size(); ++c) {
        const std::size_t count = counts[c];
        INFO("p = " << p << ", root " << root << ", " << count << " elements a block");
        Values expected_at_root;
        for (int from = 0; from < p; ++from) {
          const Values values = block(from, root, count);
          expected_at_root.insert(expected_at_root.end(), values.begin(), values.end());
        }
        for (int r = 0; r < p; ++r) {
          INFO("rank " << r);
          const auto u = static_cast<std::size_t>(r);
          if (r == root)
            REQUIRE(gathered[c][u] == expected_at_root);
          else
            REQUIRE(gathered[c][u] == Values(count + 1, kPoison));
          REQUIRE(scattered[c][u] == block(root, r, count));
        }
      }
    }
  }
}

TEST_CASE(
    "Algorithms alone: gather and scatter ranks that disagree on the root or the block size "
    "fail with a MismatchError",
    "[algorithms][alone]") {
  const std::size_t count = 2;
  SECTION("gather: rank 1 of 4 names root 2, the others root 0") {
    // Relative to root 2, rank 1 is rank 3, whose parent is relative rank 2: rank 0, which expects
    // its child rank 1's block for root 0 and sees root 2 in the header. The others finish.
    const InProcessOutcome outcome = run_in_process(
        4,
        [&](InProcessTransport& t) {
          const int root = t.rank() == 1 ? 2 : 0;
          const Values mine = block(t.rank(), root, count);
          Values output(count * 4, kPoison);
          binomial_gather(t, bytes(mine), bytes(output), count * kElement, root,
                          call_of(Collective::kGather, Algorithm::kTree, count, 5, root));
        },
        std::chrono::seconds(5));
    const std::string error = ending(outcome.errors[0]);
    INFO(error);
    CHECK(contains(error, "root differs between ranks: rank 0 has 0, rank 1 has 2"));
    for (const std::size_t r : {std::size_t{1}, std::size_t{2}, std::size_t{3}})
      CHECK(ending(outcome.errors[r]).empty());
  }
  SECTION("scatter: rank 2 of 3 expects blocks of 3 elements, the root sends 2") {
    const InProcessOutcome outcome = run_in_process(
        3,
        [&](InProcessTransport& t) {
          const std::size_t mine = t.rank() == 2 ? count + 1 : count;
          Values input;
          for (int to = 0; t.rank() == 0 && to < 3; ++to) {
            const Values values = block(0, to, mine);
            input.insert(input.end(), values.begin(), values.end());
          }
          Values output(mine, kPoison);
          binomial_scatter(t, bytes(input), bytes(output), mine * kElement, 0,
                           call_of(Collective::kScatter, Algorithm::kTree, mine, 5, 0));
        },
        std::chrono::seconds(5));
    const std::string error = ending(outcome.errors[2]);
    INFO(error);
    CHECK(contains(error, "count differs between ranks: rank 2 has 3, rank 0 has 2"));
    CHECK(ending(outcome.errors[0]).empty());
    CHECK(ending(outcome.errors[1]).empty());
  }
}

TEST_CASE(
    "Algorithms alone: no rank leaves the dissemination barrier before every rank has "
    "entered it",
    "[algorithms][alone]") {
  // p barriers in a row; in barrier k, rank k sleeps before it enters. A barrier that lets a rank
  // through early (a round too few, a wrong distance) lets it see fewer than p arrivals.
  for (const int p : kWorlds) {
    INFO("p = " << p);
    const auto n = static_cast<std::size_t>(p);
    std::vector<std::atomic<int>> arrived(n);
    std::vector<std::vector<int>> seen(n, std::vector<int>(n, -1));
    run_ranks(p, [&](InProcessTransport& t) {
      for (std::size_t k = 0; k < n; ++k) {
        if (static_cast<std::size_t>(t.rank()) == k)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        arrived[k].fetch_add(1);
        MessageHeader call = call_of(Collective::kBarrier, Algorithm::kHalvingDoubling, 0, k);
        call.dtype = DataType::kUInt8;
        dissemination_barrier(t, call);
        seen[static_cast<std::size_t>(t.rank())][k] = arrived[k].load();
      }
    });
    for (std::size_t r = 0; r < n; ++r) {
      INFO("rank " << r);
      REQUIRE(seen[r] == std::vector<int>(n, p));
    }
  }
}

TEST_CASE(
    "Algorithms alone: barrier ranks at different sequence numbers fail with a "
    "MismatchError",
    "[algorithms][alone]") {
  // Rank 1 is one barrier ahead of rank 0: each sees the other's sequence number in the header.
  const InProcessOutcome outcome = run_in_process(
      2,
      [&](InProcessTransport& t) {
        MessageHeader call =
            call_of(Collective::kBarrier, Algorithm::kHalvingDoubling, 0, t.rank() == 1 ? 8 : 7);
        call.dtype = DataType::kUInt8;
        dissemination_barrier(t, call);
      },
      std::chrono::seconds(5));
  for (int r = 0; r < 2; ++r) {
    const std::string error = ending(outcome.errors[static_cast<std::size_t>(r)]);
    INFO("rank " << r << ": " << error);
    CHECK(contains(error, "collective sequence number differs between ranks"));
  }
}

namespace {

// Runs one rank's PeerTransfers over the transport as a point-to-point group runs: every receive
// from another rank posted, in list order, then every send; a block for itself is copied, its k-th
// send to its k-th receive. Each message's header carries its size, so a sender and a receiver
// that disagree on a block's size fail with MismatchError.
void run_transfers(InProcessTransport& t, const PeerTransfers& transfers,
                   const MessageHeader& call) {
  std::vector<InProcessTransport::Request> requests;
  std::vector<PeerReceive> from_self;
  std::vector<PeerSend> to_self;
  for (const PeerReceive& receive : transfers.receives) {
    if (receive.peer == t.rank()) {
      from_self.push_back(receive);
      continue;
    }
    requests.push_back(t.irecv(receive.peer, comm::detail::message(call, receive.bytes),
                               {static_cast<std::byte*>(receive.data), receive.bytes}));
  }
  for (const PeerSend& send : transfers.sends) {
    if (send.peer == t.rank()) {
      to_self.push_back(send);
      continue;
    }
    requests.push_back(t.isend(send.peer, comm::detail::message(call, send.bytes),
                               {static_cast<const std::byte*>(send.data), send.bytes}));
  }
  if (to_self.size() != from_self.size())
    throw std::runtime_error("rank " + std::to_string(t.rank()) + " sends itself " +
                             std::to_string(to_self.size()) + " blocks and receives " +
                             std::to_string(from_self.size()));
  for (std::size_t k = 0; k < to_self.size(); ++k) {
    if (to_self[k].bytes != from_self[k].bytes)
      throw std::runtime_error("rank " + std::to_string(t.rank()) +
                               "'s block for itself: " + std::to_string(to_self[k].bytes) +
                               " bytes sent, " + std::to_string(from_self[k].bytes) + " received");
    comm::detail::copy_bytes(static_cast<std::byte*>(from_self[k].data),
                             static_cast<const std::byte*>(to_self[k].data), to_self[k].bytes);
  }
  wait_all(t, std::span(requests));
}

}  // namespace

TEST_CASE(
    "Algorithms alone: the peer transfers of alltoallv, gather, scatter and allgatherv move "
    "every block to its place over a transport",
    "[algorithms][alone]") {
  // One run per world size: an alltoallv of uneven blocks at scattered offsets, a gather and a
  // scatter of 3 elements a block for every root, and an allgatherv whose blocks hold 0 to 9
  // elements.
  const std::size_t count = 3;
  for (const int p : {1, 2, 3, 4, 5, 7}) {
    INFO("p = " << p);
    const auto n = static_cast<std::size_t>(p);
    std::vector<UnevenBuffers> alltoallv(n);
    std::vector<std::vector<Values>> gathered(n, std::vector<Values>(n));
    std::vector<std::vector<Values>> scattered(n, std::vector<Values>(n));
    std::vector<Values> allgathered(n);
    // Rank j's allgatherv block, packed in rank order.
    std::vector<std::size_t> allgather_bytes(n), allgather_offsets(n);
    Values allgather_expected;
    for (int j = 0; j < p; ++j) {
      const auto u = static_cast<std::size_t>(j);
      const Values values = block(j, 0, uneven_count(j, 0, 1, 3));
      allgather_bytes[u] = values.size() * kElement;
      allgather_offsets[u] = allgather_expected.size() * kElement;
      allgather_expected.insert(allgather_expected.end(), values.begin(), values.end());
    }
    run_ranks(p, [&](InProcessTransport& t) {
      const int r = t.rank();
      const auto u = static_cast<std::size_t>(r);
      std::uint64_t sequence = 0;
      UnevenBuffers& b = alltoallv[u];
      b = uneven_buffers(r, p, 1, 5);
      run_transfers(t,
                    pairwise_transfers(b.input.data(), b.send_bytes, b.send_offsets,
                                       b.output.data(), b.receive_bytes, b.receive_offsets),
                    call_of(Collective::kAlltoallv, Algorithm::kNative, 0, sequence++));
      for (int root = 0; root < p; ++root) {
        const Values mine = block(r, root, count);
        Values& gather_output = gathered[static_cast<std::size_t>(root)][u];
        gather_output.assign(r == root ? count * n : 0, kPoison);
        run_transfers(
            t,
            gather_transfers(r, p, root, mine.data(), r == root ? gather_output.data() : nullptr,
                             count * kElement),
            call_of(Collective::kGather, Algorithm::kNative, count, sequence++, root));
        Values scatter_input;
        for (int to = 0; r == root && to < p; ++to) {
          const Values values = block(root, to, count);
          scatter_input.insert(scatter_input.end(), values.begin(), values.end());
        }
        Values& scatter_output = scattered[static_cast<std::size_t>(root)][u];
        scatter_output.assign(count, kPoison);
        run_transfers(t,
                      scatter_transfers(r, p, root, r == root ? scatter_input.data() : nullptr,
                                        scatter_output.data(), count * kElement),
                      call_of(Collective::kScatter, Algorithm::kNative, count, sequence++, root));
      }
      const Values mine = block(r, 0, uneven_count(r, 0, 1, 3));
      allgathered[u].assign(allgather_expected.size(), kPoison);
      run_transfers(t,
                    allgatherv_transfers(mine.data(), mine.size() * kElement, allgathered[u].data(),
                                         allgather_bytes, allgather_offsets),
                    call_of(Collective::kAllgatherv, Algorithm::kNative, 0, sequence++));
    });
    for (int r = 0; r < p; ++r) {
      INFO("rank " << r);
      const auto u = static_cast<std::size_t>(r);
      REQUIRE(alltoallv[u].output == alltoallv[u].expected);
      REQUIRE(allgathered[u] == allgather_expected);
      for (int root = 0; root < p; ++root) {
        INFO("root " << root);
        const auto v = static_cast<std::size_t>(root);
        REQUIRE(scattered[v][u] == block(root, r, count));
        if (r != root) continue;
        Values expected;
        for (int from = 0; from < p; ++from) {
          const Values values = block(from, root, count);
          expected.insert(expected.end(), values.begin(), values.end());
        }
        REQUIRE(gathered[v][u] == expected);
      }
    }
  }
}
