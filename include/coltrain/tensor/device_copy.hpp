#pragma once
// Copies between host and device tensors: copy() for views of equal shape on any pair of devices
// (asynchronous on `stream` when either side is on the device), to_device() and to_host() for whole
// tensors (synchronous: the result is ready when they return).

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/tensor/device_copy.hpp needs CUDA (COLTRAIN_WITH_CUDA=1)"
#endif

#include <coltrain/core/error.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <string>

namespace coltrain::tensor {

template <class T, class From, class To>
void copy(TensorView<const T, From> from, TensorView<T, To> to, cudaStream_t stream) {
  if (from.shape() != to.shape())
    throw InvalidArgument("copy from a tensor of shape " + from.shape().to_string() +
                          " to one of shape " + to.shape().to_string());
  if (from.numel() == 0) return;
  // cudaMemcpyDefault reads the direction from the pointers (unified addressing).
  COLTRAIN_CHECK_CUDA(
      cudaMemcpyAsync(to.data(), from.data(), from.numel() * sizeof(T), cudaMemcpyDefault, stream));
}

template <class T>
Tensor<T, Cuda> to_device(const Tensor<T, Cpu>& host) {
  Tensor<T, Cuda> device(host.shape());
  copy<T, Cpu, Cuda>(host.view(), device.view(), nullptr);
  COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(nullptr));
  return device;
}

template <class T>
Tensor<T, Cpu> to_host(TensorView<const T, Cuda> device, cudaStream_t stream = nullptr) {
  Tensor<T, Cpu> host(device.shape());
  copy<T, Cuda, Cpu>(device, host.view(), stream);
  COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
  return host;
}

template <class T>
Tensor<T, Cpu> to_host(const Tensor<T, Cuda>& device, cudaStream_t stream = nullptr) {
  return to_host(device.view(), stream);
}

}  // namespace coltrain::tensor
