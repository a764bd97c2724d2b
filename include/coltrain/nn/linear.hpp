#pragma once
// Linear<Out>: y = x W^T + b on flat samples, W stored [Out, In] as torch.nn.Linear stores it.

#include <coltrain/core/config.hpp>
#include <coltrain/nn/compute_precision.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/cpu_product.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace coltrain::nn {

template <std::size_t Out, bool HasBias, class In, class T, class Device>
class LinearLayer : public WeightAndBias<T, Device, HasBias> {
  static_assert(Out > 0, "coltrain::nn::Linear: the number of outputs must be positive");
  static_assert(In::kRank == 1,
                "coltrain::nn::Linear: the input must be flat (one axis per sample); put Flatten "
                "before Linear");
  using S = compute_t<T>;
  static constexpr std::int64_t kIn = static_cast<std::int64_t>(In::kSize);
  static constexpr std::int64_t kOut = static_cast<std::int64_t>(Out);

 public:
  using Input = In;
  using Output = Flat<Out>;
  static constexpr std::size_t kParameterCount = Out * In::kSize + (HasBias ? Out : 0);
  static constexpr std::size_t kForwardMacs = Out * In::kSize;

  LinearLayer() : Parameters({kOut, kIn}, kOut) {}

  void initialize(Rng& rng) {
    kaiming_uniform_default(weight_.value.span(), kIn, rng);
    if constexpr (HasBias) bias_uniform_default(bias_.value.span(), kIn, rng);
  }

  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    auto x = detail::compute_view<T>(in, in_scratch_);
    auto w = detail::compute_view<T>(weight_.value.view(), weight_scratch_);
    auto y = detail::compute_target<T>(out, out_scratch_);
    tensor::parallel_cpu_product(ctx.pool(), tensor::Transpose::kNo, tensor::Transpose::kYes, batch,
                                 kOut, kIn, x.data(), kIn, w.data(), kIn, y.data(), kOut, false);
    if constexpr (HasBias) {
      auto b = detail::compute_view<T>(bias_.value.view(), bias_scratch_);
      S* ys = y.data();
      const S* bs = b.data();
      for (std::int64_t r = 0; r < batch; ++r)
        for (std::int64_t j = 0; j < kOut; ++j) ys[r * kOut + j] += bs[j];
    }
    detail::store_result<T, S>(y, out);
  }

  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    auto x = detail::compute_view<T>(in, in_scratch_);
    auto dy = detail::compute_view<T>(grad_out, grad_out_scratch_);
    // dW += dy^T x: a [Out, In] product summed over the batch.
    if constexpr (std::is_same_v<S, T>) {
      tensor::parallel_cpu_product(ctx.pool(), tensor::Transpose::kYes, tensor::Transpose::kNo,
                                   kOut, kIn, batch, dy.data(), kOut, x.data(), kIn,
                                   weight_.grad.data(), kIn, true);
    } else {
      weight_delta_.resize(weight_.grad.shape());
      tensor::parallel_cpu_product(ctx.pool(), tensor::Transpose::kYes, tensor::Transpose::kNo,
                                   kOut, kIn, batch, dy.data(), kOut, x.data(), kIn,
                                   weight_delta_.data(), kIn, false);
      detail::accumulate<T, S>(weight_.grad.view(), weight_delta_.view());
    }
    if constexpr (HasBias) {
      bias_delta_.resize(bias_.grad.shape());
      S* db = bias_delta_.data();
      const S* g = dy.data();
      for (std::int64_t j = 0; j < kOut; ++j) db[j] = S(0);
      for (std::int64_t r = 0; r < batch; ++r)
        for (std::int64_t j = 0; j < kOut; ++j) db[j] += g[r * kOut + j];
      detail::accumulate<T, S>(bias_.grad.view(), bias_delta_.view());
    }
    if (!grad_in.empty()) {
      auto w = detail::compute_view<T>(weight_.value.view(), weight_scratch_);
      auto dx = detail::compute_target<T>(grad_in, grad_in_scratch_);
      tensor::parallel_cpu_product(ctx.pool(), tensor::Transpose::kNo, tensor::Transpose::kNo,
                                   batch, kIn, kOut, dy.data(), kOut, w.data(), kIn, dx.data(), kIn,
                                   false);
      detail::store_result<T, S>(dx, grad_in);
    }
  }

 private:
  using Parameters = WeightAndBias<T, Device, HasBias>;
  using Parameters::bias_;
  using Parameters::weight_;
  tensor::Tensor<S, Device> in_scratch_, weight_scratch_, bias_scratch_, out_scratch_;
  tensor::Tensor<S, Device> grad_out_scratch_, grad_in_scratch_, weight_delta_, bias_delta_;
};

// A fully connected layer with `Out` outputs (torch.nn.Linear(in, Out, bias=HasBias)).
template <std::size_t Out, bool HasBias = true>
struct Linear {
  template <class In, class T, class Device>
  using Bind = LinearLayer<Out, HasBias, In, T, Device>;
};

}  // namespace coltrain::nn
