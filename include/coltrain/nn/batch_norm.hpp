#pragma once
// BatchNorm2d<Momentum, Eps>: per-channel batch normalisation of NCHW samples, as
// torch.nn.BatchNorm2d: in training, batch statistics normalise (biased variance) and the running
// statistics move by `Momentum` (running_var takes the unbiased variance); in evaluation the
// running statistics normalise. Parameters weight (gamma) and bias (beta); buffers running_mean,
// running_var and num_batches_tracked, with PyTorch's names.
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
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::nn {

template <double Momentum, double Eps, bool FusedRelu, class In, class T, class Device>
class BatchNorm2dLayer {
  static_assert(In::kRank == 3,
                "coltrain::nn::BatchNorm2d: the input must be an image, StaticShape<C, H, W>");
  static_assert(Momentum >= 0.0 && Momentum <= 1.0,
                "coltrain::nn::BatchNorm2d: momentum must lie in [0, 1]");
  static_assert(Eps > 0.0, "coltrain::nn::BatchNorm2d: eps must be positive");
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
        mean_({kC}),
        inv_std_({kC}),
        scale_({kC}),
        shift_({kC}),
        gradient_means_(2 * kC) {}

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
      throw InvalidArgument(
          "BatchNorm2d: training needs more than one value per channel, got a batch of " +
          std::to_string(batch) + " samples of " + std::to_string(kPlane) + " pixels");
    const T* x = in.data();
    T* y = out.data();
    const double count = static_cast<double>(batch * kPlane);
    if (training) {
      // One pass for both sums, of (x - shift) and its square, shifted by one of the channel's
      // values so that the variance does not come from the difference of two large numbers.
      const int parts =
          for_each_image_range(ctx, batch, [&](std::int64_t begin, std::int64_t end, int part) {
            double* sums = partial_sums(part);
            for (std::int64_t b = begin; b < end; ++b)
              for (std::int64_t c = 0; c < kC; ++c) {
                const T* plane = x + (b * kC + c) * kPlane;
                const S shift = detail::to_compute_value<S>(x[c * kPlane]);
                const auto [s1, s2] = detail::lane_sum2<S>(kPlane, [plane, shift](std::int64_t i) {
                  const S d = detail::to_compute_value<S>(plane[i]) - shift;
                  return std::pair<S, S>(d, d * d);
                });
                sums[2 * c] += s1;
                sums[2 * c + 1] += s2;
              }
          });
      for (std::int64_t c = 0; c < kC; ++c) {
        double sum = 0, squares = 0;
        for (int part = 0; part < parts; ++part) {  // in a fixed order: reproducible
          sum += partial_sums(part)[2 * c];
          squares += partial_sums(part)[2 * c + 1];
        }
        const double shifted_mean = sum / count;
        const double mean = detail::to_compute_value<S>(x[c * kPlane]) + shifted_mean;
        const double var = std::max(0.0, squares / count - shifted_mean * shifted_mean);
        S& rm = running_mean_.data()[c];
        S& rv = running_var_.data()[c];
        rm = static_cast<S>((1.0 - Momentum) * rm + Momentum * mean);
        rv = static_cast<S>((1.0 - Momentum) * rv + Momentum * var * count / (count - 1.0));
        set_statistics(c, mean, var);
      }
      batches_tracked_.data()[0] += 1;
    } else {
      for (std::int64_t c = 0; c < kC; ++c)
        set_statistics(c, running_mean_.data()[c], running_var_.data()[c]);
    }
    for_each_image_range(ctx, batch, [&](std::int64_t begin, std::int64_t end, int) {
      for (std::int64_t b = begin; b < end; ++b)
        for (std::int64_t c = 0; c < kC; ++c) {
          const T* src = x + (b * kC + c) * kPlane;
          T* dst = y + (b * kC + c) * kPlane;
          const S scale = scale_.data()[c], shift = shift_.data()[c];
          for (std::int64_t i = 0; i < kPlane; ++i) {
            const S v = normalized(src[i], scale, shift);
            dst[i] = detail::to_storage_value<T>(FusedRelu && v < S(0) ? S(0) : v);  // NaN passes
          }
        }
    });
  }

  // Training mode: the batch statistics depend on the input, which adds the two mean terms;
  // evaluation mode: a fixed affine map.
  // With the fused ReLU, the gradient reaching the normalisation is dy where the output is
  // positive.
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
    // Sums of dy and of dy * (x - mean), in one pass.
    const int parts =
        for_each_image_range(ctx, batch, [&](std::int64_t begin, std::int64_t end, int part) {
          double* sums = partial_sums(part);
          for (std::int64_t b = begin; b < end; ++b)
            for (std::int64_t c = 0; c < kC; ++c) {
              const std::int64_t offset = (b * kC + c) * kPlane;
              const T *xs = x + offset, *ys = y + offset, *gs = dy + offset;
              const S mean = mean_.data()[c], scale = scale_.data()[c], shift = shift_.data()[c];
              const auto [a, d] = detail::lane_sum2<S>(kPlane, [=](std::int64_t i) {
                const S g = upstream_gradient(xs, ys, gs, i, scale, shift);
                return std::pair<S, S>(g, g * (detail::to_compute_value<S>(xs[i]) - mean));
              });
              sums[2 * c] += a;
              sums[2 * c + 1] += d;
            }
        });
    for (std::int64_t c = 0; c < kC; ++c) {
      double sum_dy = 0, sum_dy_xhat = 0;
      for (int part = 0; part < parts; ++part) {
        sum_dy += partial_sums(part)[2 * c];
        sum_dy_xhat += partial_sums(part)[2 * c + 1];
      }
      sum_dy_xhat *= inv_std_.data()[c];
      weight_delta_.data()[c] = static_cast<S>(sum_dy_xhat);
      bias_delta_.data()[c] = static_cast<S>(sum_dy);
      gradient_means_[2 * c] = training ? static_cast<S>(sum_dy / count) : S(0);
      gradient_means_[2 * c + 1] = training ? static_cast<S>(sum_dy_xhat / count) : S(0);
    }
    if (dx) {
      for_each_image_range(ctx, batch, [&](std::int64_t begin, std::int64_t end, int) {
        for (std::int64_t b = begin; b < end; ++b)
          for (std::int64_t c = 0; c < kC; ++c) {
            const std::int64_t offset = (b * kC + c) * kPlane;
            const T *xs = x + offset, *ys = y + offset, *gs = dy + offset;
            T* ds = dx + offset;
            const S mean = mean_.data()[c], inv_std = inv_std_.data()[c];
            const S scale = scale_.data()[c], shift = shift_.data()[c];
            const S k = detail::to_compute_value<S>(weight_.value.data()[c]) * inv_std;
            const S mean_dy = gradient_means_[2 * c], mean_dy_xhat = gradient_means_[2 * c + 1];
            for (std::int64_t i = 0; i < kPlane; ++i) {
              const S xhat = (detail::to_compute_value<S>(xs[i]) - mean) * inv_std;
              const S g = upstream_gradient(xs, ys, gs, i, scale, shift);
              ds[i] = detail::to_storage_value<T>(k * (g - mean_dy - xhat * mean_dy_xhat));
            }
          }
      });
    }
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
  // The normalised value before the ReLU: x * scale + shift with the channel's folded affine map.
  // One function for the forward pass and the mask in backward, so that both round alike.
  static S normalized(T x, S scale, S shift) {
    return detail::to_compute_value<S>(x) * scale + shift;
  }

  // d(loss)/d(normalised value): dy, masked by the fused ReLU (which passes where y > 0). In fp32
  // the mask is recomputed from x, which the pass reads anyway, instead of read from y; in 16-bit
  // storage y's rounding can turn a tiny positive value into zero, so y decides.
  static S upstream_gradient(const T* x, const T* y, const T* dy, std::int64_t i, S scale,
                             S shift) {
    const S g = detail::to_compute_value<S>(dy[i]);
    if constexpr (FusedRelu) {
      if constexpr (std::is_same_v<T, S>) return normalized(x[i], scale, shift) > S(0) ? g : S(0);
      return detail::to_compute_value<S>(y[i]) > S(0) ? g : S(0);
    }
    return g;
  }

  void set_statistics(std::int64_t c, double mean, double var) {
    const S inv_std = static_cast<S>(1.0 / std::sqrt(var + Eps));
    mean_.data()[c] = static_cast<S>(mean);
    inv_std_.data()[c] = inv_std;
    const S scale = detail::to_compute_value<S>(weight_.value.data()[c]) * inv_std;
    scale_.data()[c] = scale;
    shift_.data()[c] =
        detail::to_compute_value<S>(bias_.value.data()[c]) - static_cast<S>(mean) * scale;
  }

  // Runs f(begin, end, part) over the batch in contiguous ranges of whole samples, one per thread
  // (or all on the caller when the tensor is small), with part's sums zeroed; returns the number of
  // parts. Each pass then streams through memory in order: a channel-major loop jumps a whole
  // sample ahead after each plane, and the hardware prefetchers restart at every jump.
  template <class F>
  int for_each_image_range(Context<Device>& ctx, std::int64_t batch, F&& f) {
    const int parts = batch * kC * kPlane < detail::kParallelWorkMin
                          ? 1
                          : static_cast<int>(std::min<std::int64_t>(ctx.threads(), batch));
    partials_.assign(static_cast<std::size_t>(parts) * 2 * kC, 0.0);
    if (parts == 1) {
      f(std::int64_t{0}, batch, 0);
    } else {
      ctx.pool().parallel_for(
          batch, [&](std::int64_t begin, std::int64_t end, int part) { f(begin, end, part); });
    }
    return parts;
  }
  double* partial_sums(int part) {
    return partials_.data() + static_cast<std::ptrdiff_t>(part) * 2 * kC;
  }

  Parameter<T, Device> weight_;
  Parameter<T, Device> bias_;
  tensor::Tensor<S, Device> running_mean_, running_var_;
  tensor::Tensor<std::int64_t, Device> batches_tracked_;
  tensor::Tensor<S, Device> mean_, inv_std_, scale_, shift_;  // of the last forward, for backward
  std::vector<double> partials_;                              // per part: (sum, sum) per channel
  std::vector<S> gradient_means_;  // backward's mean(dy) and mean(dy * xhat) per channel
  tensor::Tensor<S, Device> weight_delta_, bias_delta_;
};

// torch.nn.BatchNorm2d(C, eps=Eps, momentum=Momentum); C comes from the input shape.
template <double Momentum = 0.1, double Eps = 1e-5>
struct BatchNorm2d {
  template <class In, class T, class Device>
  using Bind = BatchNorm2dLayer<Momentum, Eps, false, In, T, Device>;
};

// torch.nn.BatchNorm2d(C, eps=Eps, momentum=Momentum) then torch.relu, fused; named as the
// BatchNorm.
template <double Momentum = 0.1, double Eps = 1e-5>
struct BatchNormReLU2d {
  template <class In, class T, class Device>
  using Bind = BatchNorm2dLayer<Momentum, Eps, true, In, T, Device>;
};

}  // namespace coltrain::nn
