#pragma once
// FlattenLayer on the GPU: nn::Flatten bound to tensor::Cuda. Like the CPU layer it copies (the
// network gives each layer its own output tensor), here as one device-to-device copy on the
// context's stream, which a CUDA graph captures as a memcpy node.

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn/flatten.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/flatten.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace coltrain::nn {

template <class In, class T>
class FlattenLayer<In, T, tensor::Cuda> : public ParameterFreeLayer<In, Flat<In::kSize>> {
 public:
  void forward(tensor::TensorView<const T, tensor::Cuda> in,
               tensor::TensorView<T, tensor::Cuda> out, Context<tensor::Cuda>& ctx) {
    copy(in.data(), out.data(), in.numel(), ctx.stream());
  }

  void backward(tensor::TensorView<const T, tensor::Cuda>,
                tensor::TensorView<const T, tensor::Cuda>,
                tensor::TensorView<const T, tensor::Cuda> grad_out,
                tensor::TensorView<T, tensor::Cuda> grad_in, Context<tensor::Cuda>& ctx) {
    if (!grad_in.empty()) copy(grad_out.data(), grad_in.data(), grad_out.numel(), ctx.stream());
  }

 private:
  static void copy(const T* from, T* to, std::int64_t n, cudaStream_t stream) {
    if (n == 0 || from == to) return;
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(to, from, static_cast<std::size_t>(n) * sizeof(T),
                                        cudaMemcpyDeviceToDevice, stream));
  }
};

}  // namespace coltrain::nn
