#pragma once
// Where a tensor's memory lives. Tensors, layers and networks take the device as a template parameter,
// so the CPU and CUDA paths share every type above the storage and the kernels.

#include <coltrain/core/config.hpp>

#include <concepts>
#include <string_view>

namespace coltrain::tensor {

// Host memory; kernels through Eigen and a thread pool.
struct Cpu {
  static constexpr std::string_view kName = "cpu";
};

// Device memory of the current CUDA device; kernels under nvcc (coltrain/cuda/).
struct Cuda {
  static constexpr std::string_view kName = "cuda";
};

template <class D>
concept Device = std::same_as<D, Cpu> || std::same_as<D, Cuda>;

}  // namespace coltrain::tensor
