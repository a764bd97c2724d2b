#pragma once
// Context<Cuda>: what a layer on the GPU needs besides its tensors. All work of one network goes to
// one stream of its own (never the legacy default stream, which cannot be captured into a CUDA
// graph), with a cuBLAS and a cuDNN handle bound to it and one growing scratch workspace. The
// handles are made on first use, so a program links cuBLAS or cuDNN only when a layer of it calls
// them.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/nn/cuda_context.hpp needs CUDA (COLTRAIN_WITH_CUDA=1)"
#endif

#include <coltrain/core/device_memory.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/tensor/device.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#if COLTRAIN_WITH_CUDNN
#include <cudnn.h>
#endif

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace coltrain::nn {

template <>
class Context<tensor::Cuda> : public ContextState {
 public:
  // `threads` is the CPU side's knob and is ignored here; `device` < 0 keeps the current device.
  explicit Context(int threads = 1, std::uint64_t seed = 0, int device = -1) : ContextState(seed) {
    (void)threads;
    if (device >= 0) COLTRAIN_CHECK_CUDA(cudaSetDevice(device));
    COLTRAIN_CHECK_CUDA(cudaGetDevice(&device_));
    cudaStream_t stream = nullptr;
    COLTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    stream_ = StreamHandle(stream);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_.get(); }
  int threads() const { return 1; }

  // Copies (between any host and device memory) and clears, queued on the stream.
  template <class T>
  void copy(const T* from, T* to, std::int64_t count) {
    if (count == 0) return;
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(to, from, static_cast<std::size_t>(count) * sizeof(T),
                                        cudaMemcpyDefault, stream()));
  }
  template <class T>
  void zero(T* data, std::int64_t count) {
    if (count == 0) return;
    COLTRAIN_CHECK_CUDA(
        cudaMemsetAsync(data, 0, static_cast<std::size_t>(count) * sizeof(T), stream()));
  }

  // Waits for everything queued on the stream; reports errors of earlier launches here.
  void synchronize() const { COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream())); }

  cublasHandle_t cublas() {
    if (!cublas_) {
      cublasHandle_t handle = nullptr;
      COLTRAIN_CHECK_CUBLAS(cublasCreate(&handle));
      cublas_ = CublasHandle(handle, [](cublasHandle_t h) { cublasDestroy(h); });
      COLTRAIN_CHECK_CUBLAS(cublasSetStream(handle, stream()));
      // A workspace of our own, so that cuBLAS allocates nothing while a step is captured as a
      // graph (it would otherwise take memory per stream on first use).
      cublas_workspace_ = device_block(kCublasWorkspaceBytes);
      COLTRAIN_CHECK_CUBLAS(
          cublasSetWorkspace(handle, cublas_workspace_.get(), kCublasWorkspaceBytes));
    }
    return cublas_.get();
  }

#if COLTRAIN_WITH_CUDNN
  cudnnHandle_t cudnn() {
    if (!cudnn_) {
      cudnnHandle_t handle = nullptr;
      COLTRAIN_CHECK_CUDNN(cudnnCreate(&handle));
      cudnn_ = CudnnHandle(handle, [](cudnnHandle_t h) { cudnnDestroy(h); });
      COLTRAIN_CHECK_CUDNN(cudnnSetStream(handle, stream()));
    }
    return cudnn_.get();
  }
#endif

  // Scratch memory of at least `bytes`, valid until the next call (layers use it within one call).
  // It only grows; a graph recorded before it grew is stale (core/device_memory.hpp tells).
  void* workspace(std::size_t bytes) {
    if (bytes > workspace_bytes_) {
      synchronize();  // kernels queued earlier may still read the old block
      workspace_ = device_block(bytes);
      workspace_bytes_ = bytes;
    }
    return workspace_.get();
  }

 private:
  static constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

  struct StreamDestroy {
    void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
  };
  using StreamHandle = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy>;
  using CublasHandle =
      std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, void (*)(cublasHandle_t)>;
#if COLTRAIN_WITH_CUDNN
  using CudnnHandle =
      std::unique_ptr<std::remove_pointer_t<cudnnHandle_t>, void (*)(cudnnHandle_t)>;
#endif

  int device_ = 0;
  // Declared so that the handles go before the stream they are bound to.
  StreamHandle stream_;
  DeviceBlock cublas_workspace_;
  DeviceBlock workspace_;
  std::size_t workspace_bytes_ = 0;
  CublasHandle cublas_{nullptr, nullptr};
#if COLTRAIN_WITH_CUDNN
  CudnnHandle cudnn_{nullptr, nullptr};
#endif
};

}  // namespace coltrain::nn
