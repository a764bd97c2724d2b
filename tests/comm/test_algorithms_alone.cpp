// Every host algorithm header alone: ring, tree and halving-doubling called directly over an
// in-process transport (tests/support/in_process_transport.hpp), one thread per rank, with no
// Communicator, socket or MPI in between. World sizes 1 to 9 (powers of two and not), counts that
// leave empty and uneven blocks and cut into several pipelining chunks (small chunks in the
// tuning), int64 inputs exact under any order of summation; each result is compared with a
// reference computed on the test's side, and every message sent must have been received.
#include <catch2/catch.hpp>

#include <coltrain/comm/algorithms/halving_doubling.hpp>
#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/algorithms/ring.hpp>
#include <coltrain/comm/algorithms/tree.hpp>
#include <coltrain/comm/protocol/message_header.hpp>

#include "../support/in_process_transport.hpp"
#include "algorithms_alone.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using coltrain::testing::InProcessOutcome;
using coltrain::testing::InProcessTransport;
using coltrain::testing::run_in_process;
using coltrain::testing::run_ranks;
using coltrain::testing::small_chunks;

namespace {

MessageHeader call_of(Collective collective, Algorithm algorithm, std::size_t count, int root = 0,
                      ReduceOp op = ReduceOp::kSum) {
  MessageHeader call;
  call.collective = collective;
  call.algorithm = algorithm;
  call.dtype = DataType::kInt64;
  call.op = op;
  call.root = root;
  call.sequence = 7;
  call.count = count;
  return call;
}

// Rank r's element i: distinct per rank and element, signed, and large enough that an element
// taken from the wrong rank or position shows.
std::int64_t input_value(int rank, std::size_t i) {
  return (static_cast<std::int64_t>(rank) + 1) * 1000003 - static_cast<std::int64_t>(i) * 7919 +
         (static_cast<std::int64_t>(i % 5) - 2) * 65537;
}

std::vector<std::int64_t> inputs(int rank, std::size_t count) {
  std::vector<std::int64_t> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = input_value(rank, i);
  return values;
}

std::int64_t reduced(int p, std::size_t i, ReduceOp op) {
  std::int64_t result = input_value(0, i);
  for (int r = 1; r < p; ++r) {
    const std::int64_t v = input_value(r, i);
    result = op == ReduceOp::kMax   ? std::max(result, v)
             : op == ReduceOp::kMin ? std::min(result, v)
                                    : result + v;
  }
  return result;
}

std::byte* bytes(std::vector<std::int64_t>& v) { return reinterpret_cast<std::byte*>(v.data()); }
const std::byte* bytes(const std::vector<std::int64_t>& v) {
  return reinterpret_cast<const std::byte*>(v.data());
}

const std::vector<int> kWorlds = {1, 2, 3, 4, 5, 7, 8, 9};
const std::vector<std::size_t> kCounts = {0, 1, 5, 13, 1000, 4099};

}  // namespace

TEST_CASE("Algorithms alone: ring, tree and halving-doubling allreduce give the exact reduction",
          "[algorithms][alone]") {
  const AlgorithmTuning tuning = small_chunks();
  for (const Algorithm algorithm :
       {Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (const int p : kWorlds) {
        for (const std::size_t count : kCounts) {
          INFO(name_of(algorithm) << ", " << name_of(op) << ", p = " << p << ", count " << count);
          std::vector<std::vector<std::int64_t>> outputs(static_cast<std::size_t>(p));
          run_ranks(p, [&](InProcessTransport& t) {
            const std::vector<std::int64_t> in = inputs(t.rank(), count);
            std::vector<std::int64_t>& out = outputs[static_cast<std::size_t>(t.rank())];
            out.assign(count, -1);
            const MessageHeader call = call_of(Collective::kAllreduce, algorithm, count, 0, op);
            const ElementReduction reduction = element_reduction<std::int64_t>(op);
            AlgorithmScratch scratch;
            if (algorithm == Algorithm::kRing)
              ring_allreduce(t, bytes(in), bytes(out), count, reduction, call, tuning, scratch);
            else if (algorithm == Algorithm::kTree)
              tree_allreduce(t, bytes(in), bytes(out), count, reduction, call, tuning, scratch);
            else
              halving_doubling_allreduce(t, bytes(in), bytes(out), count, reduction, call, tuning,
                                         scratch);
          });
          for (int r = 0; r < p; ++r)
            for (std::size_t i = 0; i < count; ++i)
              REQUIRE(outputs[static_cast<std::size_t>(r)][i] == reduced(p, i, op));
        }
      }
    }
  }
}

TEST_CASE(
    "Algorithms alone: one scratch reused by every algorithm, in place and not, large then "
    "small, gives the exact reduction",
    "[algorithms][alone]") {
  // A communicator keeps one AlgorithmScratch for all its calls: what a larger call left in the
  // receive slots and partial results must never reach a later call's result.
  const AlgorithmTuning tuning = small_chunks();
  for (const int p : {3, 4}) {
    INFO("p = " << p);
    std::vector<std::vector<std::int64_t>> results(static_cast<std::size_t>(p));
    std::vector<std::string> failures(static_cast<std::size_t>(p));
    run_ranks(p, [&](InProcessTransport& t) {
      AlgorithmScratch scratch;
      std::uint64_t sequence = 0;  // each call its own, as a communicator numbers them
      std::string& failure = failures[static_cast<std::size_t>(t.rank())];
      for (const std::size_t count : {std::size_t{4099}, std::size_t{13}, std::size_t{1000}}) {
        for (const Algorithm algorithm :
             {Algorithm::kHalvingDoubling, Algorithm::kRing, Algorithm::kTree}) {
          for (const bool in_place : {false, true}) {
            std::vector<std::int64_t> in = inputs(t.rank(), count);
            std::vector<std::int64_t> out(count, -1);
            std::vector<std::int64_t>& result = in_place ? in : out;
            MessageHeader call = call_of(Collective::kAllreduce, algorithm, count);
            call.sequence = ++sequence;
            const ElementReduction sum = element_reduction<std::int64_t>(ReduceOp::kSum);
            const std::byte* input = bytes(in);
            std::byte* output = bytes(result);
            if (algorithm == Algorithm::kRing)
              ring_allreduce(t, input, output, count, sum, call, tuning, scratch);
            else if (algorithm == Algorithm::kTree)
              tree_allreduce(t, input, output, count, sum, call, tuning, scratch);
            else
              halving_doubling_allreduce(t, input, output, count, sum, call, tuning, scratch);
            for (std::size_t i = 0; i < count && failure.empty(); ++i) {
              if (result[i] != reduced(p, i, ReduceOp::kSum)) {
                failure = std::string(name_of(algorithm)) + (in_place ? " in place" : "") +
                          ", count " + std::to_string(count) + ", element " + std::to_string(i);
              }
            }
          }
        }
      }
    });
    for (const std::string& failure : failures) CHECK(failure == "");
  }
}

TEST_CASE("Algorithms alone: ring reduce-scatter and allgather move the right blocks",
          "[algorithms][alone]") {
  const AlgorithmTuning tuning = small_chunks();
  for (const int p : kWorlds) {
    for (const std::size_t count : kCounts) {
      INFO("p = " << p << ", count " << count << " per rank");
      const auto n = static_cast<std::size_t>(p);
      std::vector<std::vector<std::int64_t>> scattered(n), gathered(n);
      run_ranks(p, [&](InProcessTransport& t) {
        const auto r = static_cast<std::size_t>(t.rank());
        const std::vector<std::int64_t> in = inputs(t.rank(), count * n);
        scattered[r].assign(count, -1);
        AlgorithmScratch scratch;
        ring_reduce_scatter(t, bytes(in), bytes(scattered[r]), count,
                            element_reduction<std::int64_t>(ReduceOp::kSum),
                            call_of(Collective::kReduceScatter, Algorithm::kRing, count), tuning,
                            scratch);
        const std::vector<std::int64_t> mine = inputs(t.rank(), count);
        gathered[r].assign(count * n, -1);
        ring_allgather(t, bytes(mine), bytes(gathered[r]), count, sizeof(std::int64_t),
                       call_of(Collective::kAllgather, Algorithm::kRing, count), tuning);
      });
      for (std::size_t r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < count; ++i)
          REQUIRE(scattered[r][i] == reduced(p, r * count + i, ReduceOp::kSum));
        for (std::size_t block = 0; block < n; ++block)
          for (std::size_t i = 0; i < count; ++i)
            REQUIRE(gathered[r][block * count + i] == input_value(static_cast<int>(block), i));
      }
    }
  }
}

TEST_CASE("Algorithms alone: ring and tree broadcast and reduce honour every root",
          "[algorithms][alone]") {
  const AlgorithmTuning tuning = small_chunks();
  for (const Algorithm algorithm : {Algorithm::kRing, Algorithm::kTree}) {
    for (const int p : {1, 2, 3, 5, 8}) {
      for (int root = 0; root < p; ++root) {
        for (const std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{3001}}) {
          INFO(name_of(algorithm) << ", p = " << p << ", root " << root << ", count " << count);
          const auto n = static_cast<std::size_t>(p);
          std::vector<std::vector<std::int64_t>> broadcast(n), reduction(n);
          run_ranks(p, [&](InProcessTransport& t) {
            const auto r = static_cast<std::size_t>(t.rank());
            broadcast[r] =
                t.rank() == root ? inputs(root, count) : std::vector<std::int64_t>(count, -1);
            const MessageHeader bcast = call_of(Collective::kBroadcast, algorithm, count, root);
            if (algorithm == Algorithm::kRing)
              ring_broadcast(t, bytes(broadcast[r]), count, sizeof(std::int64_t), root, bcast,
                             tuning);
            else
              tree_broadcast(t, bytes(broadcast[r]), count, sizeof(std::int64_t), root, bcast,
                             tuning);
            const std::vector<std::int64_t> in = inputs(t.rank(), count);
            reduction[r].assign(count, -1);
            const MessageHeader reduce = call_of(Collective::kReduce, algorithm, count, root);
            const ElementReduction sum = element_reduction<std::int64_t>(ReduceOp::kSum);
            AlgorithmScratch scratch;
            if (algorithm == Algorithm::kRing)
              ring_reduce(t, bytes(in), bytes(reduction[r]), count, root, sum, reduce, tuning,
                          scratch);
            else
              tree_reduce(t, bytes(in), bytes(reduction[r]), count, root, sum, reduce, tuning,
                          scratch);
          });
          for (std::size_t r = 0; r < n; ++r)
            for (std::size_t i = 0; i < count; ++i)
              REQUIRE(broadcast[r][i] == input_value(root, i));
          for (std::size_t i = 0; i < count; ++i)
            REQUIRE(reduction[static_cast<std::size_t>(root)][i] == reduced(p, i, ReduceOp::kSum));
        }
      }
    }
  }
}

TEST_CASE("Algorithms alone: ranks that disagree on the call fail with a MismatchError",
          "[algorithms][alone]") {
  // Rank 1 calls the tree where the others call the ring: a message it receives, or one it sends,
  // carries the other algorithm, which the header check names. The ranks left waiting time out.
  const AlgorithmTuning tuning = small_chunks();
  const std::size_t count = 64;
  const InProcessOutcome outcome = run_in_process(
      3,
      [&](InProcessTransport& t) {
        const std::vector<std::int64_t> in = inputs(t.rank(), count);
        std::vector<std::int64_t> out(count);
        const Algorithm algorithm = t.rank() == 1 ? Algorithm::kTree : Algorithm::kRing;
        const MessageHeader call = call_of(Collective::kAllreduce, algorithm, count);
        const ElementReduction sum = element_reduction<std::int64_t>(ReduceOp::kSum);
        AlgorithmScratch scratch;
        if (algorithm == Algorithm::kRing)
          ring_allreduce(t, bytes(in), bytes(out), count, sum, call, tuning, scratch);
        else
          tree_allreduce(t, bytes(in), bytes(out), count, sum, call, tuning, scratch);
      },
      std::chrono::seconds(3));
  int mismatches = 0;
  for (const std::exception_ptr& error : outcome.errors) {
    if (!error) continue;
    try {
      std::rethrow_exception(error);
    } catch (const MismatchError& e) {
      ++mismatches;
      CHECK(std::string(e.what()).find("tree") != std::string::npos);
    } catch (const TimeoutError&) {
    }
  }
  CHECK(mismatches >= 1);
}
