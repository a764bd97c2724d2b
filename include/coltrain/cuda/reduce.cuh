#pragma once
// Reductions of a device array to one value on the device: sum, sum of squares, max |x| and
// all_finite. Two launches, deterministic: each block of a fixed grid (a function of n and the
// pointer's alignment only) reduces its grid-stride share into a partial, in double, and one block
// folds the partials in a fixed order. No atomics, so the same input gives the same bits on every
// run. The caller provides the partials' scratch memory (kReductionWorkspaceBytes of device memory,
// e.g. from nn::Context<Cuda>::workspace), so a reduction allocates nothing and can be captured.

#if !defined(__CUDACC__)
#error "coltrain/cuda/reduce.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/cuda/launch.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

namespace coltrain::cuda {

inline constexpr int kReductionMaxBlocks = 1024;
inline constexpr std::size_t kReductionWorkspaceBytes = kReductionMaxBlocks * sizeof(double);

namespace detail {

// Sum of a block's values, the same tree every run; the result is valid in thread 0.
template <class Op>
__device__ double block_reduce(double value) {
  __shared__ double warp_results[kThreadsPerBlock / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    value = Op::combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < static_cast<int>(blockDim.x) / 32 ? warp_results[lane] : Op::identity();
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      value = Op::combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
    }
  }
  return value;
}

struct SumOp {
  __device__ static double identity() { return 0.0; }
  __device__ static double transform(double x) { return x; }
  __device__ static double combine(double a, double b) { return a + b; }
};

struct SumOfSquaresOp {
  __device__ static double identity() { return 0.0; }
  __device__ static double transform(double x) { return x * x; }
  __device__ static double combine(double a, double b) { return a + b; }
};

// NaN wins, as torch.max: fmax would drop it.
struct MaxAbsOp {
  __device__ static double identity() { return 0.0; }
  __device__ static double transform(double x) { return fabs(x); }
  __device__ static double combine(double a, double b) {
    return (isnan(a) || isnan(b)) ? nan("") : fmax(a, b);
  }
};

// 1 where an element is Inf or NaN; the maximum is whether any is.
struct NonFiniteOp {
  __device__ static double identity() { return 0.0; }
  __device__ static double transform(double x) { return isfinite(x) ? 0.0 : 1.0; }
  __device__ static double combine(double a, double b) { return fmax(a, b); }
};

template <int V, class Op, class T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    reduce_partials_kernel(const T* x, std::int64_t n, double* partials) {
  double acc = Op::identity();
  const std::int64_t packs = n / V;
  for (std::int64_t p = grid_index(); p < packs; p += grid_stride()) {
    const Pack<T, V> in = load<V>(x + p * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc = Op::combine(acc, Op::transform(static_cast<double>(widen(in.v[k]))));
    }
  }
  const std::int64_t tail = packs * V + grid_index();
  if (tail < n) acc = Op::combine(acc, Op::transform(static_cast<double>(widen(x[tail]))));
  acc = block_reduce<Op>(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Folds the partials; finish(total) is what is stored.
template <class Op, class Out, class Finish>
__global__ void __launch_bounds__(kThreadsPerBlock)
    reduce_finish_kernel(const double* partials, int count, Out* result, Finish finish) {
  double acc = Op::identity();
  for (int i = static_cast<int>(threadIdx.x); i < count; i += blockDim.x) {
    acc = Op::combine(acc, partials[i]);
  }
  acc = block_reduce<Op>(acc);
  if (threadIdx.x == 0) *result = finish(acc);
}

template <class Out>
struct StoreAs {
  __device__ Out operator()(double total) const { return static_cast<Out>(total); }
};

struct StoreAllFinite {
  __device__ std::int32_t operator()(double any_non_finite) const {
    return any_non_finite == 0.0 ? 1 : 0;
  }
};

template <class Op, class T, class Out, class Finish>
void reduce(const T* x, std::int64_t n, Out* result, void* workspace, cudaStream_t stream,
            const char* what, Finish finish) {
  check_element<T>();
  check_count(n, what);
  if (result == nullptr || workspace == nullptr) {
    throw InvalidArgument(std::string(what) +
                          ": the result and the workspace must be device memory");
  }
  auto* partials = static_cast<double*>(workspace);
  const bool vectors = aligned_for_vectors(x);
  const int width = vectors ? kVectorWidth<T> : 1;
  // A few packs per thread before a block's partial: fewer partials, same bandwidth.
  constexpr std::int64_t kPacksPerThread = 4;
  const std::int64_t per_block = std::int64_t{kThreadsPerBlock} * width * kPacksPerThread;
  const int blocks = static_cast<int>(
      std::clamp<std::int64_t>((n + per_block - 1) / per_block, 1, kReductionMaxBlocks));
  if (vectors) {
    reduce_partials_kernel<kVectorWidth<T>, Op>
        <<<blocks, kThreadsPerBlock, 0, stream>>>(x, n, partials);
  } else {
    reduce_partials_kernel<1, Op><<<blocks, kThreadsPerBlock, 0, stream>>>(x, n, partials);
  }
  COLTRAIN_CHECK_CUDA_LAUNCH();
  reduce_finish_kernel<Op><<<1, kThreadsPerBlock, 0, stream>>>(partials, blocks, result, finish);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

}  // namespace detail

// *result = sum of x (accumulated in double, stored as accum_t<T>); 0 for n = 0.
template <class T>
void sum(const T* x, std::int64_t n, accum_t<T>* result, void* workspace, cudaStream_t stream) {
  detail::reduce<detail::SumOp>(x, n, result, workspace, stream, "sum",
                                detail::StoreAs<accum_t<T>>{});
}

// *result = sum of x[i]^2 (the squared L2 norm, for gradient clipping).
template <class T>
void sum_of_squares(const T* x, std::int64_t n, accum_t<T>* result, void* workspace,
                    cudaStream_t stream) {
  detail::reduce<detail::SumOfSquaresOp>(x, n, result, workspace, stream, "sum_of_squares",
                                         detail::StoreAs<accum_t<T>>{});
}

// *result = max |x[i]|; NaN if any element is NaN; 0 for n = 0.
template <class T>
void max_abs(const T* x, std::int64_t n, accum_t<T>* result, void* workspace, cudaStream_t stream) {
  detail::reduce<detail::MaxAbsOp>(x, n, result, workspace, stream, "max_abs",
                                   detail::StoreAs<accum_t<T>>{});
}

// *result = 1 if no element is Inf or NaN, else 0 (1 for n = 0).
template <class T>
void all_finite(const T* x, std::int64_t n, std::int32_t* result, void* workspace,
                cudaStream_t stream) {
  detail::reduce<detail::NonFiniteOp>(x, n, result, workspace, stream, "all_finite",
                                      detail::StoreAllFinite{});
}

}  // namespace coltrain::cuda
