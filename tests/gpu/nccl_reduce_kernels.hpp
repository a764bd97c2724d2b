#pragma once
// coltrain::cuda::device_reduce, compiled by nvcc (nccl_reduce_kernels.cu) and handed to the
// host-compiled test as the comm::DeviceReduction that the NCCL ring and tree need.

#include <coltrain/comm/device/nccl/device_reduction.hpp>

namespace coltrain::test {

comm::DeviceReduction nccl_device_reduction();

}  // namespace coltrain::test
