#pragma once
// The device kernel that coltrain's own NCCL algorithms (ring and tree over ncclSend/ncclRecv)
// reduce received chunks with. Kernels need nvcc, and the communicator is host code that g++
// builds too, so the kernel is reached through a function pointer that
// <coltrain/cuda/nccl_reduce.cuh> registers when a translation unit compiled by nvcc includes it
// (communicator.hpp includes it under nvcc). A program built by g++ alone has none: there, ring and
// tree on NCCL are refused and Algorithm::kAutomatic picks NCCL's own collectives.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/comm/device/nccl/device_reduction.hpp needs CUDA: build with COLTRAIN_WITH_CUDA=1"
#endif

#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>

#include <cuda_runtime.h>

#include <cstddef>

namespace coltrain::comm {

// Enqueues output[i] = a[i] op b[i] for i < count on `stream` (output may equal a), then, when
// `divisor` > 1, divides output by it (kAvg's last step; integers truncate). kAvg adds. f16 and
// bf16 are combined in f32. coltrain::cuda::device_reduce (cuda/nccl_reduce.cuh) is one.
using DeviceReduction = void (*)(void* output, const void* a, const void* b, std::size_t count,
                                 DataType dtype, ReduceOp op, int divisor, cudaStream_t stream);

// The process's registered kernel; null until a translation unit that includes
// <coltrain/cuda/nccl_reduce.cuh> has been initialised (before main).
inline DeviceReduction& registered_device_reduction() {
  static DeviceReduction reduction = nullptr;
  return reduction;
}

}  // namespace coltrain::comm
