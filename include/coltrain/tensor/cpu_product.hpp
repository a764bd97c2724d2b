#pragma once
// C[m x n] (=|+=) op(A) * op(B) for the layers' own products (Linear), split across a ThreadPool
// and computed by the register-blocked kernels of cpu_microkernels.hpp: NN, NT and TN, which cover
// a linear layer's forward pass (x W^T), weight gradient (dY^T x) and input gradient (dY W). At
// MnistConvNet's and Mlp's shapes they ran 1.4-1.6x Eigen's speed on an AMD EPYC (one thread,
// AVX-512: fc1's 64 x 128 x 9216 forward 172 against 120 GFLOP/s, its 128 x 9216 x 64 weight
// gradient 194 against 141) and 1.07-1.3x on an Intel Xeon (113 against 105, 126 against 97).
// Both operands transposed, types without kernels, and builds without AVX-512 (see
// kProductKernelsBeatEigen) go to tensor::gemm.

#include <coltrain/core/thread_pool.hpp>
#include <coltrain/tensor/cpu_gemm.hpp>
#include <coltrain/tensor/cpu_microkernels.hpp>

#include <cstdint>
#include <type_traits>

namespace coltrain::tensor {

// Whether the float kernels beat Eigen at Linear's shapes. With AVX-512 they do (above); built for
// narrower vectors (CMake's default x86-64, or x86-64-v3) they ran slower at some shapes (one
// thread: the baseline build's weight gradients 29-31 against Eigen's 41-42 GFLOP/s, x86-64-v3's
// fc1 products 64-72 against 94-103), so those builds keep Eigen.
#if COLTRAIN_MICROKERNELS
inline constexpr bool kProductKernelsBeatEigen = detail::microkernel::kLanes >= 16;
#else
inline constexpr bool kProductKernelsBeatEigen = false;
#endif

// One part of the product, on the calling thread.
template <class S>
void cpu_product(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n,
                 std::int64_t k, const S* a, std::int64_t lda, const S* b, std::int64_t ldb, S* c,
                 std::int64_t ldc, bool accumulate) {
  if constexpr (std::is_same_v<S, float> && kProductKernelsBeatEigen) {
    const bool ta = trans_a == Transpose::kYes, tb = trans_b == Transpose::kYes;
    if (!ta && !tb) return gemm_nn_small_m(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
    if (!ta && tb) return gemm_nt_long_k(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
    if (ta && !tb) return gemm_tn_small_k(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  }
  gemm(trans_a, trans_b, m, n, k, S(1), a, lda, b, ldb, accumulate ? S(1) : S(0), c, ldc);
}

// The product split across the pool by split_product (cpu_gemm.hpp).
template <class S>
void parallel_cpu_product(ThreadPool& pool, Transpose trans_a, Transpose trans_b, std::int64_t m,
                          std::int64_t n, std::int64_t k, const S* a, std::int64_t lda, const S* b,
                          std::int64_t ldb, S* c, std::int64_t ldc, bool accumulate) {
  split_product(
      pool, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
      [&](std::int64_t rows, std::int64_t cols, const S* a_part, const S* b_part, S* c_part) {
        cpu_product(trans_a, trans_b, rows, cols, k, a_part, lda, b_part, ldb, c_part, ldc,
                    accumulate);
      });
}

}  // namespace coltrain::tensor
