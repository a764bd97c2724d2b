#pragma once
// The NCCL backend's building blocks (nccl_backend.hpp assembles them): the type and op maps, the
// unique id as broadcastable words, the RAII owners of what the backend holds (the current device,
// a stream-ordered allocation, the ring's reduction stream and event, the ncclComm_t, aborted
// rather than destroyed after a failure), the polling back-off, and what an error names.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_NCCL
#error "coltrain/comm/device/nccl/nccl_resources.hpp needs NCCL: build with COLTRAIN_WITH_NCCL=1"
#endif

#include <coltrain/comm/device/device_collectives.hpp>
#include <coltrain/comm/device/nccl/nccl_schedules.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>

namespace coltrain::comm::detail {

inline ncclDataType_t nccl_data_type(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kUInt8:
      return ncclUint8;
  }
  throw InvalidArgument("dtype value " + std::to_string(static_cast<int>(dtype)) +
                        " is not a coltrain DataType; NCCL takes f32, f64, f16, bf16, i32, i64 "
                        "and u8");
}

inline ncclRedOp_t nccl_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      return ncclAvg;
  }
  throw InvalidArgument("reduction op value " + std::to_string(static_cast<int>(op)) +
                        " is not a coltrain ReduceOp; NCCL takes sum, prod, min, max and avg");
}

// The host collectives take no u8 (communicator.hpp), so the id's bytes travel as i64 words.
static_assert(sizeof(ncclUniqueId) % sizeof(std::int64_t) == 0);
using UniqueIdWords = std::array<std::int64_t, sizeof(ncclUniqueId) / sizeof(std::int64_t)>;

inline UniqueIdWords unique_id_words(const ncclUniqueId& id) {
  UniqueIdWords words;
  std::memcpy(words.data(), &id, sizeof(id));
  return words;
}

inline ncclUniqueId unique_id_from_words(const UniqueIdWords& words) {
  ncclUniqueId id;
  std::memcpy(&id, words.data(), sizeof(id));
  return id;
}

// Every rank returns rank 0's `id`; the other ranks' argument is ignored. `bootstrap` is a host
// Communicator.
template <class Host>
ncclUniqueId broadcast_unique_id(Host& bootstrap, const ncclUniqueId& id) {
  UniqueIdWords words = unique_id_words(id);
  bootstrap.broadcast(std::span<std::int64_t>(words), 0);
  return unique_id_from_words(words);
}

// Makes `device` current for a scope and restores the previous one.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    COLTRAIN_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) COLTRAIN_CHECK_CUDA(cudaSetDevice(device));
    device_ = device;
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  ~CurrentDevice() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  int device_ = 0;
};

// Device memory in stream order: allocated on `stream` and freed on it after the work enqueued in
// between, so scratch never outlives or precedes its users and no call synchronises the device.
class StreamAllocation {
 public:
  StreamAllocation(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) COLTRAIN_CHECK_CUDA(cudaMallocAsync(&data_, bytes, stream));
  }
  StreamAllocation(const StreamAllocation&) = delete;
  StreamAllocation& operator=(const StreamAllocation&) = delete;
  ~StreamAllocation() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);
  }

  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

// The ring's second stream, on which received chunks are reduced while the next ones travel, with
// its events: `transferred` marks a round's group on the caller's stream, reduced[i] a reduction.
// Made at the first ring allreduce and kept: creating streams per call would cost more than a
// small allreduce.
class ReductionLane {
 public:
  static constexpr std::size_t kEvents = kRingLag + 1;

  ReductionLane() {
    try {
      COLTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      COLTRAIN_CHECK_CUDA(cudaEventCreateWithFlags(&transferred_, cudaEventDisableTiming));
      for (cudaEvent_t& event : reduced_) {
        COLTRAIN_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ReductionLane(const ReductionLane&) = delete;
  ReductionLane& operator=(const ReductionLane&) = delete;
  ~ReductionLane() { release(); }

  cudaStream_t stream() const { return stream_; }
  cudaEvent_t transferred() const { return transferred_; }
  cudaEvent_t reduced(std::size_t i) const { return reduced_[i % kEvents]; }

 private:
  // Work still enqueued keeps its stream alive: cudaStreamDestroy returns at once and the stream
  // goes once it is idle.
  void release() noexcept {
    for (cudaEvent_t event : reduced_) {
      if (event != nullptr) cudaEventDestroy(event);
    }
    if (transferred_ != nullptr) cudaEventDestroy(transferred_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  cudaStream_t stream_ = nullptr;
  cudaEvent_t transferred_ = nullptr;
  std::array<cudaEvent_t, kEvents> reduced_{};
};

// Sleeps between polls once a wait has lasted a while: a short collective ends within microseconds,
// a hung one must not burn a core.
inline void poll_backoff(unsigned polls) {
  constexpr unsigned kSpinningPolls = 2000;
  if (polls < kSpinningPolls) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// An NCCL communicator handle. Destroying it flushes the work it has enqueued (ncclCommFinalize),
// bounded by `timeout`, and aborts it when that fails or runs out of time.
class NcclHandle {
 public:
  NcclHandle() = default;
  NcclHandle(int device, std::chrono::milliseconds timeout) : device_(device), timeout_(timeout) {}
  NcclHandle(NcclHandle&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr)),
        device_(other.device_),
        timeout_(other.timeout_) {}
  NcclHandle& operator=(NcclHandle&& other) noexcept {
    std::swap(comm_, other.comm_);
    std::swap(device_, other.device_);
    std::swap(timeout_, other.timeout_);
    return *this;
  }
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;
  ~NcclHandle() { release(); }

  ncclComm_t get() const { return comm_; }
  ncclComm_t* receive() { return &comm_; }

  // Makes the kernels of this communicator return and frees it, without waiting for peers.
  void abort() noexcept {
    if (comm_ == nullptr) return;
    int previous = device_;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    cudaSetDevice(previous);
    comm_ = nullptr;
  }

 private:
  void release() noexcept {
    if (comm_ == nullptr) return;
    int previous = device_;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    ncclResult_t state = ncclCommFinalize(comm_);
    const Deadline deadline(timeout_);
    for (unsigned polls = 0; state == ncclInProgress && !deadline.expired(); ++polls) {
      poll_backoff(polls);
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
    cudaSetDevice(previous);
    comm_ = nullptr;
  }

  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  std::chrono::milliseconds timeout_{0};
};

// What an error names: the operation, and for a collective its element count, dtype and sequence
// number on this communicator.
struct NcclCall {
  std::string operation;
  std::optional<std::size_t> count;
  DataType dtype = DataType::kFloat32;
  std::optional<std::uint64_t> sequence;

  std::string describe() const {
    std::string text = operation;
    if (count) text += " of " + std::to_string(*count) + " " + std::string(name_of(dtype));
    return text;
  }
};

}  // namespace coltrain::comm::detail
