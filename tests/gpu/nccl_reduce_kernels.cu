// Device side of test_nccl_communicator.cpp: instantiates the ring's and tree's reduction kernel;
// including nccl_reduce.cuh also registers it for the whole test program.

#include "nccl_reduce_kernels.hpp"

#include <coltrain/cuda/nccl_reduce.cuh>

namespace coltrain::test {

comm::DeviceReduction nccl_device_reduction() { return &cuda::device_reduce; }

}  // namespace coltrain::test
