#pragma once
// Pooling on NCHW samples: MaxPool2d<Kernel, Stride, Padding> and AvgPool2d<Kernel, Stride,
// Padding> (torch.nn.MaxPool2d / AvgPool2d; Stride defaults to Kernel; average pooling counts the
// zero padding, PyTorch's count_include_pad=True), and GlobalAvgPool, which averages each channel
// to one value and yields a flat [C] sample (torch's AdaptiveAvgPool2d(1) followed by Flatten).

#include <coltrain/core/config.hpp>
#include <coltrain/nn/compute_precision.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/tensor/tensor.hpp>
#include <coltrain/tensor/vector_pack.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

namespace coltrain::nn {

namespace detail {

// Runs f(plane_index) for every (sample, channel) plane of a batch, split across the pool.
template <class Device, class F>
void for_each_plane(Context<Device>& ctx, std::int64_t planes, std::int64_t plane_size, F&& f) {
  parallel_range(ctx, planes, planes * plane_size, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t p = begin; p < end; ++p) f(p);
  });
}

template <class In, std::size_t Kernel, std::size_t Stride, std::size_t Padding>
struct PoolGeometry {
  static_assert(In::kRank == 3,
                "coltrain::nn pooling: the input must be an image, StaticShape<C, H, W>");
  static_assert(Kernel > 0 && Stride > 0,
                "coltrain::nn pooling: kernel and stride must be positive");
  static_assert(2 * Padding <= Kernel,
                "coltrain::nn pooling: padding may be at most half the kernel");
  static_assert(Kernel <= In::kDims[1] + 2 * Padding && Kernel <= In::kDims[2] + 2 * Padding,
                "coltrain::nn pooling: the window is larger than the padded input image");
  static constexpr std::int64_t kC = In::kDims[0], kH = In::kDims[1], kW = In::kDims[2];
  static constexpr std::int64_t kOutH = (kH + 2 * Padding - Kernel) / Stride + 1;
  static constexpr std::int64_t kOutW = (kW + 2 * Padding - Kernel) / Stride + 1;
  using Output = Chw<In::kDims[0], kOutH, kOutW>;
};

// The base of every pooling layer, on either device: parameter-free, from In to the pooled shape.
template <class In, std::size_t Kernel, std::size_t Stride, std::size_t Padding>
using PoolingBase =
    ParameterFreeLayer<In, typename PoolGeometry<In, Kernel, Stride, Padding>::Output>;

}  // namespace detail

template <std::size_t Kernel, std::size_t Stride, std::size_t Padding, class In, class T,
          class Device>
class MaxPool2dLayer : public detail::PoolingBase<In, Kernel, Stride, Padding> {
  using Geometry = detail::PoolGeometry<In, Kernel, Stride, Padding>;
  using S = compute_t<T>;
  static constexpr std::int64_t kC = Geometry::kC, kH = Geometry::kH, kW = Geometry::kW;
  static constexpr std::int64_t kOutH = Geometry::kOutH, kOutW = Geometry::kOutW;

 public:
  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const std::int64_t planes = in.extent(0) * kC;
    argmax_.resize({planes * kOutH * kOutW});
    const T* x = in.data();
    T* y = out.data();
    std::int32_t* index = argmax_.data();
    detail::for_each_plane(ctx, planes, kH * kW, [=](std::int64_t p) {
      const T* src = x + p * kH * kW;
      if constexpr (kPairs) {
        pairs_forward(src, y + p * kOutH * kOutW, index + p * kOutH * kOutW);
      } else {
        for (std::int64_t oh = 0; oh < kOutH; ++oh)
          for (std::int64_t ow = 0; ow < kOutW; ++ow) {
            const std::int32_t best_index = window_argmax(src, oh, ow);
            const std::int64_t o = (p * kOutH + oh) * kOutW + ow;
            y[o] = src[best_index];
            index[o] = best_index;
          }
      }
    });
  }

  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    if (grad_in.empty()) return;
    const std::int64_t planes = in.extent(0) * kC;
    auto dx = detail::compute_target<T>(grad_in, grad_in_scratch_);
    const T* dy = grad_out.data();
    const std::int32_t* index = argmax_.data();
    detail::for_each_plane(ctx, planes, kH * kW, [&](std::int64_t p) {
      S* dst = dx.data() + p * kH * kW;
      if constexpr (kPairsCover) {
        pairs_backward(dy + p * kOutH * kOutW, index + p * kOutH * kOutW, dst);
      } else {
        std::fill_n(dst, kH * kW, S(0));
        for (std::int64_t o = p * kOutH * kOutW; o < (p + 1) * kOutH * kOutW; ++o)
          dst[index[o]] += detail::to_compute_value<S>(dy[o]);
      }
    });
    detail::store_result<T, S>(dx, grad_in);
  }

 private:
  static constexpr std::int64_t kKernel = Kernel, kStride = Stride, kPadding = Padding;

  // The common 2x2, stride 2 pooling of stored-as-computed values: whole rows of outputs at once,
  // in vector packs (even and odd input columns split apart, then three lane-wise selects in the
  // window's order), with window_argmax's rules: the first maximum wins, a NaN propagates.
  static constexpr bool kPairs = Kernel == 2 && Stride == 2 && Padding == 0 && std::is_same_v<T, S>;
  // Where the windows also cover the whole input (even sides), backward writes every input
  // gradient once, row by row: dy where the window took that value, else 0. Zeroing the plane and
  // then scattering dy wrote it twice (CifarNet's first pooling: 8 MB a step): 0.64 -> 0.47-0.51
  // ms there, 0.71-0.97 -> 0.53-0.56 ms at MnistConvNet's (one thread). Rows of fewer than 4
  // lanes (14 outputs wide: 2) ran slower than the scatter and keep it.
  static constexpr bool kPairsCover =
      kPairs && kH % 2 == 0 && kW % 2 == 0 && tensor::pack_lanes<S>(kOutW) >= 4;

  template <int N>
  static tensor::index_pack_t<S, N> even_lanes() {
    return [&]<int... L>(std::integer_sequence<int, L...>) {
      return tensor::index_pack_t<S, N>{(2 * L)...};
    }
    (std::make_integer_sequence<int, N>{});
  }

  static void pairs_forward(const S* COLTRAIN_RESTRICT src, S* COLTRAIN_RESTRICT y,
                            std::int32_t* COLTRAIN_RESTRICT index) {
    constexpr int N = tensor::pack_lanes<S>(kOutW);
    using P = tensor::pack_t<S, N>;
    using I = tensor::index_pack_t<S, N>;
    const I lane_columns = even_lanes<N>();
    for (std::int64_t oh = 0; oh < kOutH; ++oh) {
      const S* top = src + 2 * oh * kW;
      for (std::int64_t ow = 0; ow < kOutW; ow += N) {
        P window[4];  // the window's four values, in PyTorch's scan order
        tensor::deinterleave<S, N>(tensor::load_pack<P>(top + 2 * ow),
                                   tensor::load_pack<P>(top + 2 * ow + N), window[0], window[1]);
        tensor::deinterleave<S, N>(tensor::load_pack<P>(top + kW + 2 * ow),
                                   tensor::load_pack<P>(top + kW + 2 * ow + N), window[2],
                                   window[3]);
        const I first = lane_columns + static_cast<std::int32_t>(2 * oh * kW + 2 * ow);
        P best = window[0];
        I best_index = first;
        for (int w = 1; w < 4; ++w) {
          const P v = window[w];
          const I take = (v > best) | ((v != v) & (best == best));
          best = take ? v : best;
          best_index = take ? first + static_cast<std::int32_t>((w / 2) * kW + w % 2) : best_index;
        }
        tensor::store_pack(y + oh * kOutW + ow, best);
        tensor::store_pack(index + oh * kOutW + ow, best_index);
      }
    }
  }

  // dx of one plane from its dy and the forward pass's argmax. Adding 0 turns a -0 gradient into
  // +0, as the scatter onto zeros (and PyTorch's) does.
  static void pairs_backward(const S* COLTRAIN_RESTRICT dy,
                             const std::int32_t* COLTRAIN_RESTRICT index, S* COLTRAIN_RESTRICT dx) {
    constexpr int N = tensor::pack_lanes<S>(kOutW);
    using P = tensor::pack_t<S, N>;
    using I = tensor::index_pack_t<S, N>;
    const I lane_columns = even_lanes<N>();
    for (std::int64_t oh = 0; oh < kOutH; ++oh) {
      S* top = dx + 2 * oh * kW;
      for (std::int64_t ow = 0; ow < kOutW; ow += N) {
        const P g = tensor::load_pack<P>(dy + oh * kOutW + ow);
        const I taken = tensor::load_pack<I>(index + oh * kOutW + ow);
        const I first = lane_columns + static_cast<std::int32_t>(2 * oh * kW + 2 * ow);
        P window[4];
        for (int w = 0; w < 4; ++w)
          window[w] =
              (taken == first + static_cast<std::int32_t>((w / 2) * kW + w % 2) ? g : P{}) + P{};
        P low, high;
        tensor::interleave<S, N>(window[0], window[1], low, high);
        tensor::store_pack(top + 2 * ow, low);
        tensor::store_pack(top + 2 * ow + N, high);
        tensor::interleave<S, N>(window[2], window[3], low, high);
        tensor::store_pack(top + kW + 2 * ow, low);
        tensor::store_pack(top + kW + 2 * ow + N, high);
      }
    }
  }

  // The input position of the window's maximum: the first one wins, and a NaN propagates, as in
  // PyTorch. Written as selects over a constant-size window (no branch to mispredict); the
  // bounds checks vanish when there is no padding.
  static std::int32_t window_argmax(const T* src, std::int64_t oh, std::int64_t ow) {
    S best = 0;
    std::int32_t best_index = -1;
    for (std::int64_t kh = 0; kh < kKernel; ++kh) {
      const std::int64_t ih = oh * kStride - kPadding + kh;
      if (kPadding > 0 && (ih < 0 || ih >= kH)) continue;
      for (std::int64_t kw = 0; kw < kKernel; ++kw) {
        const std::int64_t iw = ow * kStride - kPadding + kw;
        if (kPadding > 0 && (iw < 0 || iw >= kW)) continue;
        const S v = detail::to_compute_value<S>(src[ih * kW + iw]);
        const bool take = best_index < 0 || v > best || (v != v && best == best);
        best = take ? v : best;
        best_index = take ? static_cast<std::int32_t>(ih * kW + iw) : best_index;
      }
    }
    return best_index;
  }

  tensor::Tensor<std::int32_t, Device> argmax_;  // per output: the input position it came from
  tensor::Tensor<S, Device> grad_in_scratch_;
};

template <std::size_t Kernel, std::size_t Stride, std::size_t Padding, class In, class T,
          class Device>
class AvgPool2dLayer : public detail::PoolingBase<In, Kernel, Stride, Padding> {
  using Geometry = detail::PoolGeometry<In, Kernel, Stride, Padding>;
  using S = compute_t<T>;
  static constexpr std::int64_t kC = Geometry::kC, kH = Geometry::kH, kW = Geometry::kW;
  static constexpr std::int64_t kOutH = Geometry::kOutH, kOutW = Geometry::kOutW;
  static constexpr std::int64_t kK = Kernel, kS = Stride, kP = Padding;

 public:
  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const std::int64_t planes = in.extent(0) * kC;
    const T* x = in.data();
    T* y = out.data();
    const S scale = S(1) / static_cast<S>(kK * kK);
    detail::for_each_plane(ctx, planes, kH * kW, [&](std::int64_t p) {
      const T* src = x + p * kH * kW;
      for (std::int64_t oh = 0; oh < kOutH; ++oh)
        for (std::int64_t ow = 0; ow < kOutW; ++ow) {
          S sum = 0;
          for (std::int64_t ih = std::max<std::int64_t>(oh * kS - kP, 0);
               ih < std::min(oh * kS - kP + kK, kH); ++ih)
            for (std::int64_t iw = std::max<std::int64_t>(ow * kS - kP, 0);
                 iw < std::min(ow * kS - kP + kK, kW); ++iw)
              sum += detail::to_compute_value<S>(src[ih * kW + iw]);
          y[(p * kOutH + oh) * kOutW + ow] = detail::to_storage_value<T>(sum * scale);
        }
    });
  }

  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    if (grad_in.empty()) return;
    const std::int64_t planes = in.extent(0) * kC;
    auto dx = detail::compute_target<T>(grad_in, grad_in_scratch_);
    const T* dy = grad_out.data();
    const S scale = S(1) / static_cast<S>(kK * kK);
    detail::for_each_plane(ctx, planes, kH * kW, [&](std::int64_t p) {
      S* dst = dx.data() + p * kH * kW;
      std::fill_n(dst, kH * kW, S(0));
      for (std::int64_t oh = 0; oh < kOutH; ++oh)
        for (std::int64_t ow = 0; ow < kOutW; ++ow) {
          const S g = detail::to_compute_value<S>(dy[(p * kOutH + oh) * kOutW + ow]) * scale;
          for (std::int64_t ih = std::max<std::int64_t>(oh * kS - kP, 0);
               ih < std::min(oh * kS - kP + kK, kH); ++ih)
            for (std::int64_t iw = std::max<std::int64_t>(ow * kS - kP, 0);
                 iw < std::min(ow * kS - kP + kK, kW); ++iw)
              dst[ih * kW + iw] += g;
        }
    });
    detail::store_result<T, S>(dx, grad_in);
  }

 private:
  tensor::Tensor<S, Device> grad_in_scratch_;
};

template <class In, class T, class Device>
class GlobalAvgPoolLayer : public ParameterFreeLayer<In, Flat<In::kDims[0]>> {
  static_assert(In::kRank == 3,
                "coltrain::nn::GlobalAvgPool: the input must be an image, StaticShape<C, H, W>");
  using S = compute_t<T>;
  static constexpr std::int64_t kC = In::kDims[0];
  static constexpr std::int64_t kPlane = In::kDims[1] * In::kDims[2];

 public:
  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const T* x = in.data();
    T* y = out.data();
    detail::for_each_plane(ctx, in.extent(0) * kC, kPlane, [&](std::int64_t p) {
      const S sum = detail::lane_sum<S>(x + p * kPlane, kPlane);
      y[p] = detail::to_storage_value<T>(sum / static_cast<S>(kPlane));
    });
  }

  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    if (grad_in.empty()) return;
    const T* dy = grad_out.data();
    T* dx = grad_in.data();
    detail::for_each_plane(ctx, in.extent(0) * kC, kPlane, [&](std::int64_t p) {
      const T g =
          detail::to_storage_value<T>(detail::to_compute_value<S>(dy[p]) / static_cast<S>(kPlane));
      std::fill_n(dx + p * kPlane, kPlane, g);
    });
  }
};

template <std::size_t Kernel, std::size_t Stride = Kernel, std::size_t Padding = 0>
struct MaxPool2d {
  template <class In, class T, class Device>
  using Bind = MaxPool2dLayer<Kernel, Stride, Padding, In, T, Device>;
};

template <std::size_t Kernel, std::size_t Stride = Kernel, std::size_t Padding = 0>
struct AvgPool2d {
  template <class In, class T, class Device>
  using Bind = AvgPool2dLayer<Kernel, Stride, Padding, In, T, Device>;
};

struct GlobalAvgPool {
  template <class In, class T, class Device>
  using Bind = GlobalAvgPoolLayer<In, T, Device>;
};

}  // namespace coltrain::nn
