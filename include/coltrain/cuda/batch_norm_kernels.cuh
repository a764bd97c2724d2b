#pragma once
// Kernels of BatchNorm2d and BatchNormReLU2d on NCHW tensors (the layer is cuda/nn/batch_norm.cuh).
//
// Every kernel runs on a grid of (splits, channels) blocks: block (s, c) owns the s-th of `splits`
// equal slices of channel c's batch * plane values, read in 16-byte vectors. Splitting a channel
// fills the GPU at any channel count; the slices' partial results are combined in a fixed order by
// the next kernel, so the results are deterministic. Passes over the data:
//   forward, training:  statistics (read x), then normalise (read x, write y);
//   forward, eval:      normalise (read x, write y);
//   backward:           two sums (read x and dy), then dx (read x and dy, write dx).
// The second kernel of each pair starts by combining its channel's partials in one warp (every
// block does it; they are a few dozen values), and its first slice's block writes the channel's
// results (running statistics, saved statistics, parameter gradients), so there is no third launch.
// All statistics are computed in float, the per-channel constants in double as on the CPU.

#if !defined(__CUDACC__)
#error "coltrain/cuda/batch_norm_kernels.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/cuda/launch.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace coltrain::cuda::batch_norm {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr unsigned kFullMask = 0xffffffffu;
// Vectors each thread loads before using them: several loads in flight per thread hide latency.
inline constexpr int kUnroll = 4;
// Resident blocks per SM the kernels are compiled for (at most 64 registers per thread).
inline constexpr int kBlocksPerSm = 4;
// Blocks a launch aims for: one wave on an H100's 132 SMs. A fixed number rather than the
// device's, so that the results do not depend on the GPU.
inline constexpr std::int64_t kTargetBlocks = 132 * kBlocksPerSm;
// A slice gives each thread at least this many vectors, so that small tensors use fewer blocks.
inline constexpr std::int64_t kMinVectorsPerThread = 2;

// Count, mean and sum of squared deviations of a set of values (Chan et al.'s combinable form):
// the variance never comes from the difference of two large sums.
// In double: the saved mean must be good to far below a float ulp, or the weight gradient's sum of
// dy * (x - mean), which cancels heavily when the mean is large against the spread, inherits the
// mean's rounding times the sum of dy.
struct Moments {
  double count;
  double mean;
  double m2;
};

// Sum of the upstream gradient and of gradient * (x - mean) over a slice, in double: the weight's
// gradient is a sum with much cancellation, and float sums of it missed the CPU's (double) by 1e-5.
struct GradientSums {
  double dy;
  double dy_xc;
};

using detail::Pack;
using detail::widest_vector;

// Widening with the bare conversion instructions: a NaN stays a NaN, though not with its payload,
// which no arithmetic here keeps anyway (stores round through T's constructor, as on the host).
__device__ inline float to_float(float value) { return value; }
__device__ inline float to_float(half value) {
  return __half2float(__ushort_as_half(value.bits()));
}
__device__ inline float to_float(bfloat16 value) {
  return __uint_as_float(static_cast<unsigned>(value.bits()) << 16);
}
template <class T>
__device__ inline T from_float(float value) {
  return T(value);
}

// The normalised value before the ReLU; one function for forward and the backward mask, so both
// round alike.
__device__ inline float normalized(float x, float scale, float shift) {
  return fmaf(x, scale, shift);
}

// d(loss)/d(normalised value): dy, masked by the fused ReLU where the output is not positive. The
// output is recomputed and rounded to T exactly as forward stored it (same scale and shift, same
// instruction), which gives the mask that reading y would give without reading it.
template <class T, bool kFusedRelu>
__device__ inline float upstream_gradient(float x, float dy, float scale, float shift) {
  if constexpr (kFusedRelu) {
    const float y = to_float(from_float<T>(normalized(x, scale, shift)));
    return y > 0.f ? dy : 0.f;
  } else {
    return dy;
  }
}

__device__ inline Moments combine(Moments a, Moments b) {
  const double count = a.count + b.count;
  if (count == 0.0) return a;
  const double delta = b.mean - a.mean;
  const double weight_b = b.count / count;
  return {count, a.mean + delta * weight_b, a.m2 + b.m2 + delta * delta * a.count * weight_b};
}

__device__ inline Moments shuffle_down(Moments m, int offset) {
  return {__shfl_down_sync(kFullMask, m.count, offset), __shfl_down_sync(kFullMask, m.mean, offset),
          __shfl_down_sync(kFullMask, m.m2, offset)};
}
__device__ inline GradientSums shuffle_down(GradientSums s, int offset) {
  return {__shfl_down_sync(kFullMask, s.dy, offset), __shfl_down_sync(kFullMask, s.dy_xc, offset)};
}
__device__ inline GradientSums combine(GradientSums a, GradientSums b) {
  return {a.dy + b.dy, a.dy_xc + b.dy_xc};
}

// Lane 0 receives the combination of the warp's values, in a fixed tree.
template <class V>
__device__ inline V warp_combine(V value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value = combine(value, shuffle_down(value, offset));
  return value;
}

// Thread 0 receives the combination of the block's values; `empty` is the neutral value.
template <class V>
__device__ inline V block_combine(V value, V empty) {
  __shared__ V warp_values[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_combine(value);
  if (lane == 0) warp_values[warp] = value;
  __syncthreads();
  if (warp == 0) value = warp_combine(lane < kWarps ? warp_values[lane] : empty);
  return value;
}

// Lane 0 of the calling warp receives the combination of channel c's `splits` partials, each lane
// folding every 32nd in order, then the warp's tree: a fixed order, so a deterministic result.
template <class V>
__device__ inline V combine_partials(const V* partials, int c, int splits, V empty) {
  V value = empty;
  for (int s = threadIdx.x % 32; s < splits; s += 32)
    value = combine(value, partials[c * splits + s]);
  return warp_combine(value);
}

// Where a block's slice of its channel lies, in vectors, and where vector j of the channel is.
template <int kVector, std::int64_t kPlane>
struct ChannelSlice {
  static constexpr std::int64_t kVectorsPerPlane = kPlane / kVector;

  __device__ ChannelSlice(std::int64_t batch) {
    const std::int64_t total = batch * kVectorsPerPlane;
    begin = total * blockIdx.x / gridDim.x;
    end = total * (blockIdx.x + 1) / gridDim.x;
  }
  // Element offset of the channel's vector j in the NCHW tensor.
  __device__ std::int64_t offset(std::int64_t j) const {
    const std::int64_t sample = j / kVectorsPerPlane;
    const std::int64_t within = j - sample * kVectorsPerPlane;
    return (sample * gridDim.y + blockIdx.y) * kPlane + within * kVector;
  }

  std::int64_t begin = 0, end = 0;
};

// Calls f(offset, pack of a, pack of b) for every vector of the block's slice (b is read when
// kReadsB, else f gets a's pack twice), kUnroll vectors per thread loaded before any is used.
template <class T, int kVector, std::int64_t kPlane, bool kReadsB, class F>
__device__ inline void for_each_vector(std::int64_t batch, const T* a, const T* b, F&& f) {
  using P = Pack<T, kVector>;
  const ChannelSlice<kVector, kPlane> slice(batch);
  for (std::int64_t first = slice.begin + threadIdx.x; first < slice.end;
       first += kUnroll * kThreads) {
    P pa[kUnroll], pb[kUnroll];
    std::int64_t offsets[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t j = first + u * kThreads;
      offsets[u] = j < slice.end ? slice.offset(j) : -1;
      if (offsets[u] >= 0) {
        pa[u] = *reinterpret_cast<const P*>(a + offsets[u]);
        if constexpr (kReadsB) pb[u] = *reinterpret_cast<const P*>(b + offsets[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (offsets[u] < 0) continue;
      if constexpr (kReadsB)
        f(offsets[u], pa[u], pb[u]);
      else
        f(offsets[u], pa[u], pa[u]);
    }
  }
}

// Per-channel constants of the last forward pass, for backward: [4][channels].
// The mean is saved as a float and the float of what it misses (kSavedMeanLow), a double's worth.
enum SavedRow {
  kSavedMean = 0,
  kSavedInvStd = 1,
  kSavedScale = 2,
  kSavedShift = 3,
  kSavedMeanLow = 4
};
inline constexpr int kSavedRows = 5;

template <class T>
struct ForwardArgs {
  const T* x;
  T* y;
  std::int64_t batch;
  int channels;
  const T* weight;
  const T* bias;
  float* running_mean;
  float* running_var;
  std::int64_t* batches_tracked;
  float* saved;       // [kSavedRows][channels]
  Moments* partials;  // [channels][splits], training only
  double momentum;
  double eps;
};

template <class T>
struct BackwardArgs {
  const T* x;
  const T* dy;
  T* dx;  // null: only the parameter gradients
  std::int64_t batch;
  int channels;
  bool training;
  const T* weight;
  T* weight_grad;
  T* bias_grad;
  const float* saved;
  GradientSums* partials;  // [channels][splits]
};

template <class T, int kVector, std::int64_t kPlane>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) statistics_kernel(ForwardArgs<T> args) {
  Moments m{0.0, 0.0, 0.0};
  for_each_vector<T, kVector, kPlane, false>(
      args.batch, args.x, static_cast<const T*>(nullptr),
      [&](std::int64_t, const Pack<T, kVector>& p, const Pack<T, kVector>&) {
        // The vector's own mean and squared deviations, exact to rounding, then one combine.
        double v[kVector], sum = 0.0;
#pragma unroll
        for (int i = 0; i < kVector; ++i) {
          v[i] = to_float(p.v[i]);
          sum += v[i];
        }
        const double mean = sum * (1.0 / kVector);
        double m2 = 0.0;
#pragma unroll
        for (int i = 0; i < kVector; ++i) m2 = fma(v[i] - mean, v[i] - mean, m2);
        m = combine(m, Moments{static_cast<double>(kVector), mean, m2});
      });
  m = block_combine(m, Moments{0.0, 0.0, 0.0});
  if (threadIdx.x == 0) args.partials[blockIdx.y * gridDim.x + blockIdx.x] = m;
}

// kBatchStatistics: training (statistics from the partials; running statistics move); otherwise
// evaluation (running statistics normalise).
template <class T, int kVector, std::int64_t kPlane, bool kFusedRelu, bool kBatchStatistics>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) normalize_kernel(ForwardArgs<T> args) {
  __shared__ float channel_scale, channel_shift;
  const int c = blockIdx.y;
  if (threadIdx.x < 32) {
    double mean = 0, var = 0;
    if constexpr (kBatchStatistics) {
      const Moments m =
          combine_partials(args.partials, c, static_cast<int>(gridDim.x), Moments{0.0, 0.0, 0.0});
      mean = m.mean;
      var = fmax(0.0, m.m2 / m.count);
    } else {
      mean = args.running_mean[c];
      var = args.running_var[c];
    }
    if (threadIdx.x == 0) {
      const auto inv_std = static_cast<float>(1.0 / sqrt(var + args.eps));
      const float scale = to_float(args.weight[c]) * inv_std;
      const float shift = to_float(args.bias[c]) - static_cast<float>(mean) * scale;
      channel_scale = scale;
      channel_shift = shift;
      if (blockIdx.x == 0) {
        float* saved = args.saved + c;
        saved[kSavedMean * args.channels] = static_cast<float>(mean);
        saved[kSavedMeanLow * args.channels] =
            static_cast<float>(mean - static_cast<double>(static_cast<float>(mean)));
        saved[kSavedInvStd * args.channels] = inv_std;
        saved[kSavedScale * args.channels] = scale;
        saved[kSavedShift * args.channels] = shift;
        if constexpr (kBatchStatistics) {
          const double count = static_cast<double>(args.batch) * kPlane;
          const double keep = 1.0 - args.momentum;
          args.running_mean[c] =
              static_cast<float>(keep * args.running_mean[c] + args.momentum * mean);
          args.running_var[c] = static_cast<float>(keep * args.running_var[c] +
                                                   args.momentum * var * count / (count - 1.0));
          if (c == 0) *args.batches_tracked += 1;
        }
      }
    }
  }
  __syncthreads();
  const float scale = channel_scale, shift = channel_shift;
  for_each_vector<T, kVector, kPlane, false>(
      args.batch, args.x, static_cast<const T*>(nullptr),
      [&](std::int64_t offset, const Pack<T, kVector>& p, const Pack<T, kVector>&) {
        Pack<T, kVector> out;
#pragma unroll
        for (int i = 0; i < kVector; ++i) {
          const float v = normalized(to_float(p.v[i]), scale, shift);
          out.v[i] = from_float<T>(kFusedRelu && v < 0.f ? 0.f : v);  // NaN passes
        }
        *reinterpret_cast<Pack<T, kVector>*>(args.y + offset) = out;
      });
}

template <class T, int kVector, std::int64_t kPlane, bool kFusedRelu>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    gradient_sums_kernel(BackwardArgs<T> args) {
  const int c = blockIdx.y;
  const double mean = static_cast<double>(args.saved[kSavedMean * args.channels + c]) +
                      static_cast<double>(args.saved[kSavedMeanLow * args.channels + c]);
  const float scale = args.saved[kSavedScale * args.channels + c];
  const float shift = args.saved[kSavedShift * args.channels + c];
  GradientSums sums{0.0, 0.0};
  for_each_vector<T, kVector, kPlane, true>(
      args.batch, args.x, args.dy,
      [&](std::int64_t, const Pack<T, kVector>& px, const Pack<T, kVector>& pdy) {
#pragma unroll
        for (int i = 0; i < kVector; ++i) {
          const float x = to_float(px.v[i]);
          const float g = upstream_gradient<T, kFusedRelu>(x, to_float(pdy.v[i]), scale, shift);
          sums.dy += g;
          sums.dy_xc = fma(static_cast<double>(g), static_cast<double>(x) - mean, sums.dy_xc);
        }
      });
  sums = block_combine(sums, GradientSums{0.0, 0.0});
  if (threadIdx.x == 0) args.partials[blockIdx.y * gridDim.x + blockIdx.x] = sums;
}

// `splits` is the gradient-sums kernel's grid width (this kernel's may be 1 when dx is not wanted).
template <class T, int kVector, std::int64_t kPlane, bool kFusedRelu>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    input_gradient_kernel(BackwardArgs<T> args, int splits) {
  __shared__ float channel_factor, channel_mean_dy, channel_mean_dy_xhat;
  const int c = blockIdx.y;
  const float mean = args.saved[kSavedMean * args.channels + c];
  const float inv_std = args.saved[kSavedInvStd * args.channels + c];
  const float scale = args.saved[kSavedScale * args.channels + c];
  const float shift = args.saved[kSavedShift * args.channels + c];
  if (threadIdx.x < 32) {
    const GradientSums sums = combine_partials(args.partials, c, splits, GradientSums{0.0, 0.0});
    if (threadIdx.x == 0) {
      const double count = static_cast<double>(args.batch) * kPlane;
      const double sum_dy_xhat = sums.dy_xc * inv_std;
      channel_factor = to_float(args.weight[c]) * inv_std;
      channel_mean_dy = args.training ? static_cast<float>(sums.dy / count) : 0.f;
      channel_mean_dy_xhat = args.training ? static_cast<float>(sum_dy_xhat / count) : 0.f;
      if (blockIdx.x == 0) {
        args.weight_grad[c] =
            from_float<T>(to_float(args.weight_grad[c]) + static_cast<float>(sum_dy_xhat));
        args.bias_grad[c] = from_float<T>(to_float(args.bias_grad[c]) + static_cast<float>(sums.dy));
      }
    }
  }
  if (args.dx == nullptr) return;
  __syncthreads();
  const float factor = channel_factor, mean_dy = channel_mean_dy;
  const float mean_dy_xhat = channel_mean_dy_xhat;
  for_each_vector<T, kVector, kPlane, true>(
      args.batch, args.x, args.dy,
      [&](std::int64_t offset, const Pack<T, kVector>& px, const Pack<T, kVector>& pdy) {
        Pack<T, kVector> out;
#pragma unroll
        for (int i = 0; i < kVector; ++i) {
          const float x = to_float(px.v[i]);
          const float xhat = (x - mean) * inv_std;
          const float g = upstream_gradient<T, kFusedRelu>(x, to_float(pdy.v[i]), scale, shift);
          out.v[i] = from_float<T>(factor * (g - mean_dy - xhat * mean_dy_xhat));
        }
        *reinterpret_cast<Pack<T, kVector>*>(args.dx + offset) = out;
      });
}

// Slices per channel for a batch: enough blocks in all to fill the GPU, but at least
// kMinVectorsPerThread vectors per thread.
inline int splits_for(std::int64_t vectors_per_channel, int channels) {
  const std::int64_t to_fill = (kTargetBlocks + channels - 1) / channels;
  const std::int64_t at_most = vectors_per_channel / (kThreads * kMinVectorsPerThread);
  return static_cast<int>(std::clamp<std::int64_t>(std::min(to_fill, at_most), 1, 1 << 16));
}

template <class T>
bool is_aligned(const T* p, int vector) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % (sizeof(T) * vector) == 0;
}

// Calls f(std::integral_constant<int, kVector>) with the widest vector when every tensor is aligned
// to it, else with 1 (a view that starts inside a vector).
template <class T, std::int64_t kPlane, class F>
void with_vector_width(std::initializer_list<const T*> tensors, F&& f) {
  constexpr int kWide = widest_vector<T, kPlane>();
  bool aligned = true;
  for (const T* p : tensors) aligned = aligned && is_aligned(p, kWide);
  if (aligned)
    f(std::integral_constant<int, kWide>{});
  else
    f(std::integral_constant<int, 1>{});
}

// The most slices per channel that forward and backward use for this batch (those of the
// one-element vectors, the most vectors): the caller sizes the partials, [channels][splits], so.
template <std::int64_t kPlane>
int max_partials_per_channel(std::int64_t batch, int channels) {
  return splits_for(batch * kPlane, channels);
}

template <class T, std::int64_t kPlane, bool kFusedRelu>
void forward(const ForwardArgs<T>& args, bool training, cudaStream_t stream) {
  with_vector_width<T, kPlane>({args.x, args.y}, [&](auto vector) {
    constexpr int kVector = decltype(vector)::value;
    const int splits = splits_for(args.batch * (kPlane / kVector), args.channels);
    const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(args.channels));
    if (training) {
      statistics_kernel<kernel_t<T>, kVector, kPlane><<<grid, kThreads, 0, stream>>>(args);
      COLTRAIN_CHECK_CUDA_LAUNCH();
      normalize_kernel<kernel_t<T>, kVector, kPlane, kFusedRelu, true>
          <<<grid, kThreads, 0, stream>>>(args);
    } else {
      normalize_kernel<kernel_t<T>, kVector, kPlane, kFusedRelu, false>
          <<<grid, kThreads, 0, stream>>>(args);
    }
    COLTRAIN_CHECK_CUDA_LAUNCH();
  });
}

template <class T, std::int64_t kPlane, bool kFusedRelu>
void backward(const BackwardArgs<T>& args, cudaStream_t stream) {
  with_vector_width<T, kPlane>({args.x, args.dy, args.dx}, [&](auto vector) {
    constexpr int kVector = decltype(vector)::value;
    const int splits = splits_for(args.batch * (kPlane / kVector), args.channels);
    const auto channels = static_cast<unsigned>(args.channels);
    gradient_sums_kernel<kernel_t<T>, kVector, kPlane, kFusedRelu>
        <<<dim3(static_cast<unsigned>(splits), channels), kThreads, 0, stream>>>(args);
    COLTRAIN_CHECK_CUDA_LAUNCH();
    const unsigned dx_splits = args.dx ? static_cast<unsigned>(splits) : 1u;
    input_gradient_kernel<kernel_t<T>, kVector, kPlane, kFusedRelu>
        <<<dim3(dx_splits, channels), kThreads, 0, stream>>>(args, splits);
    COLTRAIN_CHECK_CUDA_LAUNCH();
  });
}

}  // namespace coltrain::cuda::batch_norm
