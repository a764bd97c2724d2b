#pragma once
// Owning handles for a CUDA stream and a CUDA event (runtime API only, so g++ builds them too).
// Movable, not copyable; destroyed with the object.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/core/cuda_handles.hpp needs CUDA (COLTRAIN_WITH_CUDA=1)"
#endif

#include <coltrain/core/error.hpp>

#include <cuda_runtime.h>

#include <utility>

namespace coltrain {

// A non-blocking stream (it does not wait for the legacy default stream) on the current device.
class CudaStream {
 public:
  CudaStream() { COLTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  CudaStream(CudaStream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  CudaStream& operator=(CudaStream&& other) noexcept {
    std::swap(stream_, other.stream_);
    return *this;
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// An event for ordering only (no timing), which is the cheap kind to record and wait on.
class CudaEvent {
 public:
  CudaEvent() { COLTRAIN_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& other) noexcept {
    std::swap(event_, other.event_);
    return *this;
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  cudaEvent_t get() const { return event_; }

  void record(cudaStream_t stream) { COLTRAIN_CHECK_CUDA(cudaEventRecord(event_, stream)); }
  // Work queued on `stream` from now on runs after what this event recorded.
  void make_wait(cudaStream_t stream) const {
    COLTRAIN_CHECK_CUDA(cudaStreamWaitEvent(stream, event_, 0));
  }
  void synchronize() const { COLTRAIN_CHECK_CUDA(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace coltrain
