// Rank-order reductions (rank_order.hpp) alone over the in-process transport, one thread per rank:
// allreduce, reduce_scatter and reduce of random floats give, bit for bit, the fixed tree
// ((x0 op x1) op (x2 op x3)) op x4 ... on every rank, at every count (empty and uneven segments
// included), chunk size and op, in place and out of place. The inputs span many exponents, so that
// another order of the same additions gives other bits: the ring's allreduce of them is checked to
// differ.
#include <catch2/catch.hpp>

#include <coltrain/comm/algorithms/rank_order.hpp>
#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/algorithms/ring.hpp>
#include <coltrain/comm/protocol/message_header.hpp>

#include "../support/in_process_transport.hpp"
#include "algorithms_alone.hpp"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using coltrain::testing::InProcessTransport;
using coltrain::testing::run_ranks;
using coltrain::testing::small_chunks;

namespace {

MessageHeader call_of(Collective collective, DataType dtype, std::size_t count, ReduceOp op,
                      int root = 0, Algorithm algorithm = Algorithm::kRankOrder) {
  MessageHeader call;
  call.collective = collective;
  call.algorithm = algorithm;
  call.dtype = dtype;
  call.op = op;
  call.root = root;
  call.sequence = 5;
  call.count = count;
  return call;
}

// Rank r's inputs: random signs and mantissas over exponents -20..20, the same for a seed.
template <class T>
std::vector<T> random_inputs(int rank, std::size_t count) {
  std::mt19937_64 generator(0x5eed0000u + static_cast<unsigned>(rank) * 7919u + count);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<T> values(count);
  for (T& v : values) v = static_cast<T>(std::ldexp(mantissa(generator), exponent(generator)));
  return values;
}

// The copies [lo, hi) folded as the contract states it: the largest power of two below their
// number on the left, the rest on the right, each folded the same way.
template <class T>
std::vector<T> fold(const std::vector<std::vector<T>>& inputs, std::size_t lo, std::size_t hi,
                    ReduceOp op) {
  if (hi - lo == 1) return inputs[lo];
  const std::size_t mid = lo + std::bit_floor(hi - lo - 1);
  std::vector<T> left = fold(inputs, lo, mid, op);
  const std::vector<T> right = fold(inputs, mid, hi, op);
  reduce_into(left.data(), left.data(), right.data(), left.size(), op);
  return left;
}

// The reduction deterministic mode promises: the fixed tree over all ranks; kAvg divides once.
template <class T>
std::vector<T> fold_in_fixed_tree(const std::vector<std::vector<T>>& inputs, ReduceOp op) {
  std::vector<T> result = fold(inputs, 0, inputs.size(), op);
  if (op == ReduceOp::kAvg)
    divide_by_ranks(result.data(), result.size(), static_cast<int>(inputs.size()));
  return result;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

const std::vector<std::size_t> kCounts = {0, 1, 2, 5, 13, 1000, 4099};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd, ReduceOp::kMin,
                             ReduceOp::kMax};

template <class T>
void check_allreduce(int p, std::size_t count, ReduceOp op, const AlgorithmTuning& tuning,
                     bool in_place) {
  const auto n = static_cast<std::size_t>(p);
  std::vector<std::vector<T>> inputs(n);
  for (int r = 0; r < p; ++r) inputs[static_cast<std::size_t>(r)] = random_inputs<T>(r, count);
  std::vector<std::vector<T>> outputs(n);
  run_ranks(p, [&](InProcessTransport& t) {
    const auto r = static_cast<std::size_t>(t.rank());
    std::vector<T>& out = outputs[r];
    out = in_place ? inputs[r] : std::vector<T>(count, T(-3));
    AlgorithmScratch scratch;
    rank_order_allreduce(
        t, reinterpret_cast<const std::byte*>(in_place ? out.data() : inputs[r].data()),
        reinterpret_cast<std::byte*>(out.data()), count, element_reduction<T>(op),
        call_of(Collective::kAllreduce, data_type_v<T>, count, op), tuning, scratch);
  });
  const std::vector<T> expected = fold_in_fixed_tree(inputs, op);
  for (std::size_t r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(same_bits(outputs[r], expected));
  }
}

}  // namespace

TEST_CASE("Algorithms alone: rank-order allreduce gives the fixed tree's bits on every rank",
          "[algorithms][alone][rank_order]") {
  for (const AlgorithmTuning& tuning : {small_chunks(), AlgorithmTuning{}}) {
    for (int p = 1; p <= 5; ++p) {
      for (const ReduceOp op : kOps) {
        for (const std::size_t count : kCounts) {
          for (const bool in_place : {false, true}) {
            INFO(p << " ranks, " << name_of(op) << ", count " << count << ", chunk bytes "
                   << tuning.chunk_bytes << (in_place ? ", in place" : ""));
            check_allreduce<float>(p, count, op, tuning, in_place);
            // The fold moves bytes and calls the element reduction: one op shows that 8-byte
            // elements land where they belong.
            if (op == ReduceOp::kSum) check_allreduce<double>(p, count, op, tuning, in_place);
          }
        }
      }
    }
  }
}

TEST_CASE("Algorithms alone: rank-order reduce_scatter and reduce give the fixed tree's bits",
          "[algorithms][alone][rank_order]") {
  for (const AlgorithmTuning& tuning : {small_chunks(), AlgorithmTuning{}}) {
    for (int p = 1; p <= 5; ++p) {
      const auto n = static_cast<std::size_t>(p);
      for (const ReduceOp op : kOps) {
        for (const std::size_t count : kCounts) {
          INFO(p << " ranks, " << name_of(op) << ", count " << count << ", chunk bytes "
                 << tuning.chunk_bytes);
          // reduce_scatter: each rank's block of `count` elements out of count * p.
          std::vector<std::vector<float>> inputs(n);
          for (int r = 0; r < p; ++r)
            inputs[static_cast<std::size_t>(r)] = random_inputs<float>(r, count * n);
          const std::vector<float> whole = fold_in_fixed_tree(inputs, op);
          std::vector<std::vector<float>> blocks(n, std::vector<float>(count, -3.0f));
          run_ranks(p, [&](InProcessTransport& t) {
            const auto r = static_cast<std::size_t>(t.rank());
            AlgorithmScratch scratch;
            rank_order_reduce_scatter(
                t, reinterpret_cast<const std::byte*>(inputs[r].data()),
                reinterpret_cast<std::byte*>(blocks[r].data()), count, element_reduction<float>(op),
                call_of(Collective::kReduceScatter, DataType::kFloat32, count, op), tuning,
                scratch);
          });
          for (std::size_t r = 0; r < n; ++r) {
            INFO("reduce_scatter, rank " << r);
            const std::vector<float> expected(
                whole.begin() + static_cast<std::ptrdiff_t>(r * count),
                whole.begin() + static_cast<std::ptrdiff_t>((r + 1) * count));
            CHECK(same_bits(blocks[r], expected));
          }
          // In place, as Communicator::reduce_scatter(data) passes it: the output is this rank's
          // block of the input.
          std::vector<std::vector<float>> in_place = inputs;
          run_ranks(p, [&](InProcessTransport& t) {
            const auto r = static_cast<std::size_t>(t.rank());
            AlgorithmScratch scratch;
            rank_order_reduce_scatter(
                t, reinterpret_cast<const std::byte*>(in_place[r].data()),
                reinterpret_cast<std::byte*>(in_place[r].data() + r * count), count,
                element_reduction<float>(op),
                call_of(Collective::kReduceScatter, DataType::kFloat32, count, op), tuning,
                scratch);
          });
          for (std::size_t r = 0; r < n; ++r) {
            INFO("reduce_scatter in place, rank " << r);
            const auto block = [&](const std::vector<float>& v) {
              return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(r * count),
                                        v.begin() + static_cast<std::ptrdiff_t>((r + 1) * count));
            };
            CHECK(same_bits(block(in_place[r]), block(whole)));
          }
          // reduce to each root in turn under sum (the other ops to the last rank): the root holds
          // the fold, the others' output is untouched.
          for (int root = op == ReduceOp::kSum ? 0 : p - 1; root < p; ++root) {
            std::vector<std::vector<float>> outputs(n, std::vector<float>(count * n, -3.0f));
            run_ranks(p, [&](InProcessTransport& t) {
              const auto r = static_cast<std::size_t>(t.rank());
              AlgorithmScratch scratch;
              rank_order_reduce(
                  t, reinterpret_cast<const std::byte*>(inputs[r].data()),
                  reinterpret_cast<std::byte*>(outputs[r].data()), count * n, root,
                  element_reduction<float>(op),
                  call_of(Collective::kReduce, DataType::kFloat32, count * n, op, root), tuning,
                  scratch);
            });
            INFO("reduce to root " << root);
            CHECK(same_bits(outputs[static_cast<std::size_t>(root)], whole));
            for (std::size_t r = 0; r < n; ++r) {
              if (static_cast<int>(r) != root)
                CHECK(same_bits(outputs[r], std::vector<float>(count * n, -3.0f)));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("Algorithms alone: these inputs tell the ring's order of additions from the fixed tree",
          "[algorithms][alone][rank_order]") {
  // Without this, a test of bits could pass with an order that merely happens to agree.
  const int p = 4;
  const std::size_t count = 4099;
  std::vector<std::vector<float>> inputs(p);
  for (int r = 0; r < p; ++r) inputs[static_cast<std::size_t>(r)] = random_inputs<float>(r, count);
  std::vector<float> ring_result;
  run_ranks(p, [&](InProcessTransport& t) {
    std::vector<float> out(count);
    AlgorithmScratch scratch;
    ring_allreduce(
        t, reinterpret_cast<const std::byte*>(inputs[static_cast<std::size_t>(t.rank())].data()),
        reinterpret_cast<std::byte*>(out.data()), count, element_reduction<float>(ReduceOp::kSum),
        call_of(Collective::kAllreduce, DataType::kFloat32, count, ReduceOp::kSum, 0,
                Algorithm::kRing),
        small_chunks(), scratch);
    if (t.rank() == 0) ring_result = out;
  });
  CHECK_FALSE(same_bits(ring_result, fold_in_fixed_tree(inputs, ReduceOp::kSum)));
}
