#pragma once
// C[m x n] (=|+=) op(A) * op(B) for the layers' own products (Linear), split across a ThreadPool
// and computed by the register-blocked kernels of cpu_microkernels.hpp: NN, NT and TN, which cover
// a linear layer's forward pass (x W^T), weight gradient (dY^T x) and input gradient (dY W). At
// MnistConvNet's and Mlp's shapes they ran 1.4-1.6x Eigen's speed (one thread, AVX-512: fc1's
// 64 x 128 x 9216 forward 172 against 120 GFLOP/s, its 128 x 9216 x 64 weight gradient 194
// against 141). Both operands transposed, and types without kernels, go to tensor::gemm.

#include <coltrain/core/thread_pool.hpp>
#include <coltrain/tensor/cpu_gemm.hpp>
#include <coltrain/tensor/cpu_microkernels.hpp>

#include <algorithm>
#include <cstdint>

namespace coltrain::tensor {

// One part of the product, on the calling thread.
template <class S>
void cpu_product(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n,
                 std::int64_t k, const S* a, std::int64_t lda, const S* b, std::int64_t ldb, S* c,
                 std::int64_t ldc, bool accumulate) {
  const bool ta = trans_a == Transpose::kYes, tb = trans_b == Transpose::kYes;
  if (!ta && !tb) return gemm_nn_small_m(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  if (!ta && tb) return gemm_nt_long_k(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  if (ta && !tb) return gemm_tn_small_k(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  gemm(trans_a, trans_b, m, n, k, S(1), a, lda, b, ldb, accumulate ? S(1) : S(0), c, ldc);
}

// The rows of C split across the pool, or its columns where C has fewer rows than columns. Column
// shares are whole 16-float vectors, so that only the last share has a partial one, as in a call
// on one thread.
template <class S>
void parallel_cpu_product(ThreadPool& pool, Transpose trans_a, Transpose trans_b, std::int64_t m,
                          std::int64_t n, std::int64_t k, const S* a, std::int64_t lda, const S* b,
                          std::int64_t ldb, S* c, std::int64_t ldc, bool accumulate) {
  const bool ta = trans_a == Transpose::kYes, tb = trans_b == Transpose::kYes;
  if (pool.size() == 1 || 2 * m * n * k < (1 << 18)) {
    cpu_product(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
    return;
  }
  if (m >= n) {
    pool.parallel_for(m, [&](std::int64_t begin, std::int64_t end, int) {
      // Row r of op(A): row r of A, or its column r when transposed.
      const S* rows = ta ? a + begin : a + begin * lda;
      cpu_product(trans_a, trans_b, end - begin, n, k, rows, lda, b, ldb, c + begin * ldc, ldc,
                  accumulate);
    });
  } else {
    constexpr std::int64_t kBlock = 16;
    pool.parallel_for((n + kBlock - 1) / kBlock, [&](std::int64_t begin, std::int64_t end, int) {
      const std::int64_t first = begin * kBlock, last = std::min(n, end * kBlock);
      // Column j of op(B): column j of B, or its row j when transposed.
      const S* columns = tb ? b + first * ldb : b + first;
      cpu_product(trans_a, trans_b, m, last - first, k, a, lda, columns, ldb, c + first, ldc,
                  accumulate);
    });
  }
}

}  // namespace coltrain::tensor
