#pragma once
// BatchNorm2d and BatchNormReLU2d on the GPU: the CPU layer's specialisation for tensor::Cuda, with
// its semantics (torch.nn.BatchNorm2d: biased batch variance normalises, running_var takes the
// unbiased one; evaluation normalises with the running statistics), parameter and buffer names and
// storage types. Statistics and parameter arithmetic are in float; the kernels and their passes
// over memory are described in cuda/batch_norm_kernels.cuh. Everything runs on the context's stream
// without synchronising, so a step can be captured as a CUDA graph once a first call at the largest
// batch has sized the partial-result buffers.

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn/batch_norm.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/batch_norm_kernels.cuh>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/device_copy.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace coltrain::nn {

namespace detail {
// Fills a device tensor with `value` (outside any step: synchronous, on the legacy stream). Not a
// member of the layer, so that it is compiled once per element type, not once per layer type.
template <class U>
void fill_device_tensor(tensor::Tensor<U, tensor::Cuda>& to, U value) {
  tensor::Tensor<U, tensor::Cpu> host(to.shape());
  host.fill(value);
  tensor::copy<U, tensor::Cpu, tensor::Cuda>(std::as_const(host).view(), to.view(), nullptr);
  COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(nullptr));
}
}  // namespace detail

template <double Momentum, double Eps, bool FusedRelu, class In, class T>
class BatchNorm2dLayer<Momentum, Eps, FusedRelu, In, T, tensor::Cuda> {
  static_assert(In::kRank == 3,
                "coltrain::nn::BatchNorm2d: the input must be an image, StaticShape<C, H, W>");
  static_assert(Momentum >= 0.0 && Momentum <= 1.0,
                "coltrain::nn::BatchNorm2d: momentum must lie in [0, 1]");
  static_assert(Eps > 0.0, "coltrain::nn::BatchNorm2d: eps must be positive");
  static_assert(std::is_same_v<T, float> || coltrain::detail::Float16Storage<T>,
                "coltrain::nn::BatchNorm2d on CUDA: T must be float, half or bfloat16");
  static_assert(In::kDims[0] <= 65535,
                "coltrain::nn::BatchNorm2d on CUDA: at most 65535 channels (one grid row each)");
  using Device = tensor::Cuda;
  using S = compute_t<T>;
  static constexpr std::int64_t kC = In::kDims[0];
  static constexpr std::int64_t kPlane = In::kDims[1] * In::kDims[2];

 public:
  using Input = In;
  using Output = In;
  static constexpr std::size_t kParameterCount = 2 * In::kDims[0];

  BatchNorm2dLayer()
      : weight_({kC}),
        bias_({kC}),
        running_mean_({kC}),
        running_var_({kC}),
        batches_tracked_(tensor::Shape{}),
        saved_({cuda::batch_norm::kSavedRows * kC}) {}

  // As the CPU layer: weight 1, bias 0, running mean 0, running variance 1, no batches (no draws).
  void initialize(Rng&) {
    detail::fill_device_tensor(weight_.value, detail::to_storage_value<T>(S(1)));
    detail::fill_device_tensor(bias_.value, detail::to_storage_value<T>(S(0)));
    detail::fill_device_tensor(running_mean_, S(0));
    detail::fill_device_tensor(running_var_, S(1));
    detail::fill_device_tensor(batches_tracked_, std::int64_t{0});
  }

  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    const bool training = ctx.training();
    if (training && batch * kPlane < 2)
      throw InvalidArgument(
          "BatchNorm2d: training needs more than one value per channel, got a batch of " +
          std::to_string(batch) + " samples of " + std::to_string(kPlane) + " pixels");
    if (batch == 0) return;
    if (training)
      moments_.resize({kC * cuda::batch_norm::max_partials_per_channel<kPlane>(batch, kC)});
    const cuda::batch_norm::ForwardArgs<T> args{in.data(),
                                                out.data(),
                                                batch,
                                                static_cast<int>(kC),
                                                weight_.value.data(),
                                                bias_.value.data(),
                                                running_mean_.data(),
                                                running_var_.data(),
                                                batches_tracked_.data(),
                                                saved_.data(),
                                                moments_.data(),
                                                Momentum,
                                                Eps};
    cuda::batch_norm::forward<T, kPlane, FusedRelu>(args, training, ctx.stream());
  }

  // Adds to the parameters' gradients; writes grad_in unless it is empty. The fused ReLU's mask is
  // recomputed from the input (see upstream_gradient), so `out` is not read.
  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    if (batch == 0) return;
    gradient_sums_.resize({kC * cuda::batch_norm::max_partials_per_channel<kPlane>(batch, kC)});
    const cuda::batch_norm::BackwardArgs<T> args{in.data(),
                                                 grad_out.data(),
                                                 grad_in.empty() ? nullptr : grad_in.data(),
                                                 batch,
                                                 static_cast<int>(kC),
                                                 ctx.training(),
                                                 weight_.value.data(),
                                                 weight_.grad.data(),
                                                 bias_.grad.data(),
                                                 saved_.data(),
                                                 gradient_sums_.data()};
    cuda::batch_norm::backward<T, kPlane, FusedRelu>(args, ctx.stream());
  }

  template <class F>
  void visit_parameters(F&& f, const std::string& prefix) {
    f(prefix + "weight", weight_);
    f(prefix + "bias", bias_);
  }
  template <class F>
  void visit_buffers(F&& f, const std::string& prefix) {
    f(prefix + "running_mean", running_mean_);
    f(prefix + "running_var", running_var_);
    f(prefix + "num_batches_tracked", batches_tracked_);
  }

 private:
  Parameter<T, Device> weight_;
  Parameter<T, Device> bias_;
  tensor::Tensor<S, Device> running_mean_, running_var_;
  tensor::Tensor<std::int64_t, Device> batches_tracked_;
  // Of the last forward pass, for backward: mean, 1/std, and the folded affine map's scale and
  // shift.
  tensor::Tensor<float, Device> saved_;
  tensor::Tensor<cuda::batch_norm::Moments, Device> moments_;             // per (channel, slice)
  tensor::Tensor<cuda::batch_norm::GradientSums, Device> gradient_sums_;  // per (channel, slice)
};

}  // namespace coltrain::nn
