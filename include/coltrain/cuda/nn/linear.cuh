#pragma once
// LinearLayer on the GPU: nn::Linear bound to tensor::Cuda. The three products are cuBLAS GEMMs
// on the row-major PyTorch layouts (x [N, In], W [Out, In], y [N, Out]), fp32-accumulated on
// tensor cores for 16-bit data and without TF32 for fp32 (cuda/gemm.cuh); the bias is one pass
// over y and its gradient a per-feature sum (cuda/bias.cuh). Gradients are added to (beta = 1), as
// on the CPU; nothing is allocated per call, so the passes can be captured into a CUDA graph.

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn/linear.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/bias.cuh>
#include <coltrain/cuda/gemm.cuh>
#include <coltrain/cuda/nn/initialize.cuh>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/device_copy.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace coltrain::nn {

template <std::size_t Out, bool HasBias, class In, class T>
class LinearLayer<Out, HasBias, In, T, tensor::Cuda>
    : public WeightAndBias<T, tensor::Cuda, HasBias> {
  static_assert(Out > 0, "coltrain::nn::Linear: the number of outputs must be positive");
  static_assert(In::kRank == 1,
                "coltrain::nn::Linear: the input must be flat (one axis per sample); put Flatten "
                "before Linear");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> ||
                    std::is_same_v<T, bfloat16>,
                "coltrain::nn::Linear on the GPU stores float, half or bfloat16");
  using Device = tensor::Cuda;
  static constexpr std::int64_t kIn = static_cast<std::int64_t>(In::kSize);
  static constexpr std::int64_t kOut = static_cast<std::int64_t>(Out);

 public:
  using Input = In;
  using Output = Flat<Out>;
  static constexpr std::size_t kParameterCount = Out * In::kSize + (HasBias ? Out : 0);
  static constexpr std::size_t kForwardMacs = Out * In::kSize;

  LinearLayer()
      : Parameters({kOut, kIn}, kOut),
        bias_partials_({HasBias ? cuda::bias_grad_scratch_floats(kOut) : 0}) {}

  // The same draws as the CPU layer (cuda/nn/initialize.cuh).
  void initialize(Rng& rng) {
    initialize_weight_and_bias(weight_, HasBias ? &bias_ : nullptr, kIn, rng);
  }

  // y = x W^T + b.
  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const std::int64_t batch = checked_batch(in, out, "forward");
    cuda::gemm(ctx.cublas(), cuda::Transpose::kNo, cuda::Transpose::kYes, batch, kOut, kIn, 1.0f,
               in.data(), kIn, weight_.value.data(), kIn, 0.0f, out.data(), kOut);
    if constexpr (HasBias)
      cuda::add_bias(out.data(), bias_.value.data(), {batch, kOut, 1}, false, ctx.stream());
  }

  // dW += dy^T x, db += the sum of dy over the batch, dx = dy W.
  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device> out,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    const std::int64_t batch = checked_batch(in, out, "backward");
    if (grad_out.numel() != out.numel() || (!grad_in.empty() && grad_in.numel() != in.numel()))
      throw InvalidArgument("coltrain::nn::Linear (CUDA) backward: the gradients " +
                            grad_out.shape().to_string() + " and " + grad_in.shape().to_string() +
                            " do not match the output " + out.shape().to_string() +
                            " and the input " + in.shape().to_string());
    if (batch == 0) return;
    cuda::gemm(ctx.cublas(), cuda::Transpose::kYes, cuda::Transpose::kNo, kOut, kIn, batch, 1.0f,
               grad_out.data(), kOut, in.data(), kIn, 1.0f, weight_.grad.data(), kIn);
    if constexpr (HasBias)
      cuda::add_bias_grad(grad_out.data(), {batch, kOut, 1}, bias_.grad.data(),
                          bias_partials_.data(), ctx.stream());
    if (grad_in.empty()) return;
    cuda::gemm(ctx.cublas(), cuda::Transpose::kNo, cuda::Transpose::kNo, batch, kIn, kOut, 1.0f,
               grad_out.data(), kOut, weight_.value.data(), kIn, 0.0f, grad_in.data(), kIn);
  }

 private:
  static std::int64_t checked_batch(tensor::TensorView<const T, Device> in,
                                    tensor::TensorView<const T, Device> out, const char* pass) {
    const std::int64_t batch = in.shape().rank() > 0 ? in.extent(0) : 0;
    if (in.numel() != batch * kIn || out.numel() != batch * kOut)
      throw InvalidArgument(std::string("coltrain::nn::Linear (CUDA) ") + pass + ": input " +
                            in.shape().to_string() + " and output " + out.shape().to_string() +
                            " do not fit Linear(" + std::to_string(kIn) + ", " +
                            std::to_string(kOut) + ")");
    return batch;
  }

  using Parameters = WeightAndBias<T, Device, HasBias>;
  using Parameters::bias_;
  using Parameters::weight_;
  tensor::Tensor<float, Device> bias_partials_;  // the bias gradient's per-slice sums
};

}  // namespace coltrain::nn
