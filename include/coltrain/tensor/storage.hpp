#pragma once
// Memory for tensors: `Storage<T, Device>`, owned, or borrowed from an owner that outlives it
// (Storage::borrow: a network keeps its parameters in one arena, nn/parameter_arena.hpp). The host
// specialisation allocates through core/host_memory.hpp: 64-byte aligned, so that Eigen and the
// compiler can use aligned vector loads, and on transparent huge pages from 2 MiB up. Memory is
// zeroed when allocated, so nothing ever reads garbage. A copy is always owned. The CUDA
// specialisation is in cuda_storage.hpp, included here in builds with CUDA.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/host_memory.hpp>
#include <coltrain/tensor/device.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

namespace coltrain::tensor {

inline constexpr std::size_t kHostAlignment = kCacheLineAlignment;

template <class T, class Device>
class Storage;

template <class T>
class Storage<T, Cpu> {
  static_assert(std::is_trivially_copyable_v<T>, "coltrain: tensor elements are trivially copyable");

 public:
  Storage() = default;
  explicit Storage(std::size_t count) { allocate(count); }
  Storage(const Storage& other) : Storage(other.size_) {
    if (size_) std::memcpy(data_, other.data_, size_ * sizeof(T));
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
    if (owned_) free_host_memory(data_);
  }

  // `count` elements at `data`, which the caller keeps alive and frees.
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
    if (count > (SIZE_MAX - kHostAlignment) / sizeof(T))
      throw InvalidArgument("tensor of " + std::to_string(count) + " elements is too large");
    data_ = static_cast<T*>(allocate_host_memory(count * sizeof(T)));
    size_ = count;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  bool owned_ = true;
};

}  // namespace coltrain::tensor

#if COLTRAIN_WITH_CUDA
#include <coltrain/tensor/cuda_storage.hpp>
#endif
