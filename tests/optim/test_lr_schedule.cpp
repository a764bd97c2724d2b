// Learning-rate schedules: values at and around their boundaries, the warm-up convention, the
// linear scaling rule, and argument errors. PyTorch's own scheduler values are compared in
// test_optimizer_parity.cpp.

#include <coltrain/optim/lr_schedule.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>

namespace {

using coltrain::InvalidArgument;
using coltrain::optim::ConstantLr;
using coltrain::optim::CosineAnnealingLr;
using coltrain::optim::LinearWarmup;
using coltrain::optim::MultiStepLr;
using coltrain::optim::scale_lr_linearly;
using coltrain::optim::StepLr;

}  // namespace

TEST_CASE("ConstantLr is constant by default and PyTorch's ConstantLR with a factor",
          "[optim][schedule]") {
  const ConstantLr constant{0.1};
  CHECK(constant(0) == 0.1);
  CHECK(constant(1000000) == 0.1);
  const ConstantLr reduced{0.1, 0.5, 3};
  CHECK(reduced(0) == Approx(0.05));
  CHECK(reduced(2) == Approx(0.05));
  CHECK(reduced(3) == 0.1);
}

TEST_CASE("StepLr decays by gamma every step_size steps", "[optim][schedule]") {
  const StepLr schedule{0.1, 30, 0.1};
  CHECK(schedule(0) == 0.1);
  CHECK(schedule(29) == 0.1);
  CHECK(schedule(30) == Approx(0.01));
  CHECK(schedule(59) == Approx(0.01));
  CHECK(schedule(60) == Approx(0.001));
  CHECK(StepLr{.base_lr = 1.0, .step_size = 1, .gamma = 0.5}(3) == 0.125);
}

TEST_CASE("MultiStepLr decays at each milestone", "[optim][schedule]") {
  // He et al.'s ResNet-20 schedule: 0.1, /10 at 32k and 48k iterations.
  const MultiStepLr resnet{0.1, {32000, 48000}, 0.1};
  CHECK(resnet(0) == 0.1);
  CHECK(resnet(31999) == 0.1);
  CHECK(resnet(32000) == Approx(0.01));
  CHECK(resnet(47999) == Approx(0.01));
  CHECK(resnet(48000) == Approx(0.001));
  CHECK(resnet(64000) == Approx(0.001));

  SECTION("unsorted and repeated milestones, as PyTorch's Counter") {
    const MultiStepLr schedule{1.0, {5, 2, 5}, 0.5};
    CHECK(schedule(1) == 1.0);
    CHECK(schedule(2) == 0.5);
    CHECK(schedule(4) == 0.5);
    CHECK(schedule(5) == 0.125);
  }
  SECTION("no milestones") { CHECK(MultiStepLr{0.3, {}, 0.1}(100) == 0.3); }
}

TEST_CASE("CosineAnnealingLr follows PyTorch's closed form", "[optim][schedule]") {
  const CosineAnnealingLr schedule{0.1, 10, 0.001};
  CHECK(schedule(0) == 0.1);
  CHECK(schedule(5) == Approx(0.0505));  // halfway: the mean of base and eta_min
  CHECK(schedule(10) == Approx(0.001));
  CHECK(schedule(3) == Approx(0.001 + 0.099 * (1 + std::cos(3.14159265358979 * 0.3)) / 2));
  CHECK(schedule(20) == Approx(0.1));  // past t_max the cosine rises again, as PyTorch's
  CHECK(CosineAnnealingLr{1.0, 4}(4) == 0.0);
}

TEST_CASE("LinearWarmup ramps to the inner schedule, which then starts at its step 0",
          "[optim][schedule]") {
  const LinearWarmup warmup{5, 0.2, StepLr{0.1, 3, 0.5}};
  CHECK(warmup(0) == Approx(0.02));  // start_factor * inner(0)
  CHECK(warmup(1) == Approx(0.1 * (0.2 + 0.8 / 5)));
  CHECK(warmup(4) == Approx(0.1 * (0.2 + 0.8 * 4 / 5)));
  CHECK(warmup(5) == 0.1);           // inner(0)
  CHECK(warmup(7) == 0.1);           // inner(2)
  CHECK(warmup(8) == Approx(0.05));  // inner(3): the inner milestones count from the warm-up's end

  SECTION("without warm-up steps it is the inner schedule") {
    const LinearWarmup none{0, 0.1, CosineAnnealingLr{0.1, 10}};
    CHECK(none(0) == 0.1);
    CHECK(none(10) == CosineAnnealingLr{0.1, 10}(10));
  }
  SECTION("Goyal et al.: 5 epochs from lr / k at k = 8 ranks") {
    const double lr = scale_lr_linearly(0.1, 8);
    const LinearWarmup goyal{5, 1.0 / 8, MultiStepLr{lr, {30, 60, 80}, 0.1}};
    CHECK(goyal(0) == Approx(0.1));
    CHECK(goyal(5) == Approx(0.8));
    CHECK(goyal(35) == Approx(0.08));
  }
}

TEST_CASE("scale_lr_linearly multiplies by world_size / base_world_size", "[optim][schedule]") {
  CHECK(scale_lr_linearly(0.1, 1) == 0.1);
  CHECK(scale_lr_linearly(0.1, 8) == Approx(0.8));
  CHECK(scale_lr_linearly(0.1, 8, 2) == Approx(0.4));
  CHECK(scale_lr_linearly(0.1, 3, 4) == Approx(0.075));
  CHECK_THROWS_AS(scale_lr_linearly(0.1, 0), InvalidArgument);
  CHECK_THROWS_AS(scale_lr_linearly(0.1, 4, -1), InvalidArgument);
}

TEST_CASE("Schedules reject invalid arguments when evaluated", "[optim][schedule][errors]") {
  CHECK_THROWS_AS((StepLr{0.1, 0, 0.1}(1)), InvalidArgument);
  CHECK_THROWS_AS((StepLr{0.1, 10, 0.1}(-1)), InvalidArgument);
  CHECK_THROWS_AS((CosineAnnealingLr{0.1, 0}(0)), InvalidArgument);
  CHECK_THROWS_AS((MultiStepLr{0.1, {10}, 0.1}(-5)), InvalidArgument);
  CHECK_THROWS_AS((ConstantLr{0.1, 1.5, 2}(0)), InvalidArgument);
  CHECK_THROWS_AS((LinearWarmup{5, 1.5, ConstantLr{0.1}}(0)), InvalidArgument);
  CHECK_THROWS_AS((LinearWarmup{-1, 0.5, ConstantLr{0.1}}(0)), InvalidArgument);
}
