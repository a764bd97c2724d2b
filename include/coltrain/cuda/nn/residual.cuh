#pragma once
// The GPU side of Residual (nn/residual.hpp): the block's sum, and the sum with the final ReLU in
// the same pass. ResidualLayer finds this overload of add_tensors by argument-dependent lookup on its
// Context<Cuda>.

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn/residual.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/residual.hpp>

#include <cstdint>
#include <type_traits>

namespace coltrain::nn {

// out = a + b, or relu(a + b); out may alias a or b.
template <class T, bool Relu>
void add_tensors(Context<tensor::Cuda>& ctx, const T* a, const T* b, T* out, std::int64_t n,
                 std::bool_constant<Relu>) {
  if constexpr (Relu)
    cuda::add_relu_forward(a, b, out, n, ctx.stream());
  else
    cuda::add(a, b, out, n, ctx.stream());
}

}  // namespace coltrain::nn
