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
#include <coltrain/tensor/vector_pack.hpp>

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
    forward_pass<false>(in, nullptr, out, ctx);
  }

  // out = BatchNorm(in) + addend, then ReLU when Relu, in the output pass: a residual block's sum
  // (nn/layer.hpp). Not with the fused ReLU, whose backward reads the output.
  template <bool Relu>
  requires(!FusedRelu) void forward_add(tensor::TensorView<const T, Device> in, const T* addend,
                                        tensor::TensorView<T, Device> out, Context<Device>& ctx,
                                        std::bool_constant<Relu>) {
    forward_pass<Relu>(in, addend, out, ctx);
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
    for_each_channel_block(ctx, batch, [&](std::int64_t first, std::int64_t last) {
      // Sums of dy and of dy * (x - mean), in one pass.
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t c = first; c < last; ++c) {
          const std::int64_t offset = (b * kC + c) * kPlane;
          const T *xs = x + offset, *ys = y + offset, *gs = dy + offset;
          const P mean = P{} + mean_.data()[c], scale = P{} + scale_.data()[c];
          const P shift = P{} + shift_.data()[c];
          plane_sums(channel_lanes(c), [&](std::int64_t i) {
            const P xv = load(xs + i);
            const P g = upstream_gradient(xv, ys + i, load(gs + i), scale, shift);
            return std::pair<P, P>(g, g * (xv - mean));
          });
        }
      for (std::int64_t c = first; c < last; ++c) {
        auto [sum_dy, sum_dy_xhat] = channel_sums(c);
        sum_dy_xhat *= inv_std_.data()[c];
        weight_delta_.data()[c] = static_cast<S>(sum_dy_xhat);
        bias_delta_.data()[c] = static_cast<S>(sum_dy);
        gradient_means_[2 * c] = training ? static_cast<S>(sum_dy / count) : S(0);
        gradient_means_[2 * c + 1] = training ? static_cast<S>(sum_dy_xhat / count) : S(0);
      }
      if (!dx) return;
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t c = first; c < last; ++c) {
          const std::int64_t offset = (b * kC + c) * kPlane;
          const T *xs = x + offset, *ys = y + offset, *gs = dy + offset;
          T* ds = dx + offset;
          const S inv_std = inv_std_.data()[c];
          const P mean = P{} + mean_.data()[c], inv_std_p = P{} + inv_std;
          const P scale = P{} + scale_.data()[c], shift = P{} + shift_.data()[c];
          const P k = P{} + detail::to_compute_value<S>(weight_.value.data()[c]) * inv_std;
          const P mean_dy = P{} + gradient_means_[2 * c];
          const P mean_dy_xhat = P{} + gradient_means_[2 * c + 1];
          for (std::int64_t i = 0; i < kPlane; i += kN) {
            const P xv = load(xs + i);
            const P xhat = (xv - mean) * inv_std_p;
            const P g = upstream_gradient(xv, ys + i, load(gs + i), scale, shift);
            store(ds + i, k * (g - mean_dy - xhat * mean_dy_xhat));
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
  // y = the normalised x, plus the addend when there is one (rounded to T first, as a separate
  // BatchNorm's output would be), then ReLU when fused or asked for. The statistics that normalise
  // are the batch's in training (moving the running ones), the running ones in evaluation; scale_
  // and shift_ then hold the folded affine map of each channel.
  template <bool Relu>
  void forward_pass(tensor::TensorView<const T, Device> in, const T* addend,
                    tensor::TensorView<T, Device> out, Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    const bool training = ctx.training();
    if (training && batch * kPlane < 2)
      throw InvalidArgument(
          "BatchNorm2d: training needs more than one value per channel, got a batch of " +
          std::to_string(batch) + " samples of " + std::to_string(kPlane) + " pixels");
    const T* x = in.data();
    T* y = out.data();
    const double count = static_cast<double>(batch * kPlane);
    for_each_channel_block(ctx, batch, [&](std::int64_t first, std::int64_t last) {
      if (training) {
        // One pass for both sums, of (x - shift) and its square, shifted by one of the channel's
        // values so that the variance does not come from the difference of two large numbers.
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t c = first; c < last; ++c) {
            const T* plane = x + (b * kC + c) * kPlane;
            const P shift = P{} + detail::to_compute_value<S>(x[c * kPlane]);
            plane_sums(channel_lanes(c), [&](std::int64_t i) {
              const P d = load(plane + i) - shift;
              return std::pair<P, P>(d, d * d);
            });
          }
      }
      for (std::int64_t c = first; c < last; ++c) {
        if (!training) {
          set_statistics(c, running_mean_.data()[c], running_var_.data()[c]);
          continue;
        }
        const auto [sum, squares] = channel_sums(c);
        const double shifted_mean = sum / count;
        const double mean = detail::to_compute_value<S>(x[c * kPlane]) + shifted_mean;
        const double var = std::max(0.0, squares / count - shifted_mean * shifted_mean);
        S& rm = running_mean_.data()[c];
        S& rv = running_var_.data()[c];
        rm = static_cast<S>((1.0 - Momentum) * rm + Momentum * mean);
        rv = static_cast<S>((1.0 - Momentum) * rv + Momentum * var * count / (count - 1.0));
        set_statistics(c, mean, var);
      }
      const auto write = [&]<bool Add>() {
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t c = first; c < last; ++c) {
            const std::int64_t offset = (b * kC + c) * kPlane;
            const T* src = x + offset;
            T* dst = y + offset;
            const P scale = P{} + scale_.data()[c], shift = P{} + shift_.data()[c];
            for (std::int64_t i = 0; i < kPlane; i += kN) {
              P v = normalized(load(src + i), scale, shift);
              if constexpr (Add) v = rounded(v) + load(addend + offset + i);
              store(dst + i, FusedRelu || Relu ? tensor::relu_pack(v) : v);
            }
          }
      };
      if (addend)
        write.template operator()<true>();
      else
        write.template operator()<false>();
    });
    if (training) batches_tracked_.data()[0] += 1;
  }

  // kN values at a time: a vector of floats in fp32 (tensor::Pack), one value in 16-bit storage
  // (converted on load and store) and in double.
  static constexpr int kN = std::is_same_v<T, float> ? tensor::pack_lanes<float>(kPlane) : 1;
  using P = tensor::pack_t<S, kN>;
  // Independent accumulators per sum in plane_sums: one alone would wait on its own latency.
  static constexpr int kChains = (kPlane / kN) % 4 == 0 ? 4 : (kPlane / kN) % 2 == 0 ? 2 : 1;

  static P load(const T* p) {
    if constexpr (kN == 1)
      return detail::to_compute_value<S>(*p);
    else
      return tensor::load_pack<P>(p);
  }
  static void store(T* p, P v) {
    if constexpr (kN == 1)
      *p = detail::to_storage_value<T>(v);
    else
      tensor::store_pack(p, v);
  }

  // v as stored in T and read back: what a separate layer would hand on.
  static P rounded(P v) {
    if constexpr (kN == 1)
      return detail::to_compute_value<S>(detail::to_storage_value<T>(v));
    else
      return v;
  }

  // The normalised value before the ReLU: x * scale + shift with the channel's folded affine map.
  // One function for the forward pass and the mask in backward, so that both round alike.
  static P normalized(P x, P scale, P shift) { return x * scale + shift; }

  // d(loss)/d(normalised value): dy, masked by the fused ReLU (which passes where y > 0). In fp32
  // the mask is recomputed from x, which the pass reads anyway, instead of read from y; in 16-bit
  // storage y's rounding can turn a tiny positive value into zero, so y decides.
  static P upstream_gradient(P x, const T* y, P dy, P scale, P shift) {
    if constexpr (FusedRelu) {
      if constexpr (std::is_same_v<T, S>) return normalized(x, scale, shift) > P{} ? dy : P{};
      return load(y) > P{} ? dy : P{};
    }
    return dy;
  }

  // sums[0..kN) += the first values term(i) returns over a plane, sums[kN..2kN) += the second;
  // term(i) gives both for the kN values at i. Summed in float within the plane (kChains
  // accumulators each), then lane by lane in double.
  template <class F>
  static void plane_sums(double* sums, F&& term) {
    P first[kChains] = {}, second[kChains] = {};
    for (std::int64_t i = 0; i < kPlane; i += kChains * kN)
      for (int chain = 0; chain < kChains; ++chain) {
        const auto [a, b] = term(i + chain * kN);
        first[chain] += a;
        second[chain] += b;
      }
    for (int chain = 1; chain < kChains; ++chain) {
      first[0] += first[chain];
      second[0] += second[chain];
    }
    tensor::add_lanes<kN>(sums, first[0]);
    tensor::add_lanes<kN>(sums + kN, second[0]);
  }

  // Channel c's two running sums: kN lanes each, summed in double in lane order (reproducible).
  double* channel_lanes(std::int64_t c) { return sums_.data() + 2 * c * kN; }
  std::pair<double, double> channel_sums(std::int64_t c) {
    double first = 0, second = 0;
    for (int l = 0; l < kN; ++l) {
      first += channel_lanes(c)[l];
      second += channel_lanes(c)[kN + l];
    }
    return {first, second};
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

  // Runs f(first, last) for blocks of channels [first, last), each block on one thread (or all on
  // the caller when the tensor is small), with the blocks' sums zeroed. f makes two passes over its
  // block: the sums, then the output (forward) or dx (backward). A block's data, over the whole
  // batch, takes at most kBlockBytes, so that the second pass finds it in the core's L2 cache:
  // ResNet-20's 4 MB activations, split across the batch instead, were read from L3 twice, and
  // the same passes ran 2.4x faster on data in L2 (Intel Xeon, one thread). Within a block the
  // passes go image by image, each image's planes of the block contiguous in memory. Each channel
  // is summed by one thread over the whole batch in sample order, so the statistics do not depend
  // on the number of threads.
  static constexpr std::int64_t kBlockBytes = 512 * 1024;
  template <class F>
  void for_each_channel_block(Context<Device>& ctx, std::int64_t batch, F&& f) {
    sums_.assign(static_cast<std::size_t>(2 * kC * kN), 0.0);
    const std::int64_t channel_bytes = std::max<std::int64_t>(1, batch * kPlane * sizeof(T));
    std::int64_t block = std::clamp<std::int64_t>(kBlockBytes / channel_bytes, 1, kC);
    const bool parallel = batch * kC * kPlane >= detail::kParallelWorkMin && ctx.threads() > 1;
    if (parallel) block = std::min<std::int64_t>(block, (kC + ctx.threads() - 1) / ctx.threads());
    const std::int64_t blocks = (kC + block - 1) / block;
    const auto run = [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) f(i * block, std::min(kC, (i + 1) * block));
    };
    if (parallel)
      ctx.pool().parallel_for(blocks,
                              [&](std::int64_t begin, std::int64_t end, int) { run(begin, end); });
    else
      run(0, blocks);
  }

  Parameter<T, Device> weight_;
  Parameter<T, Device> bias_;
  tensor::Tensor<S, Device> running_mean_, running_var_;
  tensor::Tensor<std::int64_t, Device> batches_tracked_;
  tensor::Tensor<S, Device> mean_, inv_std_, scale_, shift_;  // of the last forward, for backward
  std::vector<double> sums_;       // per channel: two sums, kN lanes each
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
