#pragma once
// StorageMemory<Cuda>, what Storage<T, Cuda> holds: device memory from cudaMalloc (no managed
// memory: its page faults make timings lie and oversubscription can hang the GPU), zeroed when
// allocated like the host storage, and PinnedBuffer<T>: page-locked host memory, which copies to
// and from the device run asynchronously. Runtime API only, so plain g++ with the CUDA headers
// compiles it.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/tensor/cuda_storage.hpp needs CUDA (COLTRAIN_WITH_CUDA=1)"
#endif

#include <coltrain/core/device_memory.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/device.hpp>
#include <coltrain/tensor/storage.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace coltrain::tensor {

template <>
struct StorageMemory<Cuda> {
  static constexpr const char* kTensorName = "device tensor";
  static constexpr std::size_t kLargestBytes = SIZE_MAX;

  static void* allocate(std::size_t bytes) {
    void* data = device_allocate(bytes);
    // A new tensor must read as zeros on every stream. cudaMemset on device memory returns before
    // it runs, on the legacy stream, which the non-blocking streams coltrain computes on do not
    // wait for: without the wait, the zeros could land after a kernel or copy on another stream
    // had written the tensor (seen under compute-sanitizer, whose timing delays the memset).
    try {
      COLTRAIN_CHECK_CUDA(cudaMemset(data, 0, bytes));
      COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(nullptr));
    } catch (...) {
      device_free(data);
      throw;
    }
    return data;
  }
  static void release(void* data) noexcept { device_free(data); }
  static void copy(void* to, const void* from, std::size_t bytes) {
    COLTRAIN_CHECK_CUDA(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToDevice));
  }
};

// Page-locked host memory for `count` elements of T.
template <class T>
class PinnedBuffer {
  static_assert(std::is_trivially_copyable_v<T>,
                "coltrain: pinned elements are trivially copyable");

 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t count) : size_(count) {
    if (count == 0) return;
    void* data = nullptr;
    COLTRAIN_CHECK_CUDA(cudaMallocHost(&data, count * sizeof(T)));
    data_ = static_cast<T*>(data);
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { cudaFreeHost(data_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace coltrain::tensor
