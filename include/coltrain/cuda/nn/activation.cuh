#pragma once
// ReluLayer on the GPU: nn::ReLU bound to tensor::Cuda. Same results as the CPU layer, bit for
// bit (no arithmetic: NaN and -0 pass, the gradient passes where the output is positive).

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn/activation.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cstddef>
#include <string>

namespace coltrain::nn {

template <class In, class T>
class ReluLayer<In, T, tensor::Cuda> : public ParameterFreeLayer<In, In> {
 public:
  void forward(tensor::TensorView<const T, tensor::Cuda> in,
               tensor::TensorView<T, tensor::Cuda> out, Context<tensor::Cuda>& ctx) {
    cuda::relu_forward(in.data(), out.data(), in.numel(), ctx.stream());
  }

  void backward(tensor::TensorView<const T, tensor::Cuda>,
                tensor::TensorView<const T, tensor::Cuda> out,
                tensor::TensorView<const T, tensor::Cuda> grad_out,
                tensor::TensorView<T, tensor::Cuda> grad_in, Context<tensor::Cuda>& ctx) {
    if (grad_in.empty()) return;
    cuda::relu_backward(out.data(), grad_out.data(), grad_in.data(), out.numel(), ctx.stream());
  }
};

}  // namespace coltrain::nn
