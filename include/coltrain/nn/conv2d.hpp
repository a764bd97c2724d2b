#pragma once
// Conv2d<OutChannels, Kernel, Stride, Padding, Bias>: 2-D convolution on NCHW samples
// (torch.nn.Conv2d with a square kernel, zero padding, no dilation or groups);
// weight [out, in, kh, kw].
//
// CPU: im2col + GEMM. Each thread takes a contiguous share of the batch; small feature maps are
// packed several images to a GEMM, so that the product stays wide
// (out[Cout, G*HW] = W[Cout, K] * col[K, G*HW], K = Cin*k*k). The products go through the
// register-blocked kernels of cpu_microkernels.hpp, which read the columns in place (Eigen would
// pack them again on every call). The columns are rebuilt in backward
// instead of kept: recomputing them is cheap next to the GEMMs and saves batch x K x HW floats per
// layer. Stride-1 convolutions on wide maps (16 pixels and more) skip the im2col matrix in the
// forward pass and the input gradient: the GEMM reads its rows straight from the zero-padded image
// (IndirectConvolution). Their weight gradient does the same on maps of 8 pixels and more
// (gemm_nn_windowed). 3x3 stride-1 convolutions with 16 channels and more each way and even output
// sizes take Winograd instead, for all three products (winograd_convolution.hpp): F(4x4, 3x3) where
// the sizes are multiples of 4, F(2x2, 3x3) otherwise.
// Conv2dReLU is the convolution with the ReLU after it fused.

#include <coltrain/core/config.hpp>
#include <coltrain/nn/compute_precision.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/nn/winograd_convolution.hpp>
#include <coltrain/tensor/cpu_microkernels.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace coltrain::nn {

namespace detail {

// Geometry of a convolution or pooling window, as plain numbers for the kernels.
struct Window {
  std::int64_t channels, height, width;  // input
  std::int64_t kernel, stride, padding;
  std::int64_t out_height, out_width;
};

// padded[c][h + p][w + p] = image[c][h][w]: the interior of a zero-bordered copy of the image. The
// border (C x (H+2p) x (W+2p), zeroed by its owner) is never written, so it stays zero.
template <Window w, class S>
void pad_image(const S* image, S* padded) {
  constexpr std::int64_t ph = w.height + 2 * w.padding, pw = w.width + 2 * w.padding;
  for (std::int64_t c = 0; c < w.channels; ++c)
    for (std::int64_t h = 0; h < w.height; ++h)
      std::memcpy(padded + (c * ph + h + w.padding) * pw + w.padding,
                  image + (c * w.height + h) * w.width, w.width * sizeof(S));
}

// col[(c*k + kh)*k + kw][column_offset + oh*OW + ow] = image[c][oh*s - p + kh][ow*s - p + kw] (0
// outside). The window is a template argument so that every loop bound is a constant. With stride 1
// the image is first copied into `padded` (pad_image), whose zero border replaces all bounds
// checks: each row of the columns is then a copy of OW contiguous values, which compiles to a few
// vector moves instead of a call to memmove.
template <Window w, class S>
void im2col(const S* image, S* col, std::int64_t ld, std::int64_t column_offset, S* padded) {
  constexpr std::int64_t k = w.kernel;
  if constexpr (w.stride == 1) {
    constexpr std::int64_t ph = w.height + 2 * w.padding, pw = w.width + 2 * w.padding;
    const S* source = image;
    if constexpr (w.padding > 0) {
      pad_image<w>(image, padded);
      source = padded;
    }
    for (std::int64_t c = 0; c < w.channels; ++c)
      for (std::int64_t kh = 0; kh < k; ++kh)
        for (std::int64_t kw = 0; kw < k; ++kw) {
          S* row = col + ((c * k + kh) * k + kw) * ld + column_offset;
          const S* src = source + (c * ph + kh) * pw + kw;
          // memcpy, not std::copy: g++ inlines a constant-size memcpy but calls memmove.
          for (std::int64_t oh = 0; oh < w.out_height; ++oh)
            std::memcpy(row + oh * w.out_width, src + oh * pw, w.out_width * sizeof(S));
        }
  } else {
    for (std::int64_t c = 0; c < w.channels; ++c) {
      const S* plane = image + c * w.height * w.width;
      for (std::int64_t kh = 0; kh < k; ++kh)
        for (std::int64_t kw = 0; kw < k; ++kw) {
          S* row = col + ((c * k + kh) * k + kw) * ld + column_offset;
          for (std::int64_t oh = 0; oh < w.out_height; ++oh) {
            const std::int64_t ih = oh * w.stride - w.padding + kh;
            S* dst = row + oh * w.out_width;
            if (ih < 0 || ih >= w.height) {
              std::fill_n(dst, w.out_width, S(0));
              continue;
            }
            const S* src = plane + ih * w.width;
            for (std::int64_t ow = 0; ow < w.out_width; ++ow) {
              const std::int64_t iw = ow * w.stride - w.padding + kw;
              dst[ow] = (iw >= 0 && iw < w.width) ? src[iw] : S(0);
            }
          }
        }
    }
  }
}

// Elements of im2col's `padded` scratch for a window.
constexpr std::int64_t padded_size(const Window& w) {
  return w.stride == 1 && w.padding > 0
             ? w.channels * (w.height + 2 * w.padding) * (w.width + 2 * w.padding)
             : 0;
}

// A stride-1 convolution of one image without an im2col matrix (an indirect GEMM): with the image
// zero-padded to PH x PW, row (c, kh, kw) of the im2col matrix is the padded image read from offset
// (c*PH + kh)*PW + kw, provided its columns are numbered oh*PW + ow, that is, in rows PW wide of
// which the last k-1 are not outputs. The GEMM computes those too (waste (PW - OW)/PW) and the
// valid columns are copied out. Worth it where the waste is small next to the im2col it saves:
// wide maps (32 and 16 pixels with k = 3), not 8x8 ones.
template <Window w>
struct IndirectConvolution {
  static constexpr std::int64_t kPaddedHeight = w.height + 2 * w.padding;
  static constexpr std::int64_t kPaddedWidth = w.width + 2 * w.padding;
  static constexpr std::int64_t kDepth = w.channels * w.kernel * w.kernel;
  // Up to the last output; the reads end exactly at the padded image's last element.
  static constexpr std::int64_t kColumns = (w.out_height - 1) * kPaddedWidth + w.out_width;
  static constexpr std::int64_t kProductLd = (kColumns + 15) / 16 * 16;  // rows on 64-byte lines
  static constexpr bool kWorthIt = w.stride == 1 && kPaddedWidth * 8 <= w.out_width * 9;
  static constexpr std::int64_t kChannelStride = kPaddedHeight * kPaddedWidth;
  // Where row (c, kh, kw) starts, relative to the padded channel c: the same for every channel.
  static constexpr std::size_t kWindowSize = static_cast<std::size_t>(w.kernel * w.kernel);
  static constexpr std::array<std::int64_t, kWindowSize> kWindowOffsets = [] {
    std::array<std::int64_t, kWindowSize> offsets{};
    for (std::int64_t kh = 0; kh < w.kernel; ++kh)
      for (std::int64_t kw = 0; kw < w.kernel; ++kw)
        offsets[static_cast<std::size_t>(kh * w.kernel + kw)] = kh * kPaddedWidth + kw;
    return offsets;
  }();

  static constexpr std::array<std::int64_t, kDepth> kRowOffsets = [] {
    std::array<std::int64_t, kDepth> offsets{};
    for (std::int64_t c = 0; c < w.channels; ++c)
      for (std::int64_t kh = 0; kh < w.kernel; ++kh)
        for (std::int64_t kw = 0; kw < w.kernel; ++kw)
          offsets[static_cast<std::size_t>((c * w.kernel + kh) * w.kernel + kw)] =
              (c * kPaddedHeight + kh) * kPaddedWidth + kw;
    return offsets;
  }();

  // out[m][OH*OW] = weights[m][C*k*k] (*) image (+ bias[m] when given, then ReLU when Relu).
  // `padded` holds padded_size(w) elements with a zero border; `product` m * kProductLd.
  template <bool Relu = false, class S>
  static void run(std::int64_t m, const S* weights, const S* image, S* padded, S* product, S* out,
                  const S* bias) {
    const S* source = image;
    if constexpr (w.padding > 0) {
      pad_image<w>(image, padded);
      source = padded;
    }
    tensor::gemm_nn_indirect(m, kColumns, kDepth, weights, kDepth, source, kRowOffsets.data(),
                             product, kProductLd, false);
    constexpr std::int64_t plane = w.out_height * w.out_width;
    for (std::int64_t c = 0; c < m; ++c) {
      const S shift = bias ? bias[c] : S(0);
      for (std::int64_t oh = 0; oh < w.out_height; ++oh) {
        const S* src = product + c * kProductLd + oh * kPaddedWidth;
        S* dst = out + c * plane + oh * w.out_width;
        for (std::int64_t ow = 0; ow < w.out_width; ++ow) {
          const S v = src[ow] + shift;
          dst[ow] = Relu && v < S(0) ? S(0) : v;  // NaN passes, as torch.relu
        }
      }
    }
  }

  // The weight gradient of one image, transposed: weight_grad_t[C*k*k][ld] += im2col(image) *
  // out_grad_t, without the im2col matrix. out_grad_t is the output gradient transposed into the
  // padded numbering of the columns (transpose_output_gradient); `padded` as in run().
  template <class S>
  static void add_weight_gradient(std::int64_t n, const S* image, S* padded, const S* out_grad_t,
                                  std::int64_t ld, S* weight_grad_t) {
    const S* source = image;
    if constexpr (w.padding > 0) {
      pad_image<w>(image, padded);
      source = padded;
    }
    tensor::gemm_nn_windowed<kWindowOffsets>(w.channels, kChannelStride, n, kColumns, source,
                                             out_grad_t, ld, weight_grad_t, ld, true);
  }

  // out_grad_t[oh*PW + ow][c] = out_grad[c][oh][ow] for c < m, rows kColumns x ld. The other
  // entries (the k-1 columns past each output row, and c >= m) are never written: the caller zeroes
  // the buffer once. Channel planes are read along their rows: reading down the channels instead
  // strides by a plane, often a multiple of 4 KiB, whose lines all fall in one L1 set.
  template <class S>
  static void transpose_output_gradient(std::int64_t m, const S* COLTRAIN_RESTRICT out_grad,
                                        S* COLTRAIN_RESTRICT out_grad_t, std::int64_t ld) {
    for (std::int64_t oh = 0; oh < w.out_height; ++oh)
      for (std::int64_t c = 0; c < m; ++c) {
        const S* src = out_grad + (c * w.out_height + oh) * w.out_width;
        S* column = out_grad_t + oh * kPaddedWidth * ld + c;
        for (std::int64_t ow = 0; ow < w.out_width; ++ow) column[ow * ld] = src[ow];
      }
  }
};

// The adjoint of im2col: image += the columns folded back onto the pixels they were read from.
template <Window w, class S>
void col2im_add(const S* col, std::int64_t ld, std::int64_t column_offset, S* image) {
  const std::int64_t k = w.kernel;
  for (std::int64_t c = 0; c < w.channels; ++c) {
    S* plane = image + c * w.height * w.width;
    for (std::int64_t kh = 0; kh < k; ++kh) {
      for (std::int64_t kw = 0; kw < k; ++kw) {
        const S* row = col + ((c * k + kh) * k + kw) * ld + column_offset;
        for (std::int64_t oh = 0; oh < w.out_height; ++oh) {
          const std::int64_t ih = oh * w.stride - w.padding + kh;
          if (ih < 0 || ih >= w.height) continue;
          const S* src = row + oh * w.out_width;
          S* dst = plane + ih * w.width;
          if (w.stride == 1) {
            const std::int64_t shift = kw - w.padding;
            const std::int64_t ow_begin = std::clamp<std::int64_t>(-shift, 0, w.out_width);
            const std::int64_t ow_end =
                std::clamp<std::int64_t>(w.width - shift, ow_begin, w.out_width);
            for (std::int64_t ow = ow_begin; ow < ow_end; ++ow) dst[ow + shift] += src[ow];
          } else {
            for (std::int64_t ow = 0; ow < w.out_width; ++ow) {
              const std::int64_t iw = ow * w.stride - w.padding + kw;
              if (iw >= 0 && iw < w.width) dst[iw] += src[ow];
            }
          }
        }
      }
    }
  }
}

// Conv2d's shape rules and sizes, the same on every device.
template <class In, std::size_t OutChannels, std::size_t Kernel, std::size_t Stride,
          std::size_t Padding>
struct Conv2dShape {
  static_assert(In::kRank == 3,
                "coltrain::nn::Conv2d: the input must be an image, StaticShape<C, H, W>; a flat "
                "input cannot be convolved");
  static_assert(OutChannels > 0 && Kernel > 0 && Stride > 0,
                "coltrain::nn::Conv2d: channels, kernel and stride must be positive");
  static_assert(Kernel <= In::kDims[1] + 2 * Padding && Kernel <= In::kDims[2] + 2 * Padding,
                "coltrain::nn::Conv2d: the kernel is larger than the padded input image");
  static constexpr std::int64_t kCin = In::kDims[0], kH = In::kDims[1], kW = In::kDims[2];
  static constexpr std::int64_t kOutH = (kH + 2 * Padding - Kernel) / Stride + 1;
  static constexpr std::int64_t kOutW = (kW + 2 * Padding - Kernel) / Stride + 1;
  static constexpr std::int64_t kCout = OutChannels;
  static constexpr std::int64_t kK = kCin * Kernel * Kernel;  // GEMM depth
  static constexpr std::int64_t kHw = kOutH * kOutW;
};

}  // namespace detail

template <std::size_t OutChannels, std::size_t Kernel, std::size_t Stride, std::size_t Padding,
          bool HasBias, bool FusedRelu, class In, class T, class Device>
class Conv2dLayer : public WeightAndBias<T, Device, HasBias> {
  using S = compute_t<T>;
  using ConvShape = detail::Conv2dShape<In, OutChannels, Kernel, Stride, Padding>;
  static constexpr std::int64_t kCin = ConvShape::kCin, kH = ConvShape::kH, kW = ConvShape::kW;
  static constexpr std::int64_t kOutH = ConvShape::kOutH, kOutW = ConvShape::kOutW;
  static constexpr std::int64_t kCout = ConvShape::kCout, kK = ConvShape::kK, kHw = ConvShape::kHw;
  // Images per GEMM: enough for about 256 output columns.
  static constexpr std::int64_t kGroup = std::max<std::int64_t>(1, (256 + kHw - 1) / kHw);
  static constexpr std::int64_t kKernel = Kernel, kStride = Stride, kPadding = Padding;
  static constexpr detail::Window kWindow{kCin, kH, kW, kKernel, kStride, kPadding, kOutH, kOutW};
  // With stride 1 the input gradient is itself a convolution: of the output gradient, padded by
  // k-1-p, with the kernel flipped and its in/out channels swapped. That GEMM has depth Cout*k*k
  // instead of Cout, and needs no scatter-add (col2im).
  static constexpr bool kGradientAsConvolution = Stride == 1 && Padding < Kernel;
  static constexpr detail::Window kGradientWindow{
      kCout, kOutH, kOutW, kKernel, 1, kKernel - 1 - std::min(kPadding, kKernel - 1), kH, kW};
  static constexpr std::int64_t kInHw = kH * kW;
  using ForwardIndirect = detail::IndirectConvolution<kWindow>;
  using GradientIndirect = detail::IndirectConvolution<kGradientWindow>;
  static constexpr bool kIndirectForward = ForwardIndirect::kWorthIt;
  static constexpr bool kIndirectGradient = kGradientAsConvolution && GradientIndirect::kWorthIt;
  // Stride-1 weight gradients read the padded image directly, as the indirect forward pass does:
  // dW^T = col * dY^T through gemm_nn_windowed, whose broadcasts of col are constant offsets into
  // a k x k window (up to 5 x 5: more rows than that would not fit a register tile). Like the
  // indirect product it computes the k-1 columns past each output row too, which is still cheaper
  // than building col where that waste is at most a quarter (8 x 8 maps and up for k = 3). Output
  // channels are padded to whole vectors in dY^T and dW^T.
  static constexpr bool kWindowedWeightGradient = Stride == 1 && kKernel * kKernel >= 4 &&
                                                  kKernel * kKernel <= 25 &&
                                                  ForwardIndirect::kColumns * 4 <= kHw * 5;
  // 3x3 stride-1 convolutions with even output sizes run all three products as Winograd F(2x2, 3x3)
  // or, where the sizes are multiples of 4, F(4x4, 3x3) (winograd_convolution.hpp): 2.25x and 4x
  // fewer multiply-adds. Its transforms cost in proportion to the channels where the products cost
  // their square, so it pays from about 16 channels each way: F(2x2)'s forward pass measured 1.2x
  // the indirect product's speed at 16 channels on 32x32 maps, 1.8x at 32 on 16x16 and 2.2x at 64
  // on 8x8 (one thread, transforms included).
  template <int Tile>
  using ForwardWinogradOf = detail::WinogradConvolution<Tile, kCin, kH, kW, kPadding>;
  template <int Tile>
  using GradientWinogradOf =
      detail::WinogradConvolution<Tile, kCout, kOutH, kOutW, kGradientWindow.padding>;
  template <int Tile>
  static constexpr bool kWinogradFits = Kernel == 3 && Stride == 1 && Padding <= 2 &&
                                        (ForwardWinogradOf<Tile>::kApplicable) &&
                                        (GradientWinogradOf<Tile>::kApplicable);
  static constexpr bool kWinograd =
      kCin >= 16 && kCout >= 16 && (kWinogradFits<2> || kWinogradFits<4>);
  static constexpr int kWinogradTile = kWinogradFits<4> ? 4 : 2;
  using ForwardWinograd = ForwardWinogradOf<kWinogradTile>;
  using GradientWinograd = GradientWinogradOf<kWinogradTile>;
  static constexpr std::int64_t kPositions = ForwardWinograd::kPositions;
  static constexpr std::int64_t kTiles = ForwardWinograd::kTiles;
  static constexpr std::int64_t kGradientTiles = GradientWinograd::kTiles;
  static constexpr std::int64_t kWinogradGroup = detail::winograd_group_images(
      std::max(kCin, kCout), std::max(kTiles, kGradientTiles), kPositions);
  static constexpr std::int64_t kWinogradLd = (kWinogradGroup * kTiles + 15) / 16 * 16;
  // Images whose input-side transforms share one vector (8 x 8 maps: winograd_convolution.hpp).
  static constexpr int kJoinedImages = ForwardWinograd::template images_per_pack<S>();
  static constexpr int kJoinedGradientImages = GradientWinograd::template images_per_pack<S>();
  static constexpr std::int64_t kGradientWinogradLd =
      (kWinogradGroup * kGradientTiles + 15) / 16 * 16;
  // The im2col matrix, for whichever of the three products still needs one.
  static constexpr bool kNeedsColumns =
      !kWinograd && (!kIndirectForward || !kWindowedWeightGradient || !kGradientAsConvolution);
  static constexpr std::int64_t kCoutPadded = (kCout + 15) / 16 * 16;

 public:
  using Input = In;
  using Output = Chw<OutChannels, kOutH, kOutW>;
  static constexpr std::size_t kParameterCount =
      OutChannels * In::kDims[0] * Kernel * Kernel + (HasBias ? OutChannels : 0);
  static constexpr std::size_t kForwardMacs = static_cast<std::size_t>(kCout * kK * kHw);
  // Whether the products go through Winograd, and its output tile: F(2x2, 3x3) or F(4x4, 3x3) (for
  // tests and benchmarks).
  static constexpr bool kUsesWinograd = kWinograd;
  static constexpr int kWinogradOutputTile = kWinograd ? kWinogradTile : 0;

  Conv2dLayer() : Parameters({kCout, kCin, kKernel, kKernel}, kCout) {}

  void initialize(Rng& rng) {
    kaiming_uniform_default(weight_.value.span(), kK, rng);
    if constexpr (HasBias) bias_uniform_default(bias_.value.span(), kK, rng);
  }

  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    auto x = detail::compute_view<T>(in, in_scratch_);
    auto w = detail::compute_view<T>(weight_.value.view(), weight_scratch_);
    auto y = detail::compute_target<T>(out, out_scratch_);
    const S* bias = nullptr;
    if constexpr (HasBias) bias = detail::compute_view<T>(bias_.value.view(), bias_scratch_).data();
    prepare_workspaces(ctx.threads());
    if constexpr (kWinograd) {
      forward_winograd(x.data(), w.data(), bias, y.data(), batch, ctx);
      detail::store_result<T, S>(y, out);
      return;
    }
    if constexpr (kIndirectForward) {
      ctx.pool().parallel_for(batch, [&](std::int64_t begin, std::int64_t end, int thread) {
        Workspace& ws = workspaces_[static_cast<std::size_t>(thread)];
        for (std::int64_t b = begin; b < end; ++b)
          ForwardIndirect::template run<FusedRelu>(kCout, w.data(), x.data() + b * kCin * kInHw,
                                                   ws.padded.data(), ws.product.data(),
                                                   y.data() + b * kCout * kHw, bias);
      });
      detail::store_result<T, S>(y, out);
      return;
    }
    ctx.pool().parallel_for(batch, [&](std::int64_t begin, std::int64_t end, int thread) {
      Workspace& ws = workspaces_[static_cast<std::size_t>(thread)];
      for (std::int64_t first = begin; first < end; first += kGroup) {
        const std::int64_t count = std::min(kGroup, end - first);
        const std::int64_t ld = count * kHw;
        for (std::int64_t g = 0; g < count; ++g)
          detail::im2col<kWindow>(x.data() + (first + g) * kCin * kH * kW, ws.col.data(), ld,
                                  g * kHw, ws.padded.data());
        S* target = count == 1 ? y.data() + first * kCout * kHw : ws.product.data();
        tensor::gemm_nn_small_m(kCout, ld, kK, w.data(), kK, ws.col.data(), ld, target, ld, false);
        for (std::int64_t g = 0; g < count; ++g) {
          S* image = y.data() + (first + g) * kCout * kHw;
          for (std::int64_t c = 0; c < kCout; ++c) {
            S* dst = image + c * kHw;
            if (count > 1) std::copy_n(ws.product.data() + c * ld + g * kHw, kHw, dst);
            if (bias || FusedRelu) {
              const S shift = bias ? bias[c] : S(0);
              for (std::int64_t i = 0; i < kHw; ++i) {
                const S v = dst[i] + shift;
                dst[i] = FusedRelu && v < S(0) ? S(0) : v;
              }
            }
          }
        }
      }
    });
    detail::store_result<T, S>(y, out);
  }

  // With the fused ReLU, each group's output gradient is first masked where the output is not
  // positive, into a scratch that stays in cache for the products that read it.
  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device> out,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    auto x = detail::compute_view<T>(in, in_scratch_);
    auto dy = detail::compute_view<T>(grad_out, grad_out_scratch_);
    auto w = detail::compute_view<T>(weight_.value.view(), weight_scratch_);
    const bool want_input_grad = !grad_in.empty();
    tensor::TensorView<S, Device> dx;
    if constexpr (kWinograd) {
      if (want_input_grad) dx = detail::compute_target<T>(grad_in, grad_in_scratch_);
      backward_winograd(x.data(), out.data(), dy.data(), w.data(), dx.data(), batch, ctx);
      if (want_input_grad) detail::store_result<T, S>(dx, grad_in);
      return;
    }
    if (want_input_grad) {
      dx = detail::compute_target<T>(grad_in, grad_in_scratch_);
      if constexpr (kGradientAsConvolution) flip_weights(w.data());
    }
    prepare_workspaces(ctx.threads());
    const int parts = static_cast<int>(std::min<std::int64_t>(ctx.threads(), batch));
    ctx.pool().parallel_for(batch, [&](std::int64_t begin, std::int64_t end, int thread) {
      Workspace& ws = workspaces_[static_cast<std::size_t>(thread)];
      std::fill_n(ws.weight_grad.data(), ws.weight_grad.numel(), S(0));
      std::fill_n(ws.bias_grad.data(), kCout, S(0));
      for (std::int64_t first = begin; first < end; first += kGroup) {
        const std::int64_t count = std::min(kGroup, end - first);
        const std::int64_t ld = count * kHw;
        // The group's output gradients, image after image.
        const S* dy_images = dy.data() + first * kCout * kHw;
        if constexpr (FusedRelu)
          dy_images = relu_masked(out.data() + first * kCout * kHw, dy_images, count, ws);
        if constexpr (HasBias)
          for (std::int64_t i = 0; i < count * kCout; ++i)
            ws.bias_grad.data()[i % kCout] += detail::lane_sum<S>(dy_images + i * kHw, kHw);
        // The output gradient of the group as one [Cout, G*HW] matrix, where a GEMM reads it.
        const S* dy_group = dy_images;
        const bool group_read =
            !kWindowedWeightGradient || (!kGradientAsConvolution && want_input_grad);
        if (count > 1 && group_read) {
          for (std::int64_t g = 0; g < count; ++g)
            for (std::int64_t c = 0; c < kCout; ++c)
              std::copy_n(dy_images + (g * kCout + c) * kHw, kHw,
                          ws.product.data() + c * ld + g * kHw);
          dy_group = ws.product.data();
        }
        if constexpr (kWindowedWeightGradient) {
          for (std::int64_t g = 0; g < count; ++g) {
            ForwardIndirect::transpose_output_gradient(kCout, dy_images + g * kCout * kHw,
                                                       ws.out_grad_t.data(), kCoutPadded);
            ForwardIndirect::add_weight_gradient(kCoutPadded, x.data() + (first + g) * kCin * kInHw,
                                                 ws.padded.data(), ws.out_grad_t.data(),
                                                 kCoutPadded, ws.weight_grad.data());
          }
        } else {
          for (std::int64_t g = 0; g < count; ++g)
            detail::im2col<kWindow>(x.data() + (first + g) * kCin * kH * kW, ws.col.data(), ld,
                                    g * kHw, ws.padded.data());
          // dW += dY * col^T
          tensor::gemm_nt_long_k(kCout, kK, ld, dy_group, ld, ws.col.data(), ld,
                                 ws.weight_grad.data(), kK, true);
        }
        if (want_input_grad) {
          if constexpr (kIndirectGradient) {
            for (std::int64_t g = 0; g < count; ++g)
              GradientIndirect::run(kCin, flipped_.data(), dy_images + g * kCout * kHw,
                                    ws.gradient_padded.data(), ws.gradient_product.data(),
                                    dx.data() + (first + g) * kCin * kInHw,
                                    static_cast<const S*>(nullptr));
          } else if constexpr (kGradientAsConvolution) {
            const std::int64_t ld_in = count * kInHw;
            for (std::int64_t g = 0; g < count; ++g)
              detail::im2col<kGradientWindow>(dy_images + g * kCout * kHw, ws.gradient_col.data(),
                                              ld_in, g * kInHw, ws.gradient_padded.data());
            S* target = count == 1 ? dx.data() + first * kCin * kInHw : ws.gradient_product.data();
            tensor::gemm_nn_small_m(kCin, ld_in, kGradientK, flipped_.data(), kGradientK,
                                    ws.gradient_col.data(), ld_in, target, ld_in, false);
            if (count > 1)
              for (std::int64_t g = 0; g < count; ++g)
                for (std::int64_t c = 0; c < kCin; ++c)
                  std::copy_n(ws.gradient_product.data() + c * ld_in + g * kInHw, kInHw,
                              dx.data() + ((first + g) * kCin + c) * kInHw);
          } else {
            // dcol = W^T * dY, folded back onto the input images.
            tensor::gemm_tn_small_k(kK, ld, kCout, w.data(), kK, dy_group, ld, ws.col.data(), ld,
                                    false);
            for (std::int64_t g = 0; g < count; ++g) {
              // Zeroed here, by the thread that adds into it, rather than all at once up front.
              S* image = dx.data() + (first + g) * kCin * kInHw;
              std::fill_n(image, kCin * kInHw, S(0));
              detail::col2im_add<kWindow>(ws.col.data(), ld, g * kHw, image);
            }
          }
        }
      }
    });
    reduce_gradients(parts);
    if (want_input_grad) detail::store_result<T, S>(dx, grad_in);
  }

 private:
  static constexpr std::int64_t kGradientK = kCout * kKernel * kKernel;

  struct Workspace {
    tensor::Tensor<S, Device> col, product, weight_grad, bias_grad, gradient_col, gradient_product;
    tensor::Tensor<S, Device> padded, gradient_padded;  // im2col's zero-bordered copies
    tensor::Tensor<S, Device> out_grad_t;               // dY^T for the windowed weight gradient
    tensor::Tensor<S, Device> masked_grad;              // a group's dY through the fused ReLU
    tensor::Tensor<S, Device> split, gradient_split;    // Winograd's split padded x, dY
    tensor::Tensor<S, Device> transformed;  // Winograd's V of x (in backward, then of dY)
    tensor::Tensor<S, Device> transformed_weight_grad;  // Winograd's dU
  };

  // f.template operator()<Images>(g) over [0, count): runs of Joined images, then single ones.
  template <int Joined, class F>
  static void for_image_runs(std::int64_t count, F&& f) {
    std::int64_t g = 0;
    if constexpr (Joined > 1)
      for (; g + Joined <= count; g += Joined) f.template operator()<Joined>(g);
    for (; g < count; ++g) f.template operator()<1>(g);
  }

  // Winograd: per group of images, V = the input tiles transformed, the 16 or 36 products with U =
  // the transformed weights, and the output transform (with bias and ReLU) straight into y.
  void forward_winograd(const S* x, const S* w, const S* bias, S* y, std::int64_t batch,
                        Context<Device>& ctx) {
    winograd_weights_.resize({kPositions * kCout * kCin});
    ctx.pool().parallel_for(kCout, [&](std::int64_t begin, std::int64_t end, int) {
      detail::winograd_transform_weights<kWinogradTile>(kCout, kCin, begin, end, w,
                                                        winograd_weights_.data());
    });
    ctx.pool().parallel_for(batch, [&](std::int64_t begin, std::int64_t end, int thread) {
      Workspace& ws = workspaces_[static_cast<std::size_t>(thread)];
      for (std::int64_t first = begin; first < end; first += kWinogradGroup) {
        const std::int64_t count = std::min(kWinogradGroup, end - first);
        for_image_runs<kJoinedImages>(count, [&]<int Images>(std::int64_t g) {
          ForwardWinograd::template transform_input_images<S, Images>(
              x + (first + g) * kCin * kInHw, ws.split.data(), ws.transformed.data(), kWinogradLd,
              g * kTiles);
        });
        detail::winograd_multiply(kPositions, kCout, kCin, count * kTiles, winograd_weights_.data(),
                                  ws.transformed.data(), ws.product.data(), kWinogradLd);
        for (std::int64_t g = 0; g < count; ++g)
          ForwardWinograd::template transform_output<FusedRelu>(
              kCout, ws.product.data(), kWinogradLd, g * kTiles, y + (first + g) * kCout * kHw,
              bias);
      }
    });
  }

  // Winograd: the weight gradient in the transformed domain (dU[pos] += dY'[pos] * V[pos]^T, with
  // V of x recomputed rather than kept from forward), folded back to 3x3 by each thread; the input
  // gradient as the Winograd convolution of dY with the flipped kernel.
  void backward_winograd(const S* x, const T* y, const S* dy, const S* w, S* dx, std::int64_t batch,
                         Context<Device>& ctx) {
    if (dx) {
      winograd_flipped_.resize({kPositions * kCin * kCout});
      ctx.pool().parallel_for(kCin, [&](std::int64_t begin, std::int64_t end, int) {
        detail::winograd_transform_weights<kWinogradTile, true>(kCin, kCout, begin, end, w,
                                                                winograd_flipped_.data());
      });
    }
    prepare_workspaces(ctx.threads());
    const int parts = static_cast<int>(std::min<std::int64_t>(ctx.threads(), batch));
    ctx.pool().parallel_for(batch, [&](std::int64_t begin, std::int64_t end, int thread) {
      Workspace& ws = workspaces_[static_cast<std::size_t>(thread)];
      std::fill_n(ws.bias_grad.data(), kCout, S(0));
      for (std::int64_t first = begin; first < end; first += kWinogradGroup) {
        const std::int64_t count = std::min(kWinogradGroup, end - first);
        const S* dy_images = dy + first * kCout * kHw;
        if constexpr (FusedRelu)
          dy_images = relu_masked(y + first * kCout * kHw, dy_images, count, ws);
        if constexpr (HasBias)
          for (std::int64_t i = 0; i < count * kCout; ++i)
            ws.bias_grad.data()[i % kCout] += detail::lane_sum<S>(dy_images + i * kHw, kHw);
        for_image_runs<kJoinedImages>(count, [&]<int Images>(std::int64_t g) {
          ForwardWinograd::template transform_input_images<S, Images>(
              x + (first + g) * kCin * kInHw, ws.split.data(), ws.transformed.data(), kWinogradLd,
              g * kTiles);
          ForwardWinograd::template transform_output_gradient<S, Images>(
              kCout, dy_images + g * kCout * kHw, ws.product.data(), kWinogradLd, g * kTiles);
        });
        detail::winograd_add_weight_gradient(kPositions, kCout, kCin, count * kTiles,
                                             ws.product.data(), ws.transformed.data(), kWinogradLd,
                                             ws.transformed_weight_grad.data(),
                                             /*accumulate=*/first != begin);
        if (!dx) continue;
        for_image_runs<kJoinedGradientImages>(count, [&]<int Images>(std::int64_t g) {
          GradientWinograd::template transform_input_images<S, Images>(
              dy_images + g * kCout * kHw, ws.gradient_split.data(), ws.transformed.data(),
              kGradientWinogradLd, g * kGradientTiles);
        });
        detail::winograd_multiply(kPositions, kCin, kCout, count * kGradientTiles,
                                  winograd_flipped_.data(), ws.transformed.data(),
                                  ws.product.data(), kGradientWinogradLd);
        for (std::int64_t g = 0; g < count; ++g)
          GradientWinograd::template transform_output<false>(
              kCin, ws.product.data(), kGradientWinogradLd, g * kGradientTiles,
              dx + (first + g) * kCin * kInHw, static_cast<const S*>(nullptr));
      }
      // Folded back to 3x3 by each thread (the fold is linear), so that the calling thread sums
      // 9 values per kernel instead of 16 or 36.
      std::fill_n(ws.weight_grad.data(), kCout * kK, S(0));
      detail::winograd_fold_weight_gradient<kWinogradTile>(
          kCout, kCin, ws.transformed_weight_grad.data(), ws.weight_grad.data());
    });
    reduce_gradients(parts);
  }

  // Sums the threads' partial gradients in a fixed order (reproducible) into the parameters'.
  void reduce_gradients(int parts) {
    weight_delta_.resize(weight_.grad.shape());
    S* dw = weight_delta_.data();
    std::fill_n(dw, kCout * kK, S(0));
    bias_delta_.resize({kCout});
    S* db = bias_delta_.data();
    std::fill_n(db, kCout, S(0));
    for (int t = 0; t < parts; ++t) {
      const Workspace& ws = workspaces_[static_cast<std::size_t>(t)];
      const S* partial = ws.weight_grad.data();
      if constexpr (kWindowedWeightGradient && !kWinograd) {
        for (std::int64_t c = 0; c < kCout; ++c)
          for (std::int64_t i = 0; i < kK; ++i) dw[c * kK + i] += partial[i * kCoutPadded + c];
      } else {
        for (std::int64_t i = 0; i < kCout * kK; ++i) dw[i] += partial[i];
      }
      for (std::int64_t c = 0; c < kCout; ++c) db[c] += ws.bias_grad.data()[c];
    }
    detail::accumulate<T, S>(weight_.grad.view(), weight_delta_.view());
    if constexpr (HasBias) detail::accumulate<T, S>(bias_.grad.view(), bias_delta_.view());
  }

  // The output gradient of `count` images where the fused ReLU's output y is positive, into the
  // workspace (a group at a time, so that it is still in cache for the products that read it).
  static const S* relu_masked(const T* y, const S* dy, std::int64_t count, Workspace& ws) {
    S* masked = ws.masked_grad.data();
    for (std::int64_t i = 0; i < count * kCout * kHw; ++i)
      masked[i] = detail::to_compute_value<S>(y[i]) > S(0) ? dy[i] : S(0);
    return masked;
  }

  // flipped_[ci][co][kh][kw] = W[co][ci][k-1-kh][k-1-kw]: the kernel of the input-gradient
  // convolution.
  void flip_weights(const S* w) {
    flipped_.resize({kCin, kGradientK});
    S* f = flipped_.data();
    for (std::int64_t co = 0; co < kCout; ++co)
      for (std::int64_t ci = 0; ci < kCin; ++ci)
        for (std::int64_t kh = 0; kh < kKernel; ++kh)
          for (std::int64_t kw = 0; kw < kKernel; ++kw)
            f[ci * kGradientK + (co * kKernel + kh) * kKernel + kw] =
                w[((co * kCin + ci) * kKernel + (kKernel - 1 - kh)) * kKernel + (kKernel - 1 - kw)];
  }

  void prepare_workspaces(int threads) {
    if (workspaces_.size() >= static_cast<std::size_t>(threads)) return;
    workspaces_.resize(static_cast<std::size_t>(threads));
    for (Workspace& ws : workspaces_) {
      ws.bias_grad.resize({kCout});
      if constexpr (kWinograd) {
        // The split images' zero borders (storage comes zeroed) are never written.
        ws.split.resize({kJoinedImages * ForwardWinograd::kSplitSize});
        ws.gradient_split.resize({kJoinedGradientImages * GradientWinograd::kSplitSize});
        // Backward's input-gradient products reuse the weight gradient's buffers, done with by
        // then: four buffers per image would not stay in L2 together.
        ws.transformed.resize(
            {kPositions * std::max(detail::winograd_position_stride(kCin, kWinogradLd),
                                   detail::winograd_position_stride(kCout, kGradientWinogradLd))});
        ws.product.resize(
            {kPositions * std::max(detail::winograd_position_stride(kCout, kWinogradLd),
                                   detail::winograd_position_stride(kCin, kGradientWinogradLd))});
        ws.transformed_weight_grad.resize({kPositions * kCout * kCin});
        ws.weight_grad.resize({kCout, kK});
        if constexpr (FusedRelu) ws.masked_grad.resize({kWinogradGroup * kCout * kHw});
        continue;
      }
      ws.product.resize(
          {kCout, std::max(kGroup * kHw, kIndirectForward ? ForwardIndirect::kProductLd : 0)});
      if constexpr (kNeedsColumns) ws.col.resize({kK, kGroup * kHw});
      if constexpr (kWindowedWeightGradient) {
        ws.weight_grad.resize({kK, kCoutPadded});  // transposed
        ws.out_grad_t.resize({ForwardIndirect::kColumns, kCoutPadded});
      } else {
        ws.weight_grad.resize({kCout, kK});
      }
      if constexpr (FusedRelu) ws.masked_grad.resize({kGroup * kCout * kHw});
      ws.padded.resize({detail::padded_size(kWindow)});
      if constexpr (kIndirectGradient) {
        ws.gradient_product.resize({kCin, GradientIndirect::kProductLd});
        ws.gradient_padded.resize({detail::padded_size(kGradientWindow)});
      } else if constexpr (kGradientAsConvolution) {
        ws.gradient_col.resize({kGradientK, kGroup * kInHw});
        ws.gradient_product.resize({kCin, kGroup * kInHw});
        ws.gradient_padded.resize({detail::padded_size(kGradientWindow)});
      }
    }
  }

  using Parameters = WeightAndBias<T, Device, HasBias>;
  using Parameters::bias_;
  using Parameters::weight_;
  std::vector<Workspace> workspaces_;
  tensor::Tensor<S, Device> flipped_;
  tensor::Tensor<S, Device> winograd_weights_, winograd_flipped_;
  tensor::Tensor<S, Device> in_scratch_, weight_scratch_, bias_scratch_, out_scratch_;
  tensor::Tensor<S, Device> grad_out_scratch_, grad_in_scratch_, weight_delta_, bias_delta_;
};

// torch.nn.Conv2d(in, OutChannels, Kernel, stride=Stride, padding=Padding, bias=HasBias).
template <std::size_t OutChannels, std::size_t Kernel, std::size_t Stride = 1,
          std::size_t Padding = 0, bool HasBias = true>
struct Conv2d {
  template <class In, class T, class Device>
  using Bind = Conv2dLayer<OutChannels, Kernel, Stride, Padding, HasBias, false, In, T, Device>;
};

// Conv2d followed by torch.relu, fused, with the convolution's parameter names: the ReLU is applied
// as the products are copied out, and its mask to each group's output gradient while it is in
// cache, instead of a separate layer reading and writing the whole activation once more each way.
template <std::size_t OutChannels, std::size_t Kernel, std::size_t Stride = 1,
          std::size_t Padding = 0, bool HasBias = true>
struct Conv2dReLU {
  template <class In, class T, class Device>
  using Bind = Conv2dLayer<OutChannels, Kernel, Stride, Padding, HasBias, true, In, T, Device>;
};

}  // namespace coltrain::nn
