// f16 and bf16 reductions on host buffers are computed in f32 and rounded to 16 bits once, on every
// host algorithm and both backends (docs/collectives.md, "Calls"). Every input below is exact in
// its 16-bit type and every f32 partial result is exact, but rounding any partial result to 16 bits
// loses a contribution: a 16-bit accumulation, in any order, gives other bits than the reference.
#include <catch2/catch.hpp>

#include "collective_fixtures.hpp"

#include <coltrain/comm.hpp>

#include <cstddef>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using coltrain::testing::same_bits;
using coltrain::testing::shared_communicator;

namespace {

// Three ranks contribute large + half a ulp + a little: just above a rounding midpoint, which 16
// bits see only if the little one is not lost first; the other ranks add 0. For kProd three ranks
// contribute a factor whose square already rounds; the others multiply by 1.
template <class T>
struct Inputs;

template <>
struct Inputs<bfloat16> {  // 8 significant bits
  // Its ulp is 1 and its significand even, so that large + 0.5 ties down to it; of such values,
  // 142 is the smallest whose averages over 3 to 8 ranks also round apart.
  static constexpr double kLarge = 142;
  static constexpr double kHalfUlp = 0.5;
  static constexpr double kLittle = 0x1p-10;  // under half of 0.5's ulp: lost when added to it
  // factor^3 = 1.19946 rounds to 1.203125 once, but factor^2 ties down to 1.125 and 1.125 * factor
  // is 1.1953125.
  static constexpr double kFactor = 1 + 0x1p-4;
};

template <>
struct Inputs<half> {  // 11 significant bits; the same reasoning, scaled
  static constexpr double kLarge = 1024;
  static constexpr double kHalfUlp = 0.5;
  static constexpr double kLittle = 0x1p-13;
  // factor^3 rounds to 1073/1024 once; in two steps, to 1056/1024, then 1072/1024.
  static constexpr double kFactor = 1 + 0x1p-6;
};

// Rank `rank`'s contribution at element i: element i's three contributors start at rank i % p, so
// each algorithm meets the large value at every position of its order; odd elements are negated.
template <class T>
double contribution(ReduceOp op, int rank, int ranks, std::size_t i) {
  const auto p = static_cast<std::size_t>(ranks);
  const std::size_t position = (static_cast<std::size_t>(rank) + p - i % p) % p;
  if (op == ReduceOp::kProd) return position < 3 ? Inputs<T>::kFactor : 1.0;
  const double sign = i % 2 == 0 ? 1.0 : -1.0;
  switch (position) {
    case 0:
      return sign * Inputs<T>::kLarge;
    case 1:
      return sign * Inputs<T>::kHalfUlp;
    case 2:
      return sign * Inputs<T>::kLittle;
    default:
      return 0.0;
  }
}

template <class T>
std::vector<T> inputs(ReduceOp op, int rank, int ranks, std::size_t count) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i)
    values[i] = T(static_cast<float>(contribution<T>(op, rank, ranks, i)));
  return values;
}

template <class T>
T rounded(double value) {
  return T(static_cast<float>(value));
}

// The exact result, from doubles, rounded to T once (kAvg: the f32 average rounded once more).
template <class T>
T reference(ReduceOp op, int ranks, std::size_t i) {
  double exact = op == ReduceOp::kProd ? 1.0 : 0.0;
  for (int r = 0; r < ranks; ++r) {
    const double v = contribution<T>(op, r, ranks, i);
    exact = op == ReduceOp::kProd ? exact * v : exact + v;
  }
  if (op == ReduceOp::kAvg)
    return rounded<T>(static_cast<float>(exact) / static_cast<float>(ranks));
  return rounded<T>(exact);
}

// What a reduction that rounds every partial result to T gives at element 0, in every order in
// which it could combine the three contributions (the zeros and ones change nothing).
template <class T>
std::vector<T> sixteen_bit_results(ReduceOp op, int ranks) {
  const auto add = [](T a, T b) { return T(static_cast<float>(a) + static_cast<float>(b)); };
  const T large = rounded<T>(Inputs<T>::kLarge);
  const T half_ulp = rounded<T>(Inputs<T>::kHalfUlp);
  const T little = rounded<T>(Inputs<T>::kLittle);
  if (op == ReduceOp::kProd) {
    const T factor = rounded<T>(Inputs<T>::kFactor);
    const T square = T(static_cast<float>(factor) * static_cast<float>(factor));
    return {T(static_cast<float>(square) * static_cast<float>(factor))};
  }
  std::vector<T> results{add(add(large, half_ulp), little), add(add(large, little), half_ulp),
                         add(large, add(half_ulp, little))};
  if (op == ReduceOp::kAvg) {
    for (T& sum : results) sum = rounded<T>(static_cast<float>(sum) / static_cast<float>(ranks));
  }
  return results;
}

constexpr ReduceOp kAccumulatingOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd};

std::vector<Algorithm> host_algorithms(Backend backend, Collective collective) {
  std::vector<Algorithm> result;
  for (Algorithm a : algorithms_for(collective)) {
    if (a != Algorithm::kNative || backend == Backend::kMpi) result.push_back(a);
  }
  return result;
}

// How many of `output`'s elements differ in bits from the reference at first + i.
template <class T>
std::size_t wrong_elements(const std::vector<T>& output, ReduceOp op, int ranks,
                           std::size_t first = 0) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < output.size(); ++i) {
    const T expected = reference<T>(op, ranks, first + i);
    if (same_bits(output[i], expected)) continue;
    if (wrong == 0) {
      UNSCOPED_INFO("element " << first + i << ": got " << static_cast<float>(output[i])
                               << ", expected " << static_cast<float>(expected));
    }
    ++wrong;
  }
  return wrong;
}

constexpr std::size_t kCount = 24;  // every rotation of the contributors, for up to 12 ranks

}  // namespace

TEMPLATE_TEST_CASE("16-bit inputs tell an f32 reduction rounded once from a 16-bit accumulation",
                   "[comm][precision]", half, bfloat16) {
  for (int ranks = 3; ranks <= 8; ++ranks) {
    for (ReduceOp op : kAccumulatingOps) {
      INFO(ranks << " ranks, " << name_of(op));
      for (const TestType wrong : sixteen_bit_results<TestType>(op, ranks))
        CHECK_FALSE(same_bits(wrong, reference<TestType>(op, ranks, 0)));
    }
  }
}

TEMPLATE_TEST_CASE("16-bit allreduce accumulates in f32 and rounds once", "[comm][precision]", half,
                   bfloat16) {
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    Communicator& comm = shared_communicator(backend);
    const int p = comm.size();
    if (p < 3) return;  // two contributions are one addition, rounded once in any precision
    for (Algorithm algorithm : host_algorithms(backend, Collective::kAllreduce)) {
      for (ReduceOp op : kAccumulatingOps) {
        INFO(name_of(backend) << " " << name_of(algorithm) << " " << name_of(op) << ", " << p
                              << " ranks");
        const std::vector<TestType> input = inputs<TestType>(op, comm.rank(), p, kCount);
        std::vector<TestType> output(kCount);
        comm.allreduce(std::span<const TestType>(input), std::span(output), op, algorithm);
        CHECK(wrong_elements(output, op, p) == 0);
      }
    }
  }
}

TEMPLATE_TEST_CASE("16-bit reduce accumulates in f32 and rounds once", "[comm][precision]", half,
                   bfloat16) {
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    Communicator& comm = shared_communicator(backend);
    const int p = comm.size();
    if (p < 3) return;
    const int root = p - 1;
    for (Algorithm algorithm : host_algorithms(backend, Collective::kReduce)) {
      for (ReduceOp op : kAccumulatingOps) {
        INFO(name_of(backend) << " " << name_of(algorithm) << " " << name_of(op) << ", " << p
                              << " ranks, root " << root);
        const std::vector<TestType> input = inputs<TestType>(op, comm.rank(), p, kCount);
        std::vector<TestType> output(kCount);
        comm.reduce(std::span<const TestType>(input), std::span(output), root, op, algorithm);
        if (comm.rank() == root) CHECK(wrong_elements(output, op, p) == 0);
      }
    }
  }
}

TEMPLATE_TEST_CASE("16-bit reduce_scatter accumulates in f32 and rounds once", "[comm][precision]",
                   half, bfloat16) {
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    Communicator& comm = shared_communicator(backend);
    const int p = comm.size();
    if (p < 3) return;
    const std::size_t block = kCount / 2;
    for (Algorithm algorithm : host_algorithms(backend, Collective::kReduceScatter)) {
      for (ReduceOp op : kAccumulatingOps) {
        INFO(name_of(backend) << " " << name_of(algorithm) << " " << name_of(op) << ", " << p
                              << " ranks");
        const auto everything = static_cast<std::size_t>(p) * block;
        const std::vector<TestType> input = inputs<TestType>(op, comm.rank(), p, everything);
        std::vector<TestType> output(block);
        comm.reduce_scatter(std::span<const TestType>(input), std::span(output), op, algorithm);
        CHECK(wrong_elements(output, op, p, static_cast<std::size_t>(comm.rank()) * block) == 0);
      }
    }
  }
}
