#pragma once
// coltrain::cuda::device_reduce, compiled by nvcc (nccl_reduce_kernels.cu) and handed to the
// host-compiled test as the comm::DeviceReduction that NcclCommunicator's ring needs.

#include <coltrain/comm/nccl_communicator.hpp>

namespace coltrain::test {

comm::DeviceReduction nccl_device_reduction();

}  // namespace coltrain::test
