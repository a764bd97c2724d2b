#pragma once
// Pack<S, N>: N consecutive values handled as one vector, for the elementwise loops that g++ does
// not vectorise well by itself (reductions into several sums, pairs returned from lambdas,
// shuffles). A GCC/Clang vector of N floats where the compiler has vector extensions (as the GEMM
// kernels of cpu_microkernels.hpp), else, and for N = 1 or other types, the scalar S itself: one
// source then serves both, with the same arithmetic operators.

#include <coltrain/core/config.hpp>
#include <coltrain/tensor/cpu_microkernels.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace coltrain::tensor {

template <class S, int N>
struct Pack {
  using type = S;
  using Indices = std::int32_t;  // int32 lanes as many as the pack's: lane indices, compare masks
};
#if COLTRAIN_MICROKERNELS
template <int N>
requires(N > 1) struct Pack<float, N> {
  typedef float type __attribute__((vector_size(N * sizeof(float))));
  typedef std::int32_t Indices __attribute__((vector_size(N * sizeof(float))));
};
#endif

template <class S, int N>
using pack_t = typename Pack<S, N>::type;
template <class S, int N>
using index_pack_t = typename Pack<S, N>::Indices;

// The widest pack of S the target has registers for (1 where S has no vector pack).
template <class S>
constexpr int widest_pack_lanes() {
#if COLTRAIN_MICROKERNELS
  if constexpr (std::is_same_v<S, float>) return detail::microkernel::kLanes;
#endif
  return 1;
}

// The widest pack of S that divides `count` (at most the target's vector width; 1 where S has no
// vector pack).
template <class S>
constexpr int pack_lanes(std::int64_t count) {
  int lanes = widest_pack_lanes<S>();
  while (lanes > 1 && count % lanes != 0) lanes /= 2;
  return lanes;
}

// Unaligned loads and stores: a memcpy of a vector compiles to one move.
template <class P, class S>
COLTRAIN_FORCE_INLINE P load_pack(const S* p) {
  P v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class P, class S>
COLTRAIN_FORCE_INLINE void store_pack(S* p, P v) {
  std::memcpy(p, &v, sizeof v);
}

// max(v, 0) lane by lane, NaN passing as torch.relu does.
template <class P>
COLTRAIN_FORCE_INLINE P relu_pack(P v) {
  return v < P{} ? P{} : v;
}

// sums[l] += lane l of v, in double: packs of float partial sums folded into exact-enough totals.
template <int N, class P>
COLTRAIN_FORCE_INLINE void add_lanes(double* COLTRAIN_RESTRICT sums, P v) {
  if constexpr (N == 1) {
    sums[0] += static_cast<double>(v);
  } else {
    float lanes[N];
    std::memcpy(lanes, &v, sizeof v);
    for (int l = 0; l < N; ++l) sums[l] += static_cast<double>(lanes[l]);
  }
}

// The 2N values low ++ high as their even and odd elements.
template <class S, int N, class P = pack_t<S, N>>
COLTRAIN_FORCE_INLINE void deinterleave(P low, P high, P& even, P& odd) {
  if constexpr (N == 1) {
    even = low;
    odd = high;
  } else {
    [&]<int... L>(std::integer_sequence<int, L...>) {
#if defined(__clang__)
      even = __builtin_shufflevector(low, high, (2 * L)...);
      odd = __builtin_shufflevector(low, high, (2 * L + 1)...);
#else
      using Indices = typename Pack<S, N>::Indices;
      even = __builtin_shuffle(low, high, Indices{(2 * L)...});
      odd = __builtin_shuffle(low, high, Indices{(2 * L + 1)...});
#endif
    }
    (std::make_integer_sequence<int, N>{});
  }
}

// The inverse: low ++ high = even[0], odd[0], even[1], odd[1], ...
template <class S, int N, class P = pack_t<S, N>>
COLTRAIN_FORCE_INLINE void interleave(P even, P odd, P& low, P& high) {
  if constexpr (N == 1) {
    low = even;
    high = odd;
  } else {
    // Lane o of the result is lane o/2 of even (o even) or of odd (o odd), from the low half of
    // the inputs for the first vector and the high half for the second.
    [&]<int... L>(std::integer_sequence<int, L...>) {
#if defined(__clang__)
      low = __builtin_shufflevector(even, odd, (L / 2 + (L % 2) * N)...);
      high = __builtin_shufflevector(even, odd, (L / 2 + N / 2 + (L % 2) * N)...);
#else
      using Indices = typename Pack<S, N>::Indices;
      low = __builtin_shuffle(even, odd, Indices{(L / 2 + (L % 2) * N)...});
      high = __builtin_shuffle(even, odd, Indices{(L / 2 + N / 2 + (L % 2) * N)...});
#endif
    }
    (std::make_integer_sequence<int, N>{});
  }
}

}  // namespace coltrain::tensor
