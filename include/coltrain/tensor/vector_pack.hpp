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

namespace coltrain::tensor {

template <class S, int N>
struct Pack {
  using type = S;
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

// The widest pack of S that divides `count` (at most the target's vector width; 1 where S has no
// vector pack).
template <class S>
constexpr int pack_lanes(std::int64_t count) {
#if COLTRAIN_MICROKERNELS
  if constexpr (std::is_same_v<S, float>) {
    int lanes = detail::microkernel::kLanes;
    while (lanes > 1 && count % lanes != 0) lanes /= 2;
    return lanes;
  }
#endif
  (void)count;
  return 1;
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

}  // namespace coltrain::tensor
