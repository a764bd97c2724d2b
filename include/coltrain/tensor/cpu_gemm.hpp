#pragma once
// Matrix products for the CPU kernels, through Eigen, on row-major arrays with leading dimensions
// (the BLAS convention, so that callers can multiply sub-blocks in place).
//
// Eigen runs single-threaded here (coltrain does not ask for OpenMP); parallel callers split the
// work across a ThreadPool themselves, which keeps the bare `g++ -I include` build threaded too.
//
// nvcc's device pass sees the declarations alone: it compiles no host code, and instantiating
// Eigen's products there only costs compile time.

#include <coltrain/core/config.hpp>
#include <coltrain/core/thread_pool.hpp>

#if !COLTRAIN_DEVICE_CODE
#include <coltrain/tensor/eigen.hpp>
#endif

#include <cstdint>

namespace coltrain::tensor {

enum class Transpose : bool { kNo = false, kYes = true };

// C[M x N] = alpha * op(A) * op(B) + beta * C, with op(A) M x K and op(B) K x N; beta is 0 or 1
// (overwrite or accumulate), which is all the layers need.
template <class S>
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          S alpha, const S* a, std::int64_t lda, const S* b, std::int64_t ldb, S beta, S* c,
          std::int64_t ldc);

// The same product with the rows of C split across the pool (or its columns, when C has fewer rows
// than the pool has threads times a useful block).
template <class S>
void parallel_gemm(ThreadPool& pool, Transpose trans_a, Transpose trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, S alpha, const S* a, std::int64_t lda,
                   const S* b, std::int64_t ldb, S beta, S* c, std::int64_t ldc);

#if !COLTRAIN_DEVICE_CODE

namespace detail {

template <class S>
using RowMajorMap = Eigen::Map<const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
                               Eigen::Unaligned, Eigen::OuterStride<>>;
template <class S>
using MutableRowMajorMap = Eigen::Map<Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
                                      Eigen::Unaligned, Eigen::OuterStride<>>;

// op(A) for a stored matrix of `rows` x `cols` (before the transpose).
template <class S>
RowMajorMap<S> map(const S* data, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return RowMajorMap<S>(data, rows, cols, Eigen::OuterStride<>(ld));
}

}  // namespace detail

template <class S>
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k, S alpha,
          const S* a, std::int64_t lda, const S* b, std::int64_t ldb, S beta, S* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  detail::MutableRowMajorMap<S> out(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    if (beta == S(0)) out.setZero();
    return;
  }
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  auto lhs = detail::map(a, ta ? k : m, ta ? m : k, lda);
  auto rhs = detail::map(b, tb ? n : k, tb ? k : n, ldb);
  // Four spelled-out cases: Eigen picks its GEMM kernel from the expression type.
  auto assign = [&](const auto& product) {
    if (beta == S(0))
      out.noalias() = alpha * product;
    else
      out.noalias() += alpha * product;
  };
  if (!ta && !tb) assign(lhs * rhs);
  if (!ta && tb) assign(lhs * rhs.transpose());
  if (ta && !tb) assign(lhs.transpose() * rhs);
  if (ta && tb) assign(lhs.transpose() * rhs.transpose());
}

template <class S>
void parallel_gemm(ThreadPool& pool, Transpose trans_a, Transpose trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, S alpha, const S* a, std::int64_t lda, const S* b,
                   std::int64_t ldb, S beta, S* c, std::int64_t ldc) {
  const bool ta = trans_a == Transpose::kYes;
  const bool tb = trans_b == Transpose::kYes;
  if (pool.size() == 1 || 2 * m * n * k < (1 << 18)) {
    gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (m >= n) {
    pool.parallel_for(m, [&](std::int64_t begin, std::int64_t end, int) {
      // Rows of op(A): row r starts at a + r*lda untransposed, at column r transposed.
      const S* a_rows = ta ? a + begin : a + begin * lda;
      gemm(trans_a, trans_b, end - begin, n, k, alpha, a_rows, lda, b, ldb, beta, c + begin * ldc, ldc);
    });
  } else {
    pool.parallel_for(n, [&](std::int64_t begin, std::int64_t end, int) {
      const S* b_cols = tb ? b + begin * ldb : b + begin;
      gemm(trans_a, trans_b, m, end - begin, k, alpha, a, lda, b_cols, ldb, beta, c + begin, ldc);
    });
  }
}
#endif  // !COLTRAIN_DEVICE_CODE

}  // namespace coltrain::tensor
