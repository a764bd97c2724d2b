// Catch2 main for GPU tests. With no usable CUDA device it prints "skipped: no CUDA device" and
// exits with kSkipReturnCode, which CTest reports as a skipped test (SKIP_RETURN_CODE), never as a
// pass.
#include <cuda_runtime.h>
#include "catch_session.hpp"

#include <cstdio>

namespace {
constexpr int kSkipReturnCode = 77;
}

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device (%s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "device count is 0");
    return kSkipReturnCode;
  }
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, 0) == cudaSuccess) {
    std::printf("CUDA device 0: %s (compute capability %d.%d)\n", properties.name, properties.major,
                properties.minor);
  }
  return coltrain::test::run_catch_session(argc, argv);
}
