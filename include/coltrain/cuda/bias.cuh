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
#include <coltrain/cuda/launch.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

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

template <class T, bool HasBias, bool Relu>
__global__ void add_bias_kernel(T* out, const T* bias, ChannelShape shape) {
  const std::int64_t total = shape.numel();
  for (std::int64_t i = grid_index(); i < total; i += grid_stride()) {
    float v = static_cast<float>(out[i]);
    if constexpr (HasBias) v += static_cast<float>(bias[(i / shape.inner) % shape.channels]);
    if constexpr (Relu) v = relu(v);
    out[i] = T(v);
  }
}

// masked[i] = grad_out[i] where out[i] > 0, else 0.
template <class T>
__global__ void relu_mask_kernel(const T* out, const T* grad_out, T* masked, std::int64_t total) {
  for (std::int64_t i = grid_index(); i < total; i += grid_stride())
    masked[i] = static_cast<float>(out[i]) > 0.0f ? grad_out[i] : T(0.0f);
}

// Block b sums slice b % slices of channel b / slices (values [slice * per_slice, + per_slice) of
// the channel's count x inner, numbered n * inner + i) into partials[b]. With Mask, the values are
// first masked by out > 0 and written to `masked`.
template <class T, bool Mask>
__global__ void bias_grad_partials_kernel(const T* out, const T* grad_out, T* masked,
                                          ChannelShape shape, std::int64_t slices,
                                          std::int64_t per_slice, float* partials) {
  const std::int64_t channel = blockIdx.x / slices;
  const std::int64_t begin = (blockIdx.x % slices) * per_slice;
  const std::int64_t stop = begin + per_slice;
  const std::int64_t end = stop < shape.per_channel() ? stop : shape.per_channel();
  float sum = 0.0f;
  for (std::int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const std::int64_t n = j / shape.inner;
    const std::int64_t at = (n * shape.channels + channel) * shape.inner + (j - n * shape.inner);
    float g = static_cast<float>(grad_out[at]);
    if constexpr (Mask) {
      if (!(static_cast<float>(out[at]) > 0.0f)) g = 0.0f;
      masked[at] = T(g);
    }
    sum += g;
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

template <class T, bool Mask>
void launch_bias_grad(const T* out, const T* grad_out, T* masked, const ChannelShape& shape,
                      T* grad_bias, float* partials, cudaStream_t stream) {
  const std::int64_t slices = bias_grad_slices(shape);
  const std::int64_t per_slice = (shape.per_channel() + slices - 1) / slices;
  if (shape.channels * slices > INT_MAX)
    throw InvalidArgument("coltrain::cuda bias gradient: " + std::to_string(shape.channels) +
                          " channels are more than a grid holds");
  bias_grad_partials_kernel<T, Mask>
      <<<static_cast<unsigned>(shape.channels * slices), kThreadsPerBlock, 0, stream>>>(
          out, grad_out, masked, shape, slices, per_slice, partials);
  COLTRAIN_CHECK_CUDA_LAUNCH();
  add_partials_kernel<T><<<blocks_for(shape.channels), kThreadsPerBlock, 0, stream>>>(
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
  const unsigned blocks = blocks_for(total);
  constexpr unsigned threads = kThreadsPerBlock;
  if (bias && relu)
    detail::add_bias_kernel<T, true, true><<<blocks, threads, 0, stream>>>(out, bias, shape);
  else if (bias)
    detail::add_bias_kernel<T, true, false><<<blocks, threads, 0, stream>>>(out, bias, shape);
  else
    detail::add_bias_kernel<T, false, true><<<blocks, threads, 0, stream>>>(out, bias, shape);
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
  detail::relu_mask_kernel<T>
      <<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(out, grad_out, masked, total);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

}  // namespace coltrain::cuda
