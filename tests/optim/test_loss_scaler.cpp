// DynamicLossScaler's state machine (GradScaler's: start at 2^16, halve and skip on Inf/NaN,
// double after exactly growth_interval clean steps, an overflow restarts the count) and the
// unscale-and-check of float, half and bfloat16 gradients.

#include <coltrain/core/dtype.hpp>
#include <coltrain/optim/loss_scaler.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace {

using coltrain::bfloat16;
using coltrain::half;
using coltrain::InvalidArgument;
using coltrain::optim::DynamicLossScaler;
using coltrain::optim::unscale_and_check;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void clean_steps(DynamicLossScaler& scaler, int count) {
  for (int i = 0; i < count; ++i) REQUIRE(scaler.update(false));
}

}  // namespace

TEST_CASE("DynamicLossScaler starts at 2^16 with GradScaler's defaults", "[optim][scaler]") {
  const DynamicLossScaler scaler;
  CHECK(scaler.scale() == 65536.0f);
  CHECK(scaler.growth_tracker() == 0);
  CHECK(scaler.options().growth_factor == 2.0);
  CHECK(scaler.options().backoff_factor == 0.5);
  CHECK(scaler.options().growth_interval == 2000);
}

TEST_CASE("DynamicLossScaler halves and skips on overflow", "[optim][scaler]") {
  DynamicLossScaler scaler;
  CHECK_FALSE(scaler.update(true));
  CHECK(scaler.scale() == 32768.0f);
  CHECK(scaler.growth_tracker() == 0);
  CHECK_FALSE(scaler.update(true));
  CHECK(scaler.scale() == 16384.0f);
}

TEST_CASE("DynamicLossScaler doubles after exactly growth_interval clean steps",
          "[optim][scaler]") {
  DynamicLossScaler scaler;
  clean_steps(scaler, 1999);
  CHECK(scaler.scale() == 65536.0f);
  CHECK(scaler.growth_tracker() == 1999);
  CHECK(scaler.update(false));  // the 2000th
  CHECK(scaler.scale() == 131072.0f);
  CHECK(scaler.growth_tracker() == 0);
  clean_steps(scaler, 1999);
  CHECK(scaler.scale() == 131072.0f);
  clean_steps(scaler, 1);
  CHECK(scaler.scale() == 262144.0f);
}

TEST_CASE("An overflow restarts the count of clean steps", "[optim][scaler]") {
  DynamicLossScaler scaler;
  clean_steps(scaler, 1500);
  CHECK(scaler.growth_tracker() == 1500);
  CHECK_FALSE(scaler.update(true));
  CHECK(scaler.scale() == 32768.0f);
  CHECK(scaler.growth_tracker() == 0);
  clean_steps(scaler, 1999);
  CHECK(scaler.scale() == 32768.0f);  // 3499 clean steps in all, but only 1999 in a row
  clean_steps(scaler, 1);
  CHECK(scaler.scale() == 65536.0f);
}

TEST_CASE("DynamicLossScaler honours its options", "[optim][scaler]") {
  DynamicLossScaler scaler(DynamicLossScaler::Options{
      .init_scale = 8.0f, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 3});
  clean_steps(scaler, 3);
  CHECK(scaler.scale() == 32.0f);
  scaler.update(true);
  CHECK(scaler.scale() == 8.0f);
}

TEST_CASE("The scale never grows to infinity", "[optim][scaler]") {
  DynamicLossScaler scaler;
  scaler.set_state({0x1p127f, 1999});
  CHECK(scaler.update(false));
  CHECK(scaler.scale() == 0x1p127f);
  CHECK(scaler.growth_tracker() == 0);
}

TEST_CASE("DynamicLossScaler state round-trips for checkpoints", "[optim][scaler]") {
  DynamicLossScaler scaler;
  clean_steps(scaler, 7);
  scaler.update(true);
  clean_steps(scaler, 3);
  const DynamicLossScaler::State saved = scaler.state();
  CHECK(saved.scale == 32768.0f);
  CHECK(saved.growth_tracker == 3);

  DynamicLossScaler resumed;
  resumed.set_state(saved);
  CHECK(resumed.scale() == 32768.0f);
  CHECK(resumed.growth_tracker() == 3);
  clean_steps(resumed, 1997);
  CHECK(resumed.scale() == 65536.0f);
}

TEST_CASE("DynamicLossScaler rejects invalid options and states", "[optim][scaler][errors]") {
  using Options = DynamicLossScaler::Options;
  CHECK_THROWS_AS(DynamicLossScaler(Options{.init_scale = 0.0f}), InvalidArgument);
  CHECK_THROWS_AS(DynamicLossScaler(Options{.init_scale = kInf}), InvalidArgument);
  CHECK_THROWS_AS(DynamicLossScaler(Options{.growth_factor = 1.0}), InvalidArgument);
  CHECK_THROWS_AS(DynamicLossScaler(Options{.backoff_factor = 1.0}), InvalidArgument);
  CHECK_THROWS_AS(DynamicLossScaler(Options{.backoff_factor = 0.0}), InvalidArgument);
  CHECK_THROWS_AS(DynamicLossScaler(Options{.growth_interval = 0}), InvalidArgument);
  DynamicLossScaler scaler;
  CHECK_THROWS_AS(scaler.set_state({kNaN, 0}), InvalidArgument);
  CHECK_THROWS_AS(scaler.set_state({-1.0f, 0}), InvalidArgument);
  CHECK_THROWS_AS(scaler.set_state({1.0f, 2000}), InvalidArgument);
  CHECK_THROWS_AS(scaler.set_state({1.0f, -1}), InvalidArgument);
  CHECK(scaler.scale() == 65536.0f);
}

TEST_CASE("unscale_and_check divides by the scale and flags Inf and NaN", "[optim][scaler]") {
  std::vector<float> out(3);
  SECTION("float") {
    const std::vector<float> grads{1024.0f, -2.0f, 0.0f};
    CHECK(unscale_and_check(std::span<const float>(grads), std::span<float>(out), 1.0f / 1024));
    CHECK(out == std::vector<float>{1.0f, -2.0f / 1024, 0.0f});
    const std::vector<float> inf{1.0f, kInf, 0.0f};
    CHECK_FALSE(unscale_and_check(std::span<const float>(inf), std::span<float>(out), 0.5f));
    const std::vector<float> nan{kNaN, 1.0f, 0.0f};
    CHECK_FALSE(unscale_and_check(std::span<const float>(nan), std::span<float>(out), 0.5f));
  }
  SECTION("half") {
    const std::vector<half> grads{half(65504.0f), half(-0.5f), half(0.0f)};
    CHECK(DynamicLossScaler::unscale_and_check(std::span<const half>(grads), std::span<float>(out),
                                               1.0f / 65536));
    CHECK(out == std::vector<float>{65504.0f / 65536, -0.5f / 65536, 0.0f});
    const std::vector<half> overflowed{half(1.0f), half(70000.0f), half(0.0f)};  // rounds to Inf
    CHECK_FALSE(
        unscale_and_check(std::span<const half>(overflowed), std::span<float>(out), 1.0f / 65536));
    const std::vector<half> nan{half(1.0f), half(1.0f), half(kNaN)};
    CHECK_FALSE(unscale_and_check(std::span<const half>(nan), std::span<float>(out), 1.0f));
  }
  SECTION("bfloat16") {
    const std::vector<bfloat16> grads{bfloat16(3.0f), bfloat16(-1e30f), bfloat16(0.25f)};
    CHECK(unscale_and_check(std::span<const bfloat16>(grads), std::span<float>(out), 1.0f));
    CHECK(out[0] == 3.0f);
    CHECK(out[1] == static_cast<float>(bfloat16(-1e30f)));
    const std::vector<bfloat16> inf{bfloat16(-kInf), bfloat16(0.0f), bfloat16(0.0f)};
    CHECK_FALSE(unscale_and_check(std::span<const bfloat16>(inf), std::span<float>(out), 1.0f));
  }
  SECTION("a finite gradient that overflows once unscaled by a scale below 1") {
    const std::vector<float> grads{3e38f, 0.0f, 0.0f};
    CHECK_FALSE(unscale_and_check(std::span<const float>(grads), std::span<float>(out), 4.0f));
  }
  SECTION("sizes must match") {
    const std::vector<float> grads{1.0f, 2.0f};
    CHECK_THROWS_AS(unscale_and_check(std::span<const float>(grads), std::span<float>(out), 1.0f),
                    InvalidArgument);
  }
}
