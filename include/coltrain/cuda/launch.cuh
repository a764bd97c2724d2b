#pragma once
// Launch geometry shared by coltrain's kernels: elementwise kernels walk their range with a
// grid-stride loop over a grid capped at a few waves, so one launch covers any size and the grid
// never exceeds what the device keeps resident.

#if !defined(__CUDACC__)
#error "coltrain/cuda/launch.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace coltrain::cuda {

inline constexpr int kThreadsPerBlock = 256;

// Name element types in a kernel's template arguments through kernel_t. nvcc writes each kernel's
// host stub with the type as first spelled; spelled through a member alias such as
// DeviceTrainer<Network<Named<"fc1", ...>>>::T, the stub holds a class-type template argument that
// the host compiler cannot parse. The identity trait gives the stub a plain spelling.
template <class T>
struct kernel_type {
  using type = T;
};
template <class T>
using kernel_t = typename kernel_type<T>::type;

// Blocks for `count` items at `per_thread` items per thread, capped at 8 blocks per multiprocessor
// of 132 (an H100): more than that only adds scheduling work to a grid-stride loop.
inline unsigned blocks_for(std::int64_t count, int per_thread = 1, int threads = kThreadsPerBlock) {
  constexpr std::int64_t kMaxBlocks = 132 * 8;
  const std::int64_t per_block = static_cast<std::int64_t>(threads) * per_thread;
  const std::int64_t blocks = (count + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, kMaxBlocks));
}

// The first index and stride of a grid-stride loop.
__device__ inline std::int64_t grid_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t grid_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

}  // namespace coltrain::cuda
