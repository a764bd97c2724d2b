#pragma once
// Row-major GEMMs through cuBLAS: C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, for
// float, half and bfloat16 matrices, accumulated in float. cuBLAS is column-major; a row-major
// matrix is its transpose there, so C^T = op(B)^T op(A)^T is what cuBLAS is asked for, with the
// operands swapped and the same transpose flags.
//
// Precision: 16-bit inputs run on tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F). fp32
// inputs use CUBLAS_COMPUTE_32F_PEDANTIC, which keeps every product in fp32 whatever math mode the
// handle or NVIDIA_TF32_OVERRIDE asks for, so that fp32 results match the CPU path to about 1e-6;
// GemmOptions::allow_tf32 trades that for TF32 tensor cores (10-bit mantissas, about 1e-3).

#if !defined(__CUDACC__)
#error "coltrain/cuda/gemm.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <cublas_v2.h>
#include <library_types.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

namespace coltrain::cuda {

enum class Transpose : bool { kNo = false, kYes = true };

struct GemmOptions {
  // fp32 only: let cuBLAS round the inputs to TF32 on tensor cores (several times faster, about
  // 1e-3 relative error). 16-bit inputs always use tensor cores.
  bool allow_tf32 = false;
};

// The CUDA data type of a coltrain element type stored on the device.
template <class T>
constexpr cudaDataType_t cuda_data_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> ||
                    std::is_same_v<T, bfloat16>,
                "coltrain::cuda: device layers store float, half or bfloat16");
  if constexpr (std::is_same_v<T, float>)
    return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, half>)
    return CUDA_R_16F;
  else
    return CUDA_R_16BF;
}

template <class T>
constexpr cublasComputeType_t gemm_compute_type(GemmOptions options) {
  if constexpr (std::is_same_v<T, float>)
    return options.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC;
  else
    return CUBLAS_COMPUTE_32F;
}

namespace detail {

inline int gemm_int(std::int64_t value, const char* what) {
  if (value < 0 || value > INT_MAX)
    throw InvalidArgument(std::string("coltrain::cuda::gemm: ") + what + " = " +
                          std::to_string(value) + " is outside cuBLAS's int range");
  return static_cast<int>(value);
}

inline cublasOperation_t cublas_operation(Transpose t) {
  return t == Transpose::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
}

}  // namespace detail

// C[m, n] = alpha * op(A) * op(B) + beta * C, all row-major; lda, ldb, ldc are row strides
// (op(A) is A [m, k] with lda >= k, or A^T with A [k, m], lda >= m). Queued on the handle's stream.
template <class T>
void gemm(cublasHandle_t handle, Transpose trans_a, Transpose trans_b, std::int64_t m,
          std::int64_t n, std::int64_t k, float alpha, const T* a, std::int64_t lda, const T* b,
          std::int64_t ldb, float beta, T* c, std::int64_t ldc, GemmOptions options = {}) {
  if (m == 0 || n == 0) return;
  constexpr cudaDataType_t type = cuda_data_type<T>();
  COLTRAIN_CHECK_CUBLAS(cublasGemmEx(
      handle, detail::cublas_operation(trans_b), detail::cublas_operation(trans_a),
      detail::gemm_int(n, "n"), detail::gemm_int(m, "m"), detail::gemm_int(k, "k"), &alpha, b,
      type, detail::gemm_int(ldb, "ldb"), a, type, detail::gemm_int(lda, "lda"), &beta, c, type,
      detail::gemm_int(ldc, "ldc"), gemm_compute_type<T>(options), CUBLAS_GEMM_DEFAULT));
}

}  // namespace coltrain::cuda
