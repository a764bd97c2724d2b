// The check macros turn library status codes into BackendError. The error-string functions they
// call work without a GPU, so these run on any machine with the CUDA toolkit.
#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#if COLTRAIN_WITH_CUDNN
#include <cudnn.h>
#endif
#if COLTRAIN_WITH_NCCL
#include <nccl.h>
#endif

#include <string>

using Catch::Matchers::Contains;

namespace {
int calls = 0;
cudaError_t count_call(cudaError_t status) {
  ++calls;
  return status;
}
}  // namespace

TEST_CASE("COLTRAIN_CHECK_CUDA passes success through and evaluates its argument once", "[cuda]") {
  calls = 0;
  COLTRAIN_CHECK_CUDA(count_call(cudaSuccess));
  CHECK(calls == 1);
}

TEST_CASE("COLTRAIN_CHECK_CUDA throws with CUDA's name, message, the call and file:line",
          "[cuda]") {
  calls = 0;
  try {
    COLTRAIN_CHECK_CUDA(count_call(cudaErrorInvalidValue));
    FAIL("no exception");
  } catch (const coltrain::BackendError& e) {
    CHECK(calls == 1);
    CHECK(e.library() == "CUDA");
    CHECK(e.code() == static_cast<long>(cudaErrorInvalidValue));
    CHECK_THAT(e.what(), Contains("cudaErrorInvalidValue") && Contains("count_call") &&
                             Contains("test_cuda_checks.cpp:"));
  }
}

TEST_CASE("COLTRAIN_CHECK_CUBLAS throws with cuBLAS's status string", "[cuda]") {
  CHECK_THROWS_WITH([] { COLTRAIN_CHECK_CUBLAS(CUBLAS_STATUS_NOT_INITIALIZED); }(),
                    Contains("cuBLAS error") && Contains("CUBLAS_STATUS_NOT_INITIALIZED"));
}

#if COLTRAIN_WITH_CUDNN
TEST_CASE("COLTRAIN_CHECK_CUDNN throws with cuDNN's status string", "[cuda]") {
  CHECK_THROWS_WITH([] { COLTRAIN_CHECK_CUDNN(CUDNN_STATUS_BAD_PARAM); }(),
                    Contains("cuDNN error") && Contains("CUDNN_STATUS_BAD_PARAM"));
}
#endif

#if COLTRAIN_WITH_NCCL
TEST_CASE("COLTRAIN_CHECK_NCCL throws with NCCL's message", "[cuda]") {
  const std::string expected = ncclGetErrorString(ncclInvalidArgument);
  CHECK_THROWS_WITH([] { COLTRAIN_CHECK_NCCL(ncclInvalidArgument); }(),
                    Contains("NCCL error") && Contains(expected));
}
#endif
