// The float and double instantiations of tensor/cpu_gemm.hpp's Eigen products, for
// COLTRAIN_SEPARATE_COMPILATION alone: <coltrain/src.hpp> includes this file, and every other file
// sees them declared `extern template` and instantiates none of Eigen's GEMM.
#pragma once

#include <coltrain/core/config.hpp>
#include <coltrain/tensor/cpu_gemm.hpp>

#include <cstdint>

#if !COLTRAIN_SEPARATE_COMPILATION
#error "tensor/impl/cpu_gemm.ipp is for COLTRAIN_SEPARATE_COMPILATION's <coltrain/src.hpp> alone"
#endif

namespace coltrain::tensor {
inline namespace COLTRAIN_CPU_VECTOR_ABI {

template void gemm<float>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, float,
                          const float*, std::int64_t, const float*, std::int64_t, float, float*,
                          std::int64_t);
template void gemm<double>(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, double,
                           const double*, std::int64_t, const double*, std::int64_t, double,
                           double*, std::int64_t);

}  // namespace COLTRAIN_CPU_VECTOR_ABI
}  // namespace coltrain::tensor
