// Device side of test_dtype_device.cpp: the conversions run here through the same header as on the
// host, but take its device branch (the hardware conversion instructions).

#include "dtype_device_kernels.hpp"

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <cuda_runtime.h>

#include <cstddef>

namespace coltrain::test {
namespace {

constexpr unsigned kPatterns = 0x10000;
constexpr unsigned kThreadsPerBlock = 256;

// Owns one device allocation. Freeing cannot report an error from a destructor; a failed free shows
// up in the next checked call of the test.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    COLTRAIN_CHECK_CUDA(cudaMalloc(&data_, count * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }

  void upload(const std::vector<T>& host) {
    COLTRAIN_CHECK_CUDA(cudaMemcpy(data_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
  }

  std::vector<T> download() const {
    std::vector<T> host(count_);
    COLTRAIN_CHECK_CUDA(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t count_;
};

unsigned blocks_for(std::size_t count) {
  return static_cast<unsigned>((count + kThreadsPerBlock - 1) / kThreadsPerBlock);
}

__global__ void widen_all_patterns(float* half_to_float, float* bf16_to_float) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= kPatterns) return;
  const auto bits = static_cast<std::uint16_t>(i);
  half_to_float[i] = static_cast<float>(half::from_bits(bits));
  bf16_to_float[i] = static_cast<float>(bfloat16::from_bits(bits));
}

// Also round-trips through CUDA's own types, which must preserve the bits.
__global__ void narrow_inputs(const float* inputs, std::size_t count, std::uint16_t* half_bits,
                              std::uint16_t* bf16_bits) {
  const std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= count) return;
  half_bits[i] = from_cuda(to_cuda(half(inputs[i]))).bits();
  bf16_bits[i] = from_cuda(to_cuda(bfloat16(inputs[i]))).bits();
}

}  // namespace

DeviceDtypeConversions convert_half_and_bf16_on_device(const std::vector<float>& inputs) {
  DeviceDtypeConversions result;

  DeviceBuffer<float> half_to_float(kPatterns);
  DeviceBuffer<float> bf16_to_float(kPatterns);
  widen_all_patterns<<<blocks_for(kPatterns), kThreadsPerBlock>>>(half_to_float.get(),
                                                                  bf16_to_float.get());
  COLTRAIN_CHECK_CUDA_LAUNCH();
  COLTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
  result.half_to_float = half_to_float.download();
  result.bf16_to_float = bf16_to_float.download();

  // A launch of zero blocks is an error, and there is nothing to convert.
  if (inputs.empty()) return result;
  DeviceBuffer<float> device_inputs(inputs.size());
  DeviceBuffer<std::uint16_t> half_bits(inputs.size());
  DeviceBuffer<std::uint16_t> bf16_bits(inputs.size());
  device_inputs.upload(inputs);
  narrow_inputs<<<blocks_for(inputs.size()), kThreadsPerBlock>>>(device_inputs.get(), inputs.size(),
                                                                 half_bits.get(), bf16_bits.get());
  COLTRAIN_CHECK_CUDA_LAUNCH();
  COLTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
  result.float_to_half_bits = half_bits.download();
  result.float_to_bf16_bits = bf16_bits.download();
  return result;
}

}  // namespace coltrain::test
