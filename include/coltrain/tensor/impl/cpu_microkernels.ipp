// The float kernels' entry points of tensor/cpu_microkernels.hpp. Header-only builds include this
// file at the end of that header; with COLTRAIN_SEPARATE_COMPILATION only <coltrain/tensor/src.hpp>
// includes it, so the register-blocked kernels, dozens of tile shapes each, are compiled once
// instead of in every file of layers (test_layers.cpp, sanitized at -O0: 89 -> 79 s).
#pragma once

#include <coltrain/core/config.hpp>
#include <coltrain/tensor/cpu_microkernels.hpp>

#include <cstdint>

namespace coltrain::tensor {
inline namespace COLTRAIN_CPU_VECTOR_ABI {

COLTRAIN_DECL void gemm_nn_small_m(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                   std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                                   std::int64_t ldc, bool accumulate) {
#if COLTRAIN_MICROKERNELS
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return detail::zero_unless_accumulating(m, n, c, ldc, accumulate);
  detail::microkernel::gemm_nn<false>(m, n, k, a, lda, detail::microkernel::StridedRows{b, ldb}, c,
                                      ldc, accumulate);
#else
  tensor::gemm_nn_small_m<float>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
#endif
}

COLTRAIN_DECL void gemm_nn_indirect(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                    std::int64_t lda, const float* b, const std::int64_t* b_rows,
                                    float* c, std::int64_t ldc, bool accumulate) {
#if COLTRAIN_MICROKERNELS
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return detail::zero_unless_accumulating(m, n, c, ldc, accumulate);
  detail::microkernel::gemm_nn<false>(m, n, k, a, lda, detail::microkernel::IndirectRows{b, b_rows},
                                      c, ldc, accumulate);
#else
  tensor::gemm_nn_indirect<float>(m, n, k, a, lda, b, b_rows, c, ldc, accumulate);
#endif
}

COLTRAIN_DECL void gemm_tn_small_k(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                   std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                                   std::int64_t ldc, bool accumulate) {
#if COLTRAIN_MICROKERNELS
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return detail::zero_unless_accumulating(m, n, c, ldc, accumulate);
  detail::microkernel::gemm_nn<true>(m, n, k, a, lda, detail::microkernel::StridedRows{b, ldb}, c,
                                     ldc, accumulate);
#else
  tensor::gemm_tn_small_k<float>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
#endif
}

COLTRAIN_DECL void gemm_nt_long_k(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                  std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                                  std::int64_t ldc, bool accumulate) {
#if COLTRAIN_MICROKERNELS
  if (m <= 0 || n <= 0) return;
  if (k <= 0) return detail::zero_unless_accumulating(m, n, c, ldc, accumulate);
  detail::microkernel::gemm_nt(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
#else
  tensor::gemm_nt_long_k<float>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
#endif
}

}  // namespace COLTRAIN_CPU_VECTOR_ABI
}  // namespace coltrain::tensor
