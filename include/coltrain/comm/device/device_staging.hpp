#pragma once
// The CUDA Stager behind Communicator's collectives on device buffers over MPI and TCP: pinned
// host slots and copies in pipelined chunks (coltrain/comm/device/staged_collectives.hpp has the
// pipeline).
//
//   auto comm = coltrain::comm::Communicator::from_env();
//   comm.allreduce(std::span(device_gradients, n), ReduceOp::kAvg);  // staged: device pointers
//
// A call first waits (on the GPU, not the CPU) for the work queued on the caller's stream
// (Communicator::stream(); default: the legacy default stream, which waits for every blocking
// stream), or for a queued call the work queued when it was issued (start_after), then returns
// once the result is in device memory. Copies use cudaMemcpyDefault, so any
// memory that CUDA can address works, though device memory is the point. Runtime API only: plain
// g++ builds it. Without CUDA (COLTRAIN_WITH_CUDA=0) this header declares nothing.

#include <coltrain/comm/device/staged_collectives.hpp>
#include <coltrain/core/config.hpp>

#if COLTRAIN_WITH_CUDA
#include <coltrain/core/error.hpp>

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <utility>

namespace coltrain::comm {

// Stages through kSlots pinned host slots with two CUDA streams of its own, one per copy
// direction, so that copies in and out run at once. Events keep the order: a slot's copy in waits
// for its last copy out on the GPU; the CPU waits only for the copy in of the chunk it sends.
class CudaStager {
 public:
  static constexpr std::size_t kSlots = 3;

  // On the current device; `caller` is the stream whose work the calls come after.
  explicit CudaStager(cudaStream_t caller = nullptr) : caller_(caller) {
    COLTRAIN_CHECK_CUDA(cudaGetDevice(&device_));
    caller_device_ = device_;
    try {
      COLTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&to_host_stream_, cudaStreamNonBlocking));
      COLTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&to_device_stream_, cudaStreamNonBlocking));
      COLTRAIN_CHECK_CUDA(cudaEventCreateWithFlags(&caller_ready_, cudaEventDisableTiming));
      for (std::size_t s = 0; s < kSlots; ++s) {
        COLTRAIN_CHECK_CUDA(cudaEventCreateWithFlags(&host_ready_[s], cudaEventDisableTiming));
        COLTRAIN_CHECK_CUDA(cudaEventCreateWithFlags(&device_done_[s], cudaEventDisableTiming));
      }
    } catch (...) {
      release();
      throw;
    }
  }
  CudaStager(const CudaStager&) = delete;
  CudaStager& operator=(const CudaStager&) = delete;
  ~CudaStager() { release(); }

  int device() const { return device_; }
  cudaStream_t caller_stream() const { return caller_; }
  void set_caller_stream(cudaStream_t caller) { caller_ = caller; }

  void reserve(std::size_t bytes) {
    if (bytes <= capacity_) return;
    free_slots();
    for (void*& slot : slots_) {
      COLTRAIN_CHECK_CUDA(cudaHostAlloc(&slot, bytes, cudaHostAllocPortable));
    }
    capacity_ = bytes;
  }
  std::byte* slot(std::size_t s) { return static_cast<std::byte*>(slots_[s]); }

  // The next begin() comes after `issued` (an event recorded when a queued call was issued)
  // instead of after the work on the caller's stream when it runs; null goes back to the stream.
  void start_after(cudaEvent_t issued) { issued_ = issued; }

  void begin() {
    COLTRAIN_CHECK_CUDA(cudaGetDevice(&caller_device_));
    COLTRAIN_CHECK_CUDA(cudaSetDevice(device_));
    cudaEvent_t ready = std::exchange(issued_, nullptr);
    if (ready == nullptr) {
      COLTRAIN_CHECK_CUDA(cudaEventRecord(caller_ready_, caller_));
      ready = caller_ready_;
    }
    COLTRAIN_CHECK_CUDA(cudaStreamWaitEvent(to_host_stream_, ready, 0));
    COLTRAIN_CHECK_CUDA(cudaStreamWaitEvent(to_device_stream_, ready, 0));
  }
  void to_host(std::size_t s, const StagedCopy& copy) {
    COLTRAIN_CHECK_CUDA(cudaStreamWaitEvent(to_host_stream_, device_done_[s], 0));
    enqueue(copy, to_host_stream_);
    COLTRAIN_CHECK_CUDA(cudaEventRecord(host_ready_[s], to_host_stream_));
  }
  // The slot's copy in is done, and its last copy out too: the host may overwrite it even where
  // nothing was copied in (broadcast on ranks other than the root).
  void wait_host(std::size_t s) {
    COLTRAIN_CHECK_CUDA(cudaEventSynchronize(host_ready_[s]));
    COLTRAIN_CHECK_CUDA(cudaEventSynchronize(device_done_[s]));
  }
  void to_device(std::size_t s, const StagedCopy& copy) {
    enqueue(copy, to_device_stream_);
    COLTRAIN_CHECK_CUDA(cudaEventRecord(device_done_[s], to_device_stream_));
  }
  void finish() {
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(to_device_stream_));
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(to_host_stream_));
    COLTRAIN_CHECK_CUDA(cudaSetDevice(caller_device_));
  }
  void abandon() noexcept {
    cudaStreamSynchronize(to_device_stream_);
    cudaStreamSynchronize(to_host_stream_);
    cudaSetDevice(caller_device_);
  }

 private:
  // One copy per row: a 2-D copy would limit the pitch (cudaDevAttrMaxPitch), and rows are as
  // large as a chunk's share of one rank's block, so the per-copy cost does not show.
  static void enqueue(const StagedCopy& copy, cudaStream_t stream) {
    if (copy.row_bytes == 0) return;
    for (std::size_t row = 0; row < copy.rows; ++row) {
      COLTRAIN_CHECK_CUDA(
          cudaMemcpyAsync(static_cast<std::byte*>(copy.destination) + row * copy.destination_pitch,
                          static_cast<const std::byte*>(copy.source) + row * copy.source_pitch,
                          copy.row_bytes, cudaMemcpyDefault, stream));
    }
  }

  // Pending copies may still use the slots.
  void free_slots() noexcept {
    if (to_host_stream_ != nullptr) cudaStreamSynchronize(to_host_stream_);
    if (to_device_stream_ != nullptr) cudaStreamSynchronize(to_device_stream_);
    for (void*& slot : slots_) {
      if (slot != nullptr) cudaFreeHost(slot);
      slot = nullptr;
    }
    capacity_ = 0;
  }

  // A failed release cannot be reported from a destructor; it shows in the next checked call.
  void release() noexcept {
    free_slots();
    for (cudaEvent_t& event : host_ready_) {
      if (event != nullptr) cudaEventDestroy(event);
    }
    for (cudaEvent_t& event : device_done_) {
      if (event != nullptr) cudaEventDestroy(event);
    }
    if (caller_ready_ != nullptr) cudaEventDestroy(caller_ready_);
    if (to_host_stream_ != nullptr) cudaStreamDestroy(to_host_stream_);
    if (to_device_stream_ != nullptr) cudaStreamDestroy(to_device_stream_);
  }

  int device_ = 0;
  int caller_device_ = 0;  // the current device when the call began, restored when it ends
  cudaStream_t caller_ = nullptr;
  cudaStream_t to_host_stream_ = nullptr;
  cudaStream_t to_device_stream_ = nullptr;
  cudaEvent_t caller_ready_ = nullptr;
  cudaEvent_t issued_ = nullptr;  // start_after's event, for the next begin() only
  std::array<cudaEvent_t, kSlots> host_ready_{};
  std::array<cudaEvent_t, kSlots> device_done_{};
  std::array<void*, kSlots> slots_{};
  std::size_t capacity_ = 0;
};

}  // namespace coltrain::comm

#endif  // COLTRAIN_WITH_CUDA
