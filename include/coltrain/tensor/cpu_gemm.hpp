#pragma once
// Matrix products for the CPU kernels, through Eigen, on row-major arrays with leading dimensions
// (the BLAS convention, so that callers can multiply sub-blocks in place).
//
// Eigen runs single-threaded here (coltrain does not ask for OpenMP); parallel callers split the
// work across a ThreadPool themselves, which keeps the bare `g++ -I include` build threaded too.
//
// nvcc's device pass sees the declarations alone: it compiles no host code, and instantiating
// Eigen's products there only costs compile time. Under COLTRAIN_SEPARATE_COMPILATION the float
// and double products are instantiated once, by <coltrain/tensor/src.hpp> (impl/cpu_gemm.ipp):
// Eigen's GEMM was a fifth of the compile time of a file of layers' tests (test_layers.cpp,
// sanitized at -O0, the float kernels already out of it: 79 -> 61 s).

#include <coltrain/core/config.hpp>
#include <coltrain/core/thread_pool.hpp>
#include <coltrain/tensor/cpu_vector_width.hpp>

#if !COLTRAIN_DEVICE_CODE
#include <coltrain/tensor/eigen.hpp>
#endif

#include <algorithm>
#include <cstdint>

namespace coltrain::tensor {

enum class Transpose : bool { kNo = false, kYes = true };

// C[M x N] = alpha * op(A) * op(B) + beta * C, with op(A) M x K and op(B) K x N; beta is 0 or 1
// (overwrite or accumulate), which is all the layers need.
inline namespace COLTRAIN_CPU_VECTOR_ABI {
template <class S>
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          S alpha, const S* a, std::int64_t lda, const S* b, std::int64_t ldb, S beta, S* c,
          std::int64_t ldc);
#if COLTRAIN_SEPARATE_COMPILATION
extern template void gemm<float>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t,
                                 float, const float*, std::int64_t, const float*, std::int64_t,
                                 float, float*, std::int64_t);
extern template void gemm<double>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t,
                                  double, const double*, std::int64_t, const double*, std::int64_t,
                                  double, double*, std::int64_t);
#endif
}  // namespace COLTRAIN_CPU_VECTOR_ABI

// Splits C[m x n] = op(A) * op(B) across the pool and calls part(rows, cols, a, b, c) for each
// share, with a, b and c pointing at the share's first row of op(A), column of op(B) and element
// of C (leading dimensions unchanged). Rows are split where C has at least as many rows as
// columns, else columns, in whole 16-float vectors so that only the last share has a partial one,
// as a call on one thread has. Products under 2^18 flops run on the calling thread: below that,
// waking the pool costs more than it saves.
template <class S, class Part>
void split_product(ThreadPool& pool, Transpose trans_a, Transpose trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, const S* a, std::int64_t lda, const S* b,
                   std::int64_t ldb, S* c, std::int64_t ldc, Part&& part) {
  if (pool.size() == 1 || 2 * m * n * k < (1 << 18)) {
    part(m, n, a, b, c);
    return;
  }
  if (m >= n) {
    pool.parallel_for(m, [&](std::int64_t begin, std::int64_t end, int) {
      // Row r of op(A): row r of A, or its column r when transposed.
      const S* rows = trans_a == Transpose::kYes ? a + begin : a + begin * lda;
      part(end - begin, n, rows, b, c + begin * ldc);
    });
  } else {
    constexpr std::int64_t kBlock = 16;
    pool.parallel_for((n + kBlock - 1) / kBlock, [&](std::int64_t begin, std::int64_t end, int) {
      const std::int64_t first = begin * kBlock, last = std::min(n, end * kBlock);
      // Column j of op(B): column j of B, or its row j when transposed.
      const S* columns = trans_b == Transpose::kYes ? b + first * ldb : b + first;
      part(m, last - first, a, columns, c + first);
    });
  }
}

// The same product split across the pool by split_product.
template <class S>
void parallel_gemm(ThreadPool& pool, Transpose trans_a, Transpose trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, S alpha, const S* a, std::int64_t lda,
                   const S* b, std::int64_t ldb, S beta, S* c, std::int64_t ldc);

#if !COLTRAIN_DEVICE_CODE

namespace detail {

template <class S>
using RowMajorMap =
    Eigen::Map<const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
               Eigen::Unaligned, Eigen::OuterStride<>>;
template <class S>
using MutableRowMajorMap =
    Eigen::Map<Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned,
               Eigen::OuterStride<>>;

// op(A) for a stored matrix of `rows` x `cols` (before the transpose).
template <class S>
RowMajorMap<S> map(const S* data, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return RowMajorMap<S>(data, rows, cols, Eigen::OuterStride<>(ld));
}

}  // namespace detail

inline namespace COLTRAIN_CPU_VECTOR_ABI {
template <class S>
void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          S alpha, const S* a, std::int64_t lda, const S* b, std::int64_t ldb, S beta, S* c,
          std::int64_t ldc) {
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
}  // namespace COLTRAIN_CPU_VECTOR_ABI

template <class S>
void parallel_gemm(ThreadPool& pool, Transpose trans_a, Transpose trans_b, std::int64_t m,
                   std::int64_t n, std::int64_t k, S alpha, const S* a, std::int64_t lda,
                   const S* b, std::int64_t ldb, S beta, S* c, std::int64_t ldc) {
  split_product(
      pool, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
      [&](std::int64_t rows, std::int64_t cols, const S* a_part, const S* b_part, S* c_part) {
        gemm(trans_a, trans_b, rows, cols, k, alpha, a_part, lda, b_part, ldb, beta, c_part, ldc);
      });
}
#endif  // !COLTRAIN_DEVICE_CODE

}  // namespace coltrain::tensor
