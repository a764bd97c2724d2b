#pragma once
// Kernels of MaxPool2d, AvgPool2d and GlobalAvgPool on NCHW tensors (the layers are in
// cuda/nn/pooling.cuh), with the CPU layers' semantics to the bit where the arithmetic allows:
// - windowed pooling: one thread per output forward; backward gathers, one thread per input
//   element, over the outputs whose windows cover it in increasing output order, which is the
//   order in which the CPU layer scatters into that element: the same sums, no atomics. Max
//   pooling keeps, per output, the winner's position inside its window (one byte for windows of up
//   to 256 elements).
// - global average pooling: a group of lanes per plane reads it in 16-byte vectors and reduces it
//   by shuffles; backward writes each plane's gradient share in vectors.

#if !defined(__CUDACC__)
#error "coltrain/cuda/pooling_kernels.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/cuda/launch.cuh>

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace coltrain::cuda::pooling {

inline constexpr unsigned kFullMask = 0xffffffffu;

// The compile-time geometry of a windowed pooling: input H x W, output OutH x OutW, square window.
template <std::int64_t kH, std::int64_t kW, std::int64_t kKernel, std::int64_t kStride,
          std::int64_t kPadding>
struct Geometry {
  static constexpr std::int64_t kHeight = kH, kWidth = kW;
  static constexpr std::int64_t kKernelSize = kKernel, kStrideSize = kStride;
  static constexpr std::int64_t kPaddingSize = kPadding;
  static constexpr std::int64_t kOutH = (kH + 2 * kPadding - kKernel) / kStride + 1;
  static constexpr std::int64_t kOutW = (kW + 2 * kPadding - kKernel) / kStride + 1;
  static constexpr std::int64_t kInPlane = kH * kW, kOutPlane = kOutH * kOutW;

  // The outputs along one axis whose windows cover input coordinate i: [first, last].
  __device__ static std::int64_t first_covering(std::int64_t i) {
    const std::int64_t low = i + kPadding - kKernel + 1;  // o * kStride >= low
    return low <= 0 ? 0 : (low + kStride - 1) / kStride;
  }
  __device__ static std::int64_t last_covering(std::int64_t i, std::int64_t outputs) {
    const std::int64_t high = (i + kPadding) / kStride;  // o * kStride <= i + kPadding
    return high < outputs - 1 ? high : outputs - 1;
  }
};

// Where in its window the maximum of an output was: kh * kKernel + kw.
template <std::int64_t kKernel>
using WindowIndex = std::conditional_t<(kKernel * kKernel <= 256), std::uint8_t, std::int32_t>;

// Widening with the bare conversion instructions: a NaN stays a NaN, though not with its payload,
// which no arithmetic here keeps anyway (stores round through T's constructor, as on the host).
__device__ inline float to_float(float value) { return value; }
__device__ inline float to_float(half value) {
  return __half2float(__ushort_as_half(value.bits()));
}
__device__ inline float to_float(bfloat16 value) {
  return __uint_as_float(static_cast<unsigned>(value.bits()) << 16);
}

template <class T, class G>
__global__ void max_pool_forward_kernel(const T* x, T* y, WindowIndex<G::kKernelSize>* argmax,
                                        std::int64_t outputs) {
  for (std::int64_t o = grid_index(); o < outputs; o += grid_stride()) {
    const std::int64_t plane = o / G::kOutPlane;
    const std::int64_t oh = (o - plane * G::kOutPlane) / G::kOutW;
    const std::int64_t ow = o - plane * G::kOutPlane - oh * G::kOutW;
    const T* src = x + plane * G::kInPlane;
    // As the CPU layer: the first maximum wins, and a NaN propagates (the first NaN).
    float best = 0.f;
    std::int64_t best_index = -1, best_window = 0;
#pragma unroll
    for (std::int64_t kh = 0; kh < G::kKernelSize; ++kh) {
      const std::int64_t ih = oh * G::kStrideSize - G::kPaddingSize + kh;
      if (G::kPaddingSize > 0 && (ih < 0 || ih >= G::kHeight)) continue;
#pragma unroll
      for (std::int64_t kw = 0; kw < G::kKernelSize; ++kw) {
        const std::int64_t iw = ow * G::kStrideSize - G::kPaddingSize + kw;
        if (G::kPaddingSize > 0 && (iw < 0 || iw >= G::kWidth)) continue;
        const float v = to_float(src[ih * G::kWidth + iw]);
        const bool take = best_index < 0 || v > best || (v != v && best == best);
        best = take ? v : best;
        best_index = take ? ih * G::kWidth + iw : best_index;
        best_window = take ? kh * G::kKernelSize + kw : best_window;
      }
    }
    y[o] = src[best_index];
    argmax[o] = static_cast<WindowIndex<G::kKernelSize>>(best_window);
  }
}

template <class T, class G>
__global__ void max_pool_backward_kernel(const T* dy, const WindowIndex<G::kKernelSize>* argmax,
                                         T* dx, std::int64_t inputs) {
  for (std::int64_t i = grid_index(); i < inputs; i += grid_stride()) {
    const std::int64_t plane = i / G::kInPlane;
    const std::int64_t ih = (i - plane * G::kInPlane) / G::kWidth;
    const std::int64_t iw = i - plane * G::kInPlane - ih * G::kWidth;
    const std::int64_t oh_end = G::last_covering(ih, G::kOutH) + 1;
    const std::int64_t ow_end = G::last_covering(iw, G::kOutW) + 1;
    float sum = 0.f;
    for (std::int64_t oh = G::first_covering(ih); oh < oh_end; ++oh)
      for (std::int64_t ow = G::first_covering(iw); ow < ow_end; ++ow) {
        const std::int64_t o = (plane * G::kOutH + oh) * G::kOutW + ow;
        const std::int64_t window =
            (ih - (oh * G::kStrideSize - G::kPaddingSize)) * G::kKernelSize +
            (iw - (ow * G::kStrideSize - G::kPaddingSize));
        if (argmax[o] == window) sum += to_float(dy[o]);
      }
    dx[i] = T(sum);
  }
}

// The backward pass of windows that tile the input (stride = kernel, no padding), as MnistConvNet's
// 2x2 pooling: each input lies in at most one window, so one thread per output writes its whole
// window (the gradient at the winner, zeros elsewhere) with no gather and no sum. Indices are
// 32-bit: the 64-bit divisions of the general kernel cost it several times its memory time.
template <class T, class G>
__global__ void max_pool_backward_tiled_kernel(const T* dy,
                                               const WindowIndex<G::kKernelSize>* argmax, T* dx,
                                               std::uint32_t outputs) {
  constexpr auto kOutPlane = static_cast<std::uint32_t>(G::kOutPlane);
  constexpr auto kOutW = static_cast<std::uint32_t>(G::kOutW);
  constexpr int kK = static_cast<int>(G::kKernelSize);
  const std::uint32_t stride = gridDim.x * blockDim.x;
  for (std::uint32_t o = blockIdx.x * blockDim.x + threadIdx.x; o < outputs; o += stride) {
    const std::uint32_t plane = o / kOutPlane;
    const std::uint32_t oh = (o - plane * kOutPlane) / kOutW;
    const std::uint32_t ow = o - plane * kOutPlane - oh * kOutW;
    const float g = to_float(dy[o]);
    const int winner = static_cast<int>(argmax[o]);
    T* window = dx + static_cast<std::int64_t>(plane) * G::kInPlane +
                static_cast<std::int64_t>(oh) * kK * G::kWidth + static_cast<std::int64_t>(ow) * kK;
#pragma unroll
    for (int kh = 0; kh < kK; ++kh)
#pragma unroll
      for (int kw = 0; kw < kK; ++kw)
        window[kh * G::kWidth + kw] = T(kh * kK + kw == winner ? g : 0.f);
  }
}

// Average pooling counts the zero padding (count_include_pad), so every window divides by K * K.
template <class T, class G>
__global__ void avg_pool_forward_kernel(const T* x, T* y, std::int64_t outputs) {
  const float scale = 1.f / static_cast<float>(G::kKernelSize * G::kKernelSize);
  for (std::int64_t o = grid_index(); o < outputs; o += grid_stride()) {
    const std::int64_t plane = o / G::kOutPlane;
    const std::int64_t oh = (o - plane * G::kOutPlane) / G::kOutW;
    const std::int64_t ow = o - plane * G::kOutPlane - oh * G::kOutW;
    const T* src = x + plane * G::kInPlane;
    float sum = 0.f;
#pragma unroll
    for (std::int64_t kh = 0; kh < G::kKernelSize; ++kh) {
      const std::int64_t ih = oh * G::kStrideSize - G::kPaddingSize + kh;
      if (G::kPaddingSize > 0 && (ih < 0 || ih >= G::kHeight)) continue;
#pragma unroll
      for (std::int64_t kw = 0; kw < G::kKernelSize; ++kw) {
        const std::int64_t iw = ow * G::kStrideSize - G::kPaddingSize + kw;
        if (G::kPaddingSize > 0 && (iw < 0 || iw >= G::kWidth)) continue;
        sum += to_float(src[ih * G::kWidth + iw]);
      }
    }
    y[o] = T(sum * scale);
  }
}

template <class T, class G>
__global__ void avg_pool_backward_kernel(const T* dy, T* dx, std::int64_t inputs) {
  const float scale = 1.f / static_cast<float>(G::kKernelSize * G::kKernelSize);
  for (std::int64_t i = grid_index(); i < inputs; i += grid_stride()) {
    const std::int64_t plane = i / G::kInPlane;
    const std::int64_t ih = (i - plane * G::kInPlane) / G::kWidth;
    const std::int64_t iw = i - plane * G::kInPlane - ih * G::kWidth;
    const std::int64_t oh_end = G::last_covering(ih, G::kOutH) + 1;
    const std::int64_t ow_end = G::last_covering(iw, G::kOutW) + 1;
    float sum = 0.f;
    for (std::int64_t oh = G::first_covering(ih); oh < oh_end; ++oh)
      for (std::int64_t ow = G::first_covering(iw); ow < ow_end; ++ow)
        // Rounded product, then sum, as the CPU layer: no fused multiply-add.
        sum += __fmul_rn(to_float(dy[(plane * G::kOutH + oh) * G::kOutW + ow]), scale);
    dx[i] = T(sum);
  }
}

template <class T, class G>
void max_pool_forward(const T* x, T* y, WindowIndex<G::kKernelSize>* argmax, std::int64_t planes,
                      cudaStream_t stream) {
  const std::int64_t outputs = planes * G::kOutPlane;
  if (outputs == 0) return;
  max_pool_forward_kernel<kernel_t<T>, G>
      <<<blocks_for(outputs), kThreadsPerBlock, 0, stream>>>(x, y, argmax, outputs);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

template <class T, class G>
void max_pool_backward(const T* dy, const WindowIndex<G::kKernelSize>* argmax, T* dx,
                       std::int64_t planes, cudaStream_t stream) {
  const std::int64_t inputs = planes * G::kInPlane;
  if (inputs == 0) return;
  constexpr bool kTiled = G::kStrideSize == G::kKernelSize && G::kPaddingSize == 0;
  const std::int64_t outputs = planes * G::kOutPlane;
  if (kTiled && outputs < (std::int64_t{1} << 31)) {
    // Rows and columns past the last whole window get no gradient.
    if (G::kHeight % G::kKernelSize != 0 || G::kWidth % G::kKernelSize != 0)
      COLTRAIN_CHECK_CUDA(cudaMemsetAsync(dx, 0, inputs * sizeof(T), stream));
    max_pool_backward_tiled_kernel<kernel_t<T>, G>
        <<<blocks_for(outputs), kThreadsPerBlock, 0, stream>>>(dy, argmax, dx,
                                                               static_cast<std::uint32_t>(outputs));
  } else {
    max_pool_backward_kernel<kernel_t<T>, G>
        <<<blocks_for(inputs), kThreadsPerBlock, 0, stream>>>(dy, argmax, dx, inputs);
  }
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

template <class T, class G>
void avg_pool_forward(const T* x, T* y, std::int64_t planes, cudaStream_t stream) {
  const std::int64_t outputs = planes * G::kOutPlane;
  if (outputs == 0) return;
  avg_pool_forward_kernel<kernel_t<T>, G>
      <<<blocks_for(outputs), kThreadsPerBlock, 0, stream>>>(x, y, outputs);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

template <class T, class G>
void avg_pool_backward(const T* dy, T* dx, std::int64_t planes, cudaStream_t stream) {
  const std::int64_t inputs = planes * G::kInPlane;
  if (inputs == 0) return;
  avg_pool_backward_kernel<kernel_t<T>, G>
      <<<blocks_for(inputs), kThreadsPerBlock, 0, stream>>>(dy, dx, inputs);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

// ---- Global average pooling ----

using detail::Pack;
using detail::widest_vector;

// Lanes that share a plane: a power of two up to 32, at most one per vector of the plane.
template <std::int64_t kVectorsPerPlane>
COLTRAIN_HOST_DEVICE constexpr int lanes_per_plane() {
  int lanes = 1;
  while (lanes < 32 && 2 * lanes <= kVectorsPerPlane) lanes *= 2;
  return lanes;
}

inline constexpr int kGlobalThreads = 256;

template <class T, int kVector, std::int64_t kPlane>
__global__ void __launch_bounds__(kGlobalThreads)
    global_avg_pool_forward_kernel(const T* x, T* y, std::int64_t planes) {
  constexpr std::int64_t kVectors = kPlane / kVector;
  constexpr int kLanes = lanes_per_plane<kVectors>();
  using P = Pack<T, kVector>;
  // Every thread reaches the shuffles, also those past the last plane (they add nothing).
  const std::int64_t thread = grid_index();
  const std::int64_t plane = thread / kLanes;
  const int lane = static_cast<int>(thread % kLanes);
  float sum = 0.f;
  if (plane < planes) {
    const P* src = reinterpret_cast<const P*>(x + plane * kPlane);
    for (std::int64_t v = lane; v < kVectors; v += kLanes) {
      const P p = src[v];
#pragma unroll
      for (int i = 0; i < kVector; ++i) sum += to_float(p.v[i]);
    }
  }
  for (int offset = kLanes / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(kFullMask, sum, offset);
  if (plane < planes && lane == 0) y[plane] = T(sum / static_cast<float>(kPlane));
}

template <class T, int kVector, std::int64_t kPlane>
__global__ void global_avg_pool_backward_kernel(const T* dy, T* dx, std::int64_t vectors) {
  constexpr std::int64_t kVectors = kPlane / kVector;
  using P = Pack<T, kVector>;
  for (std::int64_t v = grid_index(); v < vectors; v += grid_stride()) {
    // As the CPU layer: the share is rounded to T once, then copied over the plane.
    const T share = T(to_float(dy[v / kVectors]) / static_cast<float>(kPlane));
    P p;
#pragma unroll
    for (int i = 0; i < kVector; ++i) p.v[i] = share;
    reinterpret_cast<P*>(dx)[v] = p;
  }
}

template <class T>
bool is_aligned(const T* p, int vector) {
  return reinterpret_cast<std::uintptr_t>(p) % (sizeof(T) * vector) == 0;
}

template <class T, std::int64_t kPlane>
void global_avg_pool_forward(const T* x, T* y, std::int64_t planes, cudaStream_t stream) {
  if (planes == 0) return;
  const auto launch = [&](auto vector) {
    constexpr int kVector = decltype(vector)::value;
    constexpr int kLanes = lanes_per_plane<kPlane / kVector>();
    const std::int64_t threads = planes * kLanes;
    const auto blocks = static_cast<unsigned>((threads + kGlobalThreads - 1) / kGlobalThreads);
    global_avg_pool_forward_kernel<kernel_t<T>, kVector, kPlane>
        <<<blocks, kGlobalThreads, 0, stream>>>(x, y, planes);
    COLTRAIN_CHECK_CUDA_LAUNCH();
  };
  constexpr int kWide = widest_vector<T, kPlane>();
  if (is_aligned(x, kWide))
    launch(std::integral_constant<int, kWide>{});
  else
    launch(std::integral_constant<int, 1>{});
}

template <class T, std::int64_t kPlane>
void global_avg_pool_backward(const T* dy, T* dx, std::int64_t planes, cudaStream_t stream) {
  if (planes == 0) return;
  const auto launch = [&](auto vector) {
    constexpr int kVector = decltype(vector)::value;
    const std::int64_t vectors = planes * (kPlane / kVector);
    global_avg_pool_backward_kernel<kernel_t<T>, kVector, kPlane>
        <<<blocks_for(vectors), kThreadsPerBlock, 0, stream>>>(dy, dx, vectors);
    COLTRAIN_CHECK_CUDA_LAUNCH();
  };
  constexpr int kWide = widest_vector<T, kPlane>();
  if (is_aligned(dx, kWide))
    launch(std::integral_constant<int, kWide>{});
  else
    launch(std::integral_constant<int, 1>{});
}

}  // namespace coltrain::cuda::pooling
