#pragma once
// The elementwise reduction of coltrain's ring and tree allreduce on NCCL
// (comm/device/nccl/nccl_backend.hpp): output = a op b over one received chunk, then, on kAvg's
// last step, a division by the number of ranks. Including this header (communicator.hpp does, under
// nvcc) registers it for the process (comm/device/nccl/device_reduction.hpp), so a program with one
// nvcc-compiled translation unit that includes the communicator needs no call to enable ring and
// tree on device buffers.
//
// f16 and bf16 are combined in f32 and rounded once per step, as NCCL does; integers wrap on
// overflow and divide truncating, as the host reductions (comm/algorithms/reduce_kernels.hpp) do.

#if !defined(__CUDACC__)
#error "coltrain/cuda/nccl_reduce.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/comm/device/nccl/device_reduction.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/launch.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace coltrain::cuda {
namespace detail {

// The type an element is combined in: f32 for the 16-bit floats, else itself.
template <class T>
using Combined =
    std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;

// The same comparisons as the host's reduce_into, so min and max pick the same operand.
template <class W>
__device__ inline W combine(W a, W b, comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::kMin:
      return b < a ? b : a;
    case comm::ReduceOp::kMax:
      return a < b ? b : a;
    case comm::ReduceOp::kProd:
      if constexpr (std::is_integral_v<W>) {
        using U = std::make_unsigned_t<W>;
        return static_cast<W>(static_cast<U>(a) * static_cast<U>(b));
      } else {
        return a * b;
      }
    default:  // kSum; kAvg adds and divides once, at the end
      if constexpr (std::is_integral_v<W>) {
        using U = std::make_unsigned_t<W>;
        return static_cast<W>(static_cast<U>(a) + static_cast<U>(b));
      } else {
        return a + b;
      }
  }
}

template <class T>
__global__ void reduce_kernel(T* output, const T* a, const T* b, std::int64_t count,
                              comm::ReduceOp op, int divisor) {
  using W = Combined<T>;
  for (std::int64_t i = grid_index(); i < count; i += grid_stride()) {
    W value = combine(static_cast<W>(a[i]), static_cast<W>(b[i]), op);
    if (divisor > 1) value = value / static_cast<W>(divisor);
    output[i] = static_cast<T>(value);
  }
}

template <class T>
void launch_reduce(void* output, const void* a, const void* b, std::size_t count, comm::ReduceOp op,
                   int divisor, cudaStream_t stream) {
  const auto n = static_cast<std::int64_t>(count);
  reduce_kernel<kernel_t<T>><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(
      static_cast<T*>(output), static_cast<const T*>(a), static_cast<const T*>(b), n, op, divisor);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

}  // namespace detail

// A comm::DeviceReduction: enqueues output[i] = a[i] op b[i] (output may equal a), then divides by
// `divisor` when it is above 1.
inline void device_reduce(void* output, const void* a, const void* b, std::size_t count,
                          DataType dtype, comm::ReduceOp op, int divisor, cudaStream_t stream) {
  if (count == 0) return;
  switch (dtype) {
    case DataType::kFloat32:
      return detail::launch_reduce<float>(output, a, b, count, op, divisor, stream);
    case DataType::kFloat64:
      return detail::launch_reduce<double>(output, a, b, count, op, divisor, stream);
    case DataType::kFloat16:
      return detail::launch_reduce<half>(output, a, b, count, op, divisor, stream);
    case DataType::kBFloat16:
      return detail::launch_reduce<bfloat16>(output, a, b, count, op, divisor, stream);
    case DataType::kInt32:
      return detail::launch_reduce<std::int32_t>(output, a, b, count, op, divisor, stream);
    case DataType::kInt64:
      return detail::launch_reduce<std::int64_t>(output, a, b, count, op, divisor, stream);
    case DataType::kUInt8:
      return detail::launch_reduce<std::uint8_t>(output, a, b, count, op, divisor, stream);
  }
  throw InvalidArgument("device_reduce: dtype value " + std::to_string(static_cast<int>(dtype)) +
                        " is not a coltrain DataType");
}

namespace detail {

// Registered while this translation unit is initialised, before main; every unit that includes
// this header registers the same function.
[[maybe_unused]] static const bool kDeviceReduceRegistered =
    (comm::registered_device_reduction() = &device_reduce, true);

}  // namespace detail
}  // namespace coltrain::cuda
