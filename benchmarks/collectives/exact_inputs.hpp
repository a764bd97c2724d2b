#pragma once
// Inputs whose every reduction is exact, in any order and in every dtype (nccl-tests' principle),
// and the results they must give, compared bit for bit.

#include "element_values.hpp"
#include "sizes.hpp"

#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace coltrain::bench {

// The type f16 and bf16 are reduced in, and the average divided in: the communicator's own choice.
template <class T>
using Accumulator = std::conditional_t<kNarrowFloat<T>, float, T>;

// Integers up to this are exact in the dtype, so sums below it are exact in any order.
inline std::int64_t exact_integers(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
      return 2048;
    case DataType::kBFloat16:
      return 256;
    case DataType::kFloat32:
      return std::int64_t{1} << 24;
    default:
      return std::int64_t{1} << 30;
  }
}

// A fixed scramble of (rank, index): neighbouring elements and ranks get unrelated values, so a
// misplaced block or a missing rank shows in the check.
inline std::uint64_t scramble(int rank, std::size_t index) {
  std::uint64_t x = static_cast<std::uint64_t>(index) * 0x9E3779B97F4A7C15ull +
                    static_cast<std::uint64_t>(rank) * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 32);
}

// The small integers each rank contributes, chosen per op so that the result is exact in the dtype
// whatever the order of the reduction (nccl-tests' principle):
// - sum, avg: 1..k, with k * ranks within the dtype's exact integers (bf16 has 8 bits);
// - prod: 2, -1 or 1, 2 from at most kProdRanks ranks, so products are exact powers of two;
// - min, max, and the data of allgather and broadcast: -100..100.
class Inputs {
 public:
  static constexpr int kProdRanks = 15;  // 2^15 stays below f16's largest finite value

  explicit Inputs(const Case& c) : collective_(c.collective), op_(c.op), ranks_(c.ranks) {
    const std::int64_t limit = exact_integers(c.dtype);
    sum_ranks_ = static_cast<int>(std::min<std::int64_t>(ranks_, limit));
    sum_range_ = std::clamp<std::int64_t>(limit / ranks_, 1, 4);
  }

  // What `rank` holds at element `index` of its input.
  std::int64_t value(int rank, std::size_t index) const {
    const std::uint64_t x = scramble(rank, index);
    if (!reduces(collective_)) return static_cast<std::int64_t>(x % 201) - 100;
    switch (op_) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return rank < sum_ranks_ ? 1 + static_cast<std::int64_t>(x % sum_range_) : 0;
      case ReduceOp::kProd: {
        if (rank >= kProdRanks) return 1;
        constexpr std::int64_t kFactors[] = {2, -1, 1, 1};
        return kFactors[x % 4];
      }
      case ReduceOp::kMin:
      case ReduceOp::kMax:
        return static_cast<std::int64_t>(x % 201) - 100;
    }
    return 0;
  }

  // The reduction of every rank's element `index` (for avg: the sum), exactly.
  std::int64_t reduced(std::size_t index) const {
    std::int64_t result = value(0, index);
    for (int rank = 1; rank < ranks_; ++rank) {
      const std::int64_t x = value(rank, index);
      switch (op_) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          result += x;
          break;
        case ReduceOp::kProd:
          result *= x;
          break;
        case ReduceOp::kMin:
          result = std::min(result, x);
          break;
        case ReduceOp::kMax:
          result = std::max(result, x);
          break;
      }
    }
    return result;
  }

 private:
  Collective collective_;
  ReduceOp op_;
  int ranks_;
  int sum_ranks_;
  std::int64_t sum_range_;
};

// The expected result from the exact reduction: avg divides once, in the accumulator type.
template <class T>
T expected_reduction(std::int64_t reduced, ReduceOp op, int ranks) {
  if (op != ReduceOp::kAvg) return element<T>(reduced);
  using A = Accumulator<T>;
  const A average = static_cast<A>(reduced) / static_cast<A>(ranks);
  if constexpr (kNarrowFloat<T>) {
    return T(average);
  } else {
    return average;
  }
}

// Exact comparison, bit for bit.
template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

}  // namespace coltrain::bench
