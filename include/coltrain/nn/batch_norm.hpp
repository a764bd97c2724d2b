#pragma once
// BatchNorm2d<Momentum, Eps>: per-channel batch normalisation of NCHW samples, as
// torch.nn.BatchNorm2d: in training, batch statistics normalise (biased variance) and the running
// statistics move by `Momentum` (running_var takes the unbiased variance); in evaluation the running
// statistics normalise. Parameters weight (gamma) and bias (beta); buffers running_mean, running_var
// and num_batches_tracked, with PyTorch's names.
//
// BatchNormReLU2d is BatchNorm2d followed by ReLU in one pass over the data each way (forward and
// backward), with the BatchNorm's parameter names: the two separate layers would each read and
// write the whole activation once more, and at these sizes the passes are bound by memory.

#include <coltrain/core/config.hpp>
#include <coltrain/nn/compute_precision.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace coltrain::nn {

template <double Momentum, double Eps, bool FusedRelu, class In, class T, class Device>
class BatchNorm2dLayer {
  static_assert(In::kRank == 3, "coltrain::nn::BatchNorm2d: the input must be an image, StaticShape<C, H, W>");
  static_assert(Momentum >= 0.0 && Momentum <= 1.0, "coltrain::nn::BatchNorm2d: momentum must lie in [0, 1]");
  static_assert(Eps > 0.0, "coltrain::nn::BatchNorm2d: eps must be positive");
  using S = compute_t<T>;
  static constexpr std::int64_t kC = In::kDims[0];
  static constexpr std::int64_t kPlane = In::kDims[1] * In::kDims[2];

 public:
  using Input = In;
  using Output = In;
  static constexpr std::size_t kParameterCount = 2 * In::kDims[0];

  BatchNorm2dLayer()
      : weight_({kC}), bias_({kC}), running_mean_({kC}), running_var_({kC}), batches_tracked_(tensor::Shape{}),
        mean_({kC}), inv_std_({kC}) {}

  void initialize(Rng&) {
    for (std::int64_t c = 0; c < kC; ++c) {
      weight_.value.data()[c] = detail::to_storage_value<T>(S(1));
      bias_.value.data()[c] = detail::to_storage_value<T>(S(0));
      running_mean_.data()[c] = S(0);
      running_var_.data()[c] = S(1);
    }
    batches_tracked_.data()[0] = 0;
  }

  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    const bool training = ctx.training();
    if (training && batch * kPlane < 2)
      throw InvalidArgument("BatchNorm2d: training needs more than one value per channel, got a batch of " +
                            std::to_string(batch) + " samples of " + std::to_string(kPlane) + " pixels");
    const T* x = in.data();
    T* y = out.data();
    const double count = static_cast<double>(batch * kPlane);
    for_each_channel(ctx, batch, [&](std::int64_t c) {
      double mean, var;
      if (training) {
        // One pass: sums of (x - shift) and its square, shifted by one of the channel's values so
        // that the variance does not come from the difference of two large numbers.
        const S shift = detail::to_compute_value<S>(x[c * kPlane]);
        double sum = 0, squares = 0;
        for (std::int64_t b = 0; b < batch; ++b) {
          const T* plane = x + (b * kC + c) * kPlane;
          const auto [s1, s2] = detail::lane_sum2<S>(kPlane, [plane, shift](std::int64_t i) {
            const S d = detail::to_compute_value<S>(plane[i]) - shift;
            return std::pair<S, S>(d, d * d);
          });
          sum += s1;
          squares += s2;
        }
        const double shifted_mean = sum / count;
        mean = shift + shifted_mean;
        var = std::max(0.0, squares / count - shifted_mean * shifted_mean);
        S& rm = running_mean_.data()[c];
        S& rv = running_var_.data()[c];
        rm = static_cast<S>((1.0 - Momentum) * rm + Momentum * mean);
        rv = static_cast<S>((1.0 - Momentum) * rv + Momentum * var * count / (count - 1.0));
      } else {
        mean = running_mean_.data()[c];
        var = running_var_.data()[c];
      }
      const S inv_std = static_cast<S>(1.0 / std::sqrt(var + Eps));
      mean_.data()[c] = static_cast<S>(mean);
      inv_std_.data()[c] = inv_std;
      const S scale = detail::to_compute_value<S>(weight_.value.data()[c]) * inv_std;
      const S shift = detail::to_compute_value<S>(bias_.value.data()[c]) - static_cast<S>(mean) * scale;
      for (std::int64_t b = 0; b < batch; ++b) {
        const T* src = x + (b * kC + c) * kPlane;
        T* dst = y + (b * kC + c) * kPlane;
        for (std::int64_t i = 0; i < kPlane; ++i) {
          const S v = detail::to_compute_value<S>(src[i]) * scale + shift;
          dst[i] = detail::to_storage_value<T>(FusedRelu && v < S(0) ? S(0) : v);  // NaN passes
        }
      }
    });
    if (training) batches_tracked_.data()[0] += 1;
  }

  // Training mode: the batch statistics depend on the input, which adds the two mean terms;
  // evaluation mode: a fixed affine map.
  // With the fused ReLU, the gradient reaching the normalisation is dy where the output is positive.
  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device> out,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    const bool training = ctx.training();
    const T* x = in.data();
    const T* y = out.data();
    const T* dy = grad_out.data();
    T* dx = grad_in.empty() ? nullptr : grad_in.data();
    weight_delta_.resize({kC});
    bias_delta_.resize({kC});
    const double count = static_cast<double>(batch * kPlane);
    for_each_channel(ctx, batch, [&](std::int64_t c) {
      const S mean = mean_.data()[c];
      const S inv_std = inv_std_.data()[c];
      double sum_dy = 0, sum_dy_xhat = 0;
      for (std::int64_t b = 0; b < batch; ++b) {
        const T* xs = x + (b * kC + c) * kPlane;
        const T* ys = y + (b * kC + c) * kPlane;
        const T* gs = dy + (b * kC + c) * kPlane;
        // sum of dy and of dy * (x - mean), in one pass.
        const auto [a, d] = detail::lane_sum2<S>(kPlane, [xs, ys, gs, mean](std::int64_t i) {
          const S g = upstream_gradient(ys, gs, i);
          return std::pair<S, S>(g, g * (detail::to_compute_value<S>(xs[i]) - mean));
        });
        sum_dy += a;
        sum_dy_xhat += d;
      }
      sum_dy_xhat *= inv_std;
      weight_delta_.data()[c] = static_cast<S>(sum_dy_xhat);
      bias_delta_.data()[c] = static_cast<S>(sum_dy);
      if (!dx) return;
      const S gamma = detail::to_compute_value<S>(weight_.value.data()[c]);
      const S k = gamma * inv_std;
      const S mean_dy = training ? static_cast<S>(sum_dy / count) : S(0);
      const S mean_dy_xhat = training ? static_cast<S>(sum_dy_xhat / count) : S(0);
      for (std::int64_t b = 0; b < batch; ++b) {
        const T* xs = x + (b * kC + c) * kPlane;
        const T* ys = y + (b * kC + c) * kPlane;
        const T* gs = dy + (b * kC + c) * kPlane;
        T* ds = dx + (b * kC + c) * kPlane;
        for (std::int64_t i = 0; i < kPlane; ++i) {
          const S xhat = (detail::to_compute_value<S>(xs[i]) - mean) * inv_std;
          ds[i] = detail::to_storage_value<T>(k * (upstream_gradient(ys, gs, i) - mean_dy - xhat * mean_dy_xhat));
        }
      }
    });
    detail::accumulate<T, S>(weight_.grad.view(), weight_delta_.view());
    detail::accumulate<T, S>(bias_.grad.view(), bias_delta_.view());
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
  // d(loss)/d(normalised value): dy, masked by the fused ReLU (which passes where y > 0).
  static S upstream_gradient(const T* y, const T* dy, std::int64_t i) {
    const S g = detail::to_compute_value<S>(dy[i]);
    if constexpr (FusedRelu) return detail::to_compute_value<S>(y[i]) > S(0) ? g : S(0);
    return g;
  }

  template <class F>
  static void for_each_channel(Context<Device>& ctx, std::int64_t batch, F&& f) {
    detail::parallel_range(ctx, kC, batch * kC * kPlane, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t c = begin; c < end; ++c) f(c);
    });
  }
  Parameter<T, Device> weight_;
  Parameter<T, Device> bias_;
  tensor::Tensor<S, Device> running_mean_, running_var_;
  tensor::Tensor<std::int64_t, Device> batches_tracked_;
  tensor::Tensor<S, Device> mean_, inv_std_;  // of the last forward, for backward
  tensor::Tensor<S, Device> weight_delta_, bias_delta_;
};

// torch.nn.BatchNorm2d(C, eps=Eps, momentum=Momentum); C comes from the input shape.
template <double Momentum = 0.1, double Eps = 1e-5>
struct BatchNorm2d {
  template <class In, class T, class Device>
  using Bind = BatchNorm2dLayer<Momentum, Eps, false, In, T, Device>;
};

// torch.nn.BatchNorm2d(C, eps=Eps, momentum=Momentum) then torch.relu, fused; named as the BatchNorm.
template <double Momentum = 0.1, double Eps = 1e-5>
struct BatchNormReLU2d {
  template <class In, class T, class Device>
  using Bind = BatchNorm2dLayer<Momentum, Eps, true, In, T, Device>;
};

}  // namespace coltrain::nn
