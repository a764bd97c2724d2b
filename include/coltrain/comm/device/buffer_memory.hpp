#pragma once
// Where a buffer a collective was given lives, which decides its path per call: host buffers run
// the host algorithms, device buffers NCCL or staging (communicator.hpp).

#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>

#if COLTRAIN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace coltrain::comm::detail {

// Device memory (device or managed allocations) as CUDA sees it; host memory otherwise, and
// always in a build without CUDA or on a machine without a GPU. Asked afresh on every call:
// memory is freed and reused, so an answer cannot be kept. Whether the machine has a GPU at all is
// asked once per process, so that host collectives of a CUDA build on a machine without one (CI, a
// CPU partition) pay nothing for the question.
inline Memory memory_of(const void* pointer) {
#if COLTRAIN_WITH_CUDA
  static const bool any_device = [] {
    int devices = 0;
    const bool found = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
    cudaGetLastError();  // no driver or no device is an answer, not an error to keep
    return found;
  }();
  if (pointer == nullptr || !any_device) return Memory::kHost;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();  // no GPU or driver here: no device memory either
    return Memory::kHost;
  }
  const bool device =
      attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  return device ? Memory::kDevice : Memory::kHost;
#else
  static_cast<void>(pointer);
  return Memory::kHost;
#endif
}

}  // namespace coltrain::comm::detail
