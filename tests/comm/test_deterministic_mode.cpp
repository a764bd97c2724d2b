// Deterministic mode (CommOptions::deterministic) through the Communicator, under mpiexec, on both
// backends: allreduce, reduce_scatter and reduce of random floats give the bits of the fixed tree
// over the ranks (rank_order.hpp) whatever algorithm the call names (MPI's own included) and
// whatever the chunk size, for f32, f64, f16 and bf16 (reduced in f32, rounded once). Every rank
// computes the reference itself: the inputs of rank r come from a generator seeded with r. Without
// the mode, the same inputs give other bits under some algorithm on three ranks or more, so the
// check can fail.
#include <catch2/catch.hpp>

#include "collective_fixtures.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/core/dtype.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;

namespace {

template <class T>
using Accumulator = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Rank r's inputs: random signs and mantissas over exponents -12..12.
template <class T>
std::vector<T> random_inputs(int rank, std::size_t count) {
  std::mt19937_64 generator(0xd37e0000u + static_cast<unsigned>(rank) * 104729u + count);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<T> values(count);
  for (T& v : values) {
    const auto value =
        static_cast<Accumulator<T>>(std::ldexp(mantissa(generator), exponent(generator)));
    v = T(value);
  }
  return values;
}

// Copies [lo, hi) of element i folded as deterministic mode promises: the largest power of two
// below their number on the left, the rest on the right, each folded the same way.
template <class A>
A fold(const std::vector<std::vector<A>>& x, std::size_t i, std::size_t lo, std::size_t hi,
       ReduceOp op) {
  if (hi - lo == 1) return x[lo][i];
  const std::size_t mid = lo + std::bit_floor(hi - lo - 1);
  const A left = fold(x, i, lo, mid, op);
  const A right = fold(x, i, mid, hi, op);
  return op == ReduceOp::kMax ? (left < right ? right : left) : left + right;
}

// Every rank's inputs reduced in the fixed tree, accumulated as coltrain does (f16/bf16 in f32)
// and rounded once; kAvg divides once.
template <class T>
std::vector<T> fixed_tree_reduction(int ranks, std::size_t count, ReduceOp op) {
  using A = Accumulator<T>;
  std::vector<std::vector<A>> wide(static_cast<std::size_t>(ranks), std::vector<A>(count));
  for (int r = 0; r < ranks; ++r) {
    const std::vector<T> x = random_inputs<T>(r, count);
    for (std::size_t i = 0; i < count; ++i)
      wide[static_cast<std::size_t>(r)][i] = static_cast<A>(x[i]);
  }
  std::vector<T> result(count);
  for (std::size_t i = 0; i < count; ++i) {
    const A value = fold(wide, i, 0, wide.size(), op);
    result[i] = T(op == ReduceOp::kAvg ? value / static_cast<A>(ranks) : value);
  }
  return result;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

std::vector<Algorithm> named_algorithms(Backend backend, Collective collective) {
  std::vector<Algorithm> result{Algorithm::kAutomatic};
  for (Algorithm a : algorithms_for(collective))
    if (a != Algorithm::kNative || backend == Backend::kMpi) result.push_back(a);
  return result;
}

// Chunk sizes with the counts they cut into several chunks a segment, uneven segments included:
// 256 bytes with short vectors, 4 KiB with one of 20,001 elements (about 7 chunks a segment on 3
// ranks, past the 16 KiB of the direct path), each kept small because every chunk is p-1 messages
// and the suite runs under AddressSanitizer.
struct Shape {
  std::size_t chunk_bytes;
  std::vector<std::size_t> counts;
};
const std::vector<Shape> kShapes = {{256, {1, 7, 1000}}, {4096, {1000, 20001}}};

template <class T>
void check_every_algorithm(Backend backend) {
  CommOptions options;
  options.deterministic = true;
  Communicator comm = coltrain::testing::make_communicator(backend, options);
  REQUIRE(comm.deterministic());
  const int p = comm.size();
  const int rank = comm.rank();
  for (const auto& [chunk_bytes, counts] : kShapes) {
    AlgorithmTuning tuning;
    tuning.chunk_bytes = chunk_bytes;
    tuning.min_chunk_bytes = chunk_bytes;
    comm.set_tuning(tuning);
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      for (const std::size_t count : counts) {
        INFO(name_of(backend) << ", " << name_of(data_type_v<T>) << ", " << name_of(op)
                              << ", count " << count << ", chunk bytes " << chunk_bytes);
        const std::vector<T> input = random_inputs<T>(rank, count);
        const std::vector<T> expected = fixed_tree_reduction<T>(p, count, op);
        for (Algorithm a : named_algorithms(backend, Collective::kAllreduce)) {
          INFO("allreduce, algorithm " << name_of(a));
          std::vector<T> output(count);
          comm.allreduce(std::span<const T>(input), std::span(output), op, a);
          CHECK(same_bits(output, expected));
          std::vector<T> in_place = input;
          comm.allreduce(std::span(in_place), op, a);
          CHECK(same_bits(in_place, expected));
        }
        for (Algorithm a : named_algorithms(backend, Collective::kReduce)) {
          INFO("reduce to rank " << p - 1 << ", algorithm " << name_of(a));
          std::vector<T> output(count);
          comm.reduce(std::span<const T>(input), std::span(output), p - 1, op, a);
          if (rank == p - 1) CHECK(same_bits(output, expected));
        }
        // reduce_scatter: rank r's block of the fold over count * p elements.
        const std::vector<T> whole_input =
            random_inputs<T>(rank, count * static_cast<std::size_t>(p));
        const std::vector<T> whole =
            fixed_tree_reduction<T>(p, count * static_cast<std::size_t>(p), op);
        const std::vector<T> block(whole.begin() + static_cast<std::ptrdiff_t>(count) * rank,
                                   whole.begin() + static_cast<std::ptrdiff_t>(count) * (rank + 1));
        for (Algorithm a : named_algorithms(backend, Collective::kReduceScatter)) {
          INFO("reduce_scatter, algorithm " << name_of(a));
          std::vector<T> output(count);
          comm.reduce_scatter(std::span<const T>(whole_input), std::span(output), op, a);
          CHECK(same_bits(output, block));
        }
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("deterministic mode: every algorithm gives the fixed tree's bits",
                   "[comm][deterministic]", float, double, half, bfloat16) {
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) check_every_algorithm<TestType>(backend);
}

TEST_CASE("deterministic mode: the inputs tell other orders of addition from the fixed tree",
          "[comm][deterministic]") {
  Communicator& comm = coltrain::testing::shared_communicator(Backend::kTcp);
  REQUIRE_FALSE(comm.deterministic());
  if (comm.size() < 3) return;  // x0 + x1 = x1 + x0: two ranks add in one order only
  const std::size_t count = 70001;
  const std::vector<float> input = random_inputs<float>(comm.rank(), count);
  const std::vector<float> expected =
      fixed_tree_reduction<float>(comm.size(), count, ReduceOp::kSum);
  int differing = 0;
  for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling}) {
    std::vector<float> output(count);
    comm.allreduce(std::span<const float>(input), std::span(output), ReduceOp::kSum, a);
    differing += same_bits(output, expected) ? 0 : 1;
  }
  CHECK(differing > 0);
}
