#pragma once
// Memory for tensors: `Storage<T, Device>`, owned, or borrowed from an owner that outlives it
// (Storage::borrow: a network keeps its parameters in one arena, nn/parameter_arena.hpp). The host
// specialisation allocates through core/host_memory.hpp: 64-byte aligned, so that Eigen and the
// compiler can use aligned vector loads, and on transparent huge pages from 2 MiB up. Memory is
// zeroed when allocated, so nothing ever reads garbage. A copy is always owned. One class serves
// every device through StorageMemory<Device>; CUDA's is in cuda_storage.hpp, included here in
// builds with CUDA.

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

// How a device's memory is allocated (zeroed), released and copied, for Storage. The host's is
// here; the CUDA one is in cuda_storage.hpp.
template <class Device>
struct StorageMemory;

template <>
struct StorageMemory<Cpu> {
  static constexpr const char* kTensorName = "tensor";
  // Room for the alignment's padding on top of the elements.
  static constexpr std::size_t kLargestBytes = SIZE_MAX - kHostAlignment;

  static void* allocate(std::size_t bytes) { return allocate_host_memory(bytes); }
  static void release(void* data) noexcept { free_host_memory(data); }
  static void copy(void* to, const void* from, std::size_t bytes) { std::memcpy(to, from, bytes); }
};

template <class T, class Device>
class Storage {
  static_assert(std::is_trivially_copyable_v<T>, "coltrain: tensor elements are trivially copyable");
  using Memory = StorageMemory<Device>;

 public:
  Storage() = default;
  explicit Storage(std::size_t count) { allocate(count); }
  Storage(const Storage& other) : Storage(other.size_) {
    if (size_) Memory::copy(data_, other.data_, size_ * sizeof(T));
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
    if (owned_) Memory::release(data_);
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
    if (count > Memory::kLargestBytes / sizeof(T))
      throw InvalidArgument(std::string(Memory::kTensorName) + " of " + std::to_string(count) +
                            " elements is too large");
    data_ = static_cast<T*>(Memory::allocate(count * sizeof(T)));
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
