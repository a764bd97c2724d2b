#include <catch2/catch.hpp>
#include <coltrain/core/config.hpp>

#include <string>

TEST_CASE("version string agrees with the version numbers", "[config]") {
  const std::string expected = std::to_string(COLTRAIN_VERSION_MAJOR) + "." +
                               std::to_string(COLTRAIN_VERSION_MINOR) + "." +
                               std::to_string(COLTRAIN_VERSION_PATCH);
  CHECK(std::string(coltrain::BuildConfig::kVersion) == expected);
}

TEST_CASE("COLTRAIN_VERSION orders versions as their numbers do", "[config]") {
  STATIC_REQUIRE(COLTRAIN_VERSION == COLTRAIN_MAKE_VERSION(COLTRAIN_VERSION_MAJOR,
                                                           COLTRAIN_VERSION_MINOR,
                                                           COLTRAIN_VERSION_PATCH));
  STATIC_REQUIRE(COLTRAIN_MAKE_VERSION(0, 1, 99) < COLTRAIN_MAKE_VERSION(0, 2, 0));
  STATIC_REQUIRE(COLTRAIN_MAKE_VERSION(0, 99, 0) < COLTRAIN_MAKE_VERSION(1, 0, 0));
}

TEST_CASE("BuildConfig mirrors the backend macros", "[config]") {
  CHECK(coltrain::BuildConfig::kWithMpi == (COLTRAIN_WITH_MPI == 1));
  CHECK(coltrain::BuildConfig::kWithCuda == (COLTRAIN_WITH_CUDA == 1));
  CHECK(coltrain::BuildConfig::kWithNccl == (COLTRAIN_WITH_NCCL == 1));
  CHECK(coltrain::BuildConfig::kWithCudnn == (COLTRAIN_WITH_CUDNN == 1));
  // NCCL and cuDNN are only ever enabled on top of CUDA.
  CHECK((!coltrain::BuildConfig::kWithNccl || coltrain::BuildConfig::kWithCuda));
  CHECK((!coltrain::BuildConfig::kWithCudnn || coltrain::BuildConfig::kWithCuda));
}

TEST_CASE("host compilation sees no device annotations", "[config]") {
  STATIC_REQUIRE(COLTRAIN_DEVICE_CODE == 0);
}
