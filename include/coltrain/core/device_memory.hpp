#pragma once
// coltrain's device allocations, counted. A recorded CUDA graph holds raw device addresses, so it
// is valid only while nothing it touches has been freed or moved; tensors grow when a larger batch
// passes (an evaluation batch, say) and workspaces when a layer needs more. Every coltrain device
// allocation and free goes through here and advances device_memory_generation(), so that whoever
// holds a graph can tell that it must record it again (train::DeviceTrainer does).
//
//   const auto generation = device_memory_generation();
//   ...                                                    // eager work that may reallocate
//   if (device_memory_generation() != generation) re-record();

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/core/device_memory.hpp needs CUDA (COLTRAIN_WITH_CUDA=1)"
#endif

#include <coltrain/core/error.hpp>

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace coltrain {
namespace detail {
inline std::atomic<std::uint64_t> device_memory_generation{0};
}  // namespace detail

// How many device allocations and frees coltrain has made in this process.
inline std::uint64_t device_memory_generation() {
  return detail::device_memory_generation.load(std::memory_order_acquire);
}

// `bytes` of device memory on the current device (nullptr for 0), not initialised.
inline void* device_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* data = nullptr;
  COLTRAIN_CHECK_CUDA(cudaMalloc(&data, bytes));
  detail::device_memory_generation.fetch_add(1, std::memory_order_acq_rel);
  return data;
}

// A failed free cannot be reported from a destructor; it shows in the next checked call.
inline void device_free(void* data) noexcept {
  if (data == nullptr) return;
  cudaFree(data);
  detail::device_memory_generation.fetch_add(1, std::memory_order_acq_rel);
}

struct DeviceFree {
  void operator()(void* data) const noexcept { device_free(data); }
};
// Untyped device memory owned like a unique_ptr: workspaces and scratch.
using DeviceBlock = std::unique_ptr<void, DeviceFree>;

inline DeviceBlock device_block(std::size_t bytes) { return DeviceBlock(device_allocate(bytes)); }

}  // namespace coltrain
