#pragma once
// Weights and biases of a GPU layer drawn exactly as the CPU layer draws them (nn/init.hpp's
// PyTorch defaults, in the same order from the same Rng), on the host, then copied: a GPU and a CPU
// network built from one seed start from the same parameters.

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn/initialize.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/error.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/device_copy.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <cstdint>

namespace coltrain::nn {

// kaiming_uniform_default for the weight, then bias_uniform_default for the bias unless it is null.
template <class T>
void initialize_weight_and_bias(Parameter<T, tensor::Cuda>& weight,
                                Parameter<T, tensor::Cuda>* bias, std::int64_t fan_in, Rng& rng) {
  tensor::Tensor<T, tensor::Cpu> host_weight(weight.value.shape());
  kaiming_uniform_default(host_weight.span(), fan_in, rng);
  tensor::copy<T, tensor::Cpu, tensor::Cuda>(host_weight.view(), weight.value.view(), nullptr);
  tensor::Tensor<T, tensor::Cpu> host_bias;
  if (bias != nullptr) {
    host_bias.resize(bias->value.shape());
    bias_uniform_default(host_bias.span(), fan_in, rng);
    tensor::copy<T, tensor::Cpu, tensor::Cuda>(host_bias.view(), bias->value.view(), nullptr);
  }
  COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(nullptr));  // before the host tensors go
}

}  // namespace coltrain::nn
