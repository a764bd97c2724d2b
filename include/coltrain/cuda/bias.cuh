#pragma once
// Bias add and its gradient on the device, for tensors seen as [count, channels, inner]: an NCHW
// batch (count = N, inner = H*W) or a batch of rows (count = N, channels = F, inner = 1).
//
// The forward pass adds bias[c] (and applies a fused ReLU) in place. The gradient is a per-channel
// sum over count x inner values, accumulated in float in two passes: blocks of (channel, slice)
// write partial sums to a float scratch, then one thread per channel adds its slices in a fixed
// order to the gradient. No atomics, so the result is the same bits on every run. The ReLU backward
// pass (grad where out > 0) can be fused into the first pass, which then also writes the masked
// gradient for the convolution's own backward products.

#if !defined(__CUDACC__)
#error "coltrain/cuda/bias.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/cuda/launch.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

namespace coltrain::cuda {

// A tensor seen as [count, channels, inner].
struct ChannelShape {
  std::int64_t count = 0, channels = 0, inner = 0;

  COLTRAIN_HOST_DEVICE std::int64_t numel() const { return count * channels * inner; }
  // Values summed into each channel's gradient.
  COLTRAIN_HOST_DEVICE std::int64_t per_channel() const { return count * inner; }
};

namespace detail {

inline constexpr std::int64_t kBiasGradTargetBlocks = 4 * 132;  // a few per SM of an H100
inline constexpr std::int64_t kBiasGradMinPerSlice = 1024;
inline constexpr std::int64_t kBiasGradMaxSlices = 64;

// The sum of v over the block, valid in thread 0; blockDim.x a multiple of 32, at most 1024.
__device__ inline float channel_block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / 32 ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

// NaN passes, as torch.relu (and the CPU layers) let it.
__device__ inline float relu(float v) { return v < 0.0f ? 0.0f : v; }

// Elements go V at a time (inner % V == 0, so a pack never straddles two channels), indexed in
// Index: 32-bit whenever the tensor allows, because the channel of each pack takes a division, and
// a 64-bit one costs several times the memory traffic it serves.
template <class T, bool HasBias, bool Relu, int V, class Index>
__global__ void add_bias_kernel(T* out, const T* bias, Index packs, Index inner_packs,
                                Index channels) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += stride) {
    Pack<T, V> pack = load<V>(out + static_cast<std::int64_t>(i) * V);
    const float b = HasBias ? static_cast<float>(bias[(i / inner_packs) % channels]) : 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float v = static_cast<float>(pack.v[k]);
      if constexpr (HasBias) v += b;
      if constexpr (Relu) v = relu(v);
      pack.v[k] = T(v);
    }
    store<V>(out + static_cast<std::int64_t>(i) * V, pack);
  }
}

// masked[i] = grad_out[i] where out[i] > 0, else 0.
template <class T>
__global__ void relu_mask_kernel(const T* out, const T* grad_out, T* masked, std::int64_t total) {
  for (std::int64_t i = grid_index(); i < total; i += grid_stride())
    masked[i] = static_cast<float>(out[i]) > 0.0f ? grad_out[i] : T(0.0f);
}

// Block b sums slice b % slices of channel b / slices (packs [slice * per_slice, + per_slice) of
// the channel's count x inner values, numbered n * inner + i, V values a pack) into partials[b].
// With Mask, the values are first masked by out > 0 and written to `masked`.
template <class T, bool Mask, int V, class Index>
__global__ void bias_grad_partials_kernel(const T* out, const T* grad_out, T* masked,
                                          Index channels, Index inner_packs, Index channel_packs,
                                          Index slices, Index per_slice, float* partials) {
  const Index channel = blockIdx.x / slices;
  const Index begin = (blockIdx.x % slices) * per_slice;
  const Index end = min(begin + per_slice, channel_packs);
  float sum = 0.0f;
  for (Index j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const Index n = j / inner_packs;
    const std::int64_t at =
        (static_cast<std::int64_t>(n * channels + channel) * inner_packs + (j - n * inner_packs)) *
        V;
    Pack<T, V> g = load<V>(grad_out + at);
    if constexpr (Mask) {
      const Pack<T, V> o = load<V>(out + at);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (!(static_cast<float>(o.v[k]) > 0.0f)) g.v[k] = T(0.0f);
      store<V>(masked + at, g);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) sum += static_cast<float>(g.v[k]);
  }
  sum = channel_block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// grad_bias[c] += the slices of channel c, added in order.
template <class T>
__global__ void add_partials_kernel(const float* partials, std::int64_t slices,
                                    std::int64_t channels, T* grad_bias) {
  for (std::int64_t c = grid_index(); c < channels; c += grid_stride()) {
    float sum = 0.0f;
    for (std::int64_t s = 0; s < slices; ++s) sum += partials[c * slices + s];
    grad_bias[c] = T(static_cast<float>(grad_bias[c]) + sum);
  }
}

inline std::int64_t max_bias_grad_slices(std::int64_t channels) {
  if (channels <= 0) return 1;
  const std::int64_t wanted = (kBiasGradTargetBlocks + channels - 1) / channels;
  return std::clamp<std::int64_t>(wanted, 1, kBiasGradMaxSlices);
}

inline std::int64_t bias_grad_slices(const ChannelShape& shape) {
  const std::int64_t useful =
      (shape.per_channel() + kBiasGradMinPerSlice - 1) / kBiasGradMinPerSlice;
  return std::clamp<std::int64_t>(useful, 1, max_bias_grad_slices(shape.channels));
}

// The widest pack (up to 16 bytes) that divides `inner` and that every pointer is aligned to.
template <class T, class... Pointers>
int pack_width(std::int64_t inner, const Pointers*... pointers) {
  for (int v = static_cast<int>(kVectorBytes / sizeof(T)); v > 1; v /= 2) {
    const auto bytes = static_cast<std::uintptr_t>(v) * sizeof(T);
    if (inner % v == 0 &&
        ((pointers == nullptr || reinterpret_cast<std::uintptr_t>(pointers) % bytes == 0) && ...))
      return v;
  }
  return 1;
}

// Calls f(std::integral_constant<int, V>{}) for the pack width chosen at run time.
template <class T, class F>
void with_pack_width(int width, F&& f) {
  switch (width) {
    case 8:
      if constexpr (sizeof(T) <= 2) {
        f(std::integral_constant<int, 8>{});
        return;
      }
      break;
    case 4:
      if constexpr (sizeof(T) <= 4) {
        f(std::integral_constant<int, 4>{});
        return;
      }
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      return;
    default:
      break;
  }
  f(std::integral_constant<int, 1>{});
}

// Calls f(Index{}) with 32-bit indices when `elements` fit them (with room for a grid stride).
template <class F>
void with_index_type(std::int64_t elements, F&& f) {
  if (elements < (std::int64_t{1} << 31))
    f(std::uint32_t{});
  else
    f(std::int64_t{});
}

template <class T, bool Mask>
void launch_bias_grad(const T* out, const T* grad_out, T* masked, const ChannelShape& shape,
                      T* grad_bias, float* partials, cudaStream_t stream) {
  const std::int64_t slices = bias_grad_slices(shape);
  if (shape.channels * slices > INT_MAX)
    throw InvalidArgument("coltrain::cuda bias gradient: " + std::to_string(shape.channels) +
                          " channels are more than a grid holds");
  const int width = pack_width<T>(shape.inner, out, grad_out, masked);
  with_pack_width<T>(width, [&](auto v) {
    constexpr int V = decltype(v)::value;
    with_index_type(shape.numel(), [&](auto index) {
      using Index = decltype(index);
      const std::int64_t channel_packs = shape.per_channel() / V;
      const std::int64_t per_slice = (channel_packs + slices - 1) / slices;
      bias_grad_partials_kernel<kernel_t<T>, Mask, V, Index>
          <<<static_cast<unsigned>(shape.channels * slices), kThreadsPerBlock, 0, stream>>>(
              out, grad_out, masked, static_cast<Index>(shape.channels),
              static_cast<Index>(shape.inner / V), static_cast<Index>(channel_packs),
              static_cast<Index>(slices), static_cast<Index>(per_slice), partials);
    });
  });
  COLTRAIN_CHECK_CUDA_LAUNCH();
  add_partials_kernel<kernel_t<T>><<<blocks_for(shape.channels), kThreadsPerBlock, 0, stream>>>(
      partials, slices, shape.channels, grad_bias);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

}  // namespace detail

// Floats of scratch that the gradient functions below need for `channels` channels, whatever the
// count and inner size.
inline std::int64_t bias_grad_scratch_floats(std::int64_t channels) {
  return channels * detail::max_bias_grad_slices(channels);
}

// out[n][c][i] += bias[c], then ReLU when `relu`, in place; `bias` may be null (ReLU alone).
template <class T>
void add_bias(T* out, const T* bias, ChannelShape shape, bool relu, cudaStream_t stream) {
  const std::int64_t total = shape.numel();
  if (total == 0 || (bias == nullptr && !relu)) return;
  const int width = detail::pack_width<T>(shape.inner, out);
  detail::with_pack_width<T>(width, [&](auto v) {
    constexpr int V = decltype(v)::value;
    detail::with_index_type(total, [&](auto index) {
      using Index = decltype(index);
      const auto packs = static_cast<Index>(total / V);
      const auto inner_packs = static_cast<Index>(shape.inner / V);
      const auto channels = static_cast<Index>(shape.channels);
      const unsigned blocks = blocks_for(total / V);
      if (bias && relu)
        detail::add_bias_kernel<kernel_t<T>, true, true, V, Index>
            <<<blocks, kThreadsPerBlock, 0, stream>>>(out, bias, packs, inner_packs, channels);
      else if (bias)
        detail::add_bias_kernel<kernel_t<T>, true, false, V, Index>
            <<<blocks, kThreadsPerBlock, 0, stream>>>(out, bias, packs, inner_packs, channels);
      else
        detail::add_bias_kernel<kernel_t<T>, false, true, V, Index>
            <<<blocks, kThreadsPerBlock, 0, stream>>>(out, bias, packs, inner_packs, channels);
    });
  });
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

// grad_bias[c] += sum over n and i of grad_out[n][c][i]. `partials` holds
// bias_grad_scratch_floats(shape.channels) floats of device memory.
template <class T>
void add_bias_grad(const T* grad_out, ChannelShape shape, T* grad_bias, float* partials,
                   cudaStream_t stream) {
  if (shape.numel() == 0) return;
  detail::launch_bias_grad<T, false>(nullptr, grad_out, nullptr, shape, grad_bias, partials,
                                     stream);
}

// The backward pass of a ReLU applied to a bias add (or to anything): masked = grad_out where
// out > 0, else 0, with `out` the ReLU's output; then, when grad_bias is not null, grad_bias[c] +=
// the per-channel sums of masked, in the same pass. `partials` as for add_bias_grad (unused when
// grad_bias is null).
template <class T>
void relu_backward_add_bias_grad(const T* out, const T* grad_out, ChannelShape shape, T* masked,
                                 T* grad_bias, float* partials, cudaStream_t stream) {
  const std::int64_t total = shape.numel();
  if (total == 0) return;
  if (grad_bias) {
    detail::launch_bias_grad<T, true>(out, grad_out, masked, shape, grad_bias, partials, stream);
    return;
  }
  detail::relu_mask_kernel<kernel_t<T>>
      <<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(out, grad_out, masked, total);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

}  // namespace coltrain::cuda
