#pragma once
// Storage<T, Cuda>: device memory from cudaMalloc (no managed memory: its page faults make timings
// lie and oversubscription can hang the GPU), zeroed when allocated like the host storage, and
// PinnedBuffer<T>: page-locked host memory, which copies to and from the device run asynchronously.
// Runtime API only, so plain g++ with the CUDA headers compiles it.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/tensor/cuda_storage.hpp needs CUDA (COLTRAIN_WITH_CUDA=1)"
#endif

#include <coltrain/core/device_memory.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/device.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace coltrain::tensor {

template <class T, class Device>
class Storage;

template <class T>
class Storage<T, Cuda> {
  static_assert(std::is_trivially_copyable_v<T>,
                "coltrain: tensor elements are trivially copyable");

 public:
  Storage() = default;
  explicit Storage(std::size_t count) { allocate(count); }
  Storage(const Storage& other) : Storage(other.size_) {
    if (size_) {
      COLTRAIN_CHECK_CUDA(
          cudaMemcpy(data_, other.data_, size_ * sizeof(T), cudaMemcpyDeviceToDevice));
    }
  }
  Storage& operator=(const Storage& other) {
    if (this != &other) {
      Storage copy(other);
      swap(copy);
    }
    return *this;
  }
  Storage(Storage&& other) noexcept { swap(other); }
  Storage& operator=(Storage&& other) noexcept {
    Storage moved(std::move(other));
    swap(moved);
    return *this;
  }
  ~Storage() {
    if (owned_) device_free(data_);
  }

  // `count` elements at `data`, which the caller keeps alive and frees (storage.hpp).
  static Storage borrow(T* data, std::size_t count) {
    Storage s;
    s.data_ = data;
    s.size_ = count;
    s.owned_ = false;
    return s;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }

  void swap(Storage& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(owned_, other.owned_);
  }

 private:
  void allocate(std::size_t count) {
    if (count == 0) return;
    if (count > SIZE_MAX / sizeof(T))
      throw InvalidArgument("device tensor of " + std::to_string(count) + " elements is too large");
    data_ = static_cast<T*>(device_allocate(count * sizeof(T)));
    size_ = count;
    // A new tensor must read as zeros on every stream. cudaMemset on device memory returns before
    // it runs, on the legacy stream, which the non-blocking streams coltrain computes on do not
    // wait for: without the wait, the zeros could land after a kernel or copy on another stream
    // had written the tensor (seen under compute-sanitizer, whose timing delays the memset).
    COLTRAIN_CHECK_CUDA(cudaMemset(data_, 0, count * sizeof(T)));
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(nullptr));
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  bool owned_ = true;
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
