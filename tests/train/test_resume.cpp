// Resuming from a checkpoint is exact: a run that trains 2000 steps, checkpoints and trains 2000
// more ends with the same bits as a fresh network and optimizer that load the checkpoint and train
// the same 2000 steps. For SGD with momentum and Adam in fp32, and for fp16 (loss scaling, with a
// short growth interval so that the scale moves and steps are skipped) and bf16 with fp32 masters.

#include <catch2/catch.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/checkpoint.hpp>

#include <cmath>
#include <cstdint>
#include <string>

#include "../support/temp_dir.hpp"
#include "train_test_helpers.hpp"

namespace {

using namespace coltrain;
using train_test::Trainer;

constexpr std::int64_t kSteps = 2000;

template <class Policy, class Optimizer>
void check_resume_is_exact(const Optimizer& settings,
                           optim::DynamicLossScaler::Options scaler = {}) {
  coltrain::testing::TempDir dir("coltrain_resume");
  Trainer<Policy, Optimizer> original(settings, scaler);
  original.train(0, kSteps);
  const auto saved = train::save_checkpoint(dir.path(), original.net, original.optimizer,
                                            {.epoch = 4, .global_step = kSteps});
  if constexpr (Policy::kLossScaling) {
    // The state to restore is not the trivial one: the scale has backed off at least once (it is
    // below pure growth) and the checkpoint falls inside a growth interval.
    const double pure_growth =
        scaler.init_scale * std::exp2(static_cast<double>(kSteps / scaler.growth_interval));
    CHECK(original.optimizer.scaler().scale() < pure_growth);
    CHECK(original.optimizer.scaler().growth_tracker() != 0);
  }
  original.train(kSteps, 2 * kSteps);

  Trainer<Policy, Optimizer> resumed(settings, scaler);
  const train::TrainingState state =
      train::load_checkpoint(dir.path(), resumed.net, resumed.optimizer);
  CHECK(state.epoch == 4);
  REQUIRE(state.global_step == kSteps);
  CHECK(resumed.net.context().step() == static_cast<std::uint64_t>(kSteps));
  resumed.train(state.global_step, 2 * kSteps);

  const auto expected = train_test::state_bytes(original.net);
  const auto actual = train_test::state_bytes(resumed.net);
  REQUIRE(expected.size() == actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO(expected[i].first);
    CHECK(actual[i].first == expected[i].first);
    CHECK(actual[i].second == expected[i].second);
  }
  const auto expected_state = train_test::optimizer_values(original.optimizer);
  const auto actual_state = train_test::optimizer_values(resumed.optimizer);
  REQUIRE(expected_state.size() == actual_state.size());
  for (std::size_t i = 0; i < expected_state.size(); ++i) {
    INFO(expected_state[i].first);
    CHECK(train_test::same_bits(actual_state[i].second, expected_state[i].second));
  }
  if constexpr (Policy::kLossScaling) {
    CHECK(resumed.optimizer.scaler().scale() == original.optimizer.scaler().scale());
    CHECK(resumed.optimizer.scaler().growth_tracker() ==
          original.optimizer.scaler().growth_tracker());
  }
  CHECK(saved.sequence == 1);
}

}  // namespace

TEST_CASE("Resuming SGD with momentum from a checkpoint is bitwise exact", "[train][checkpoint]") {
  check_resume_is_exact<optim::Fp32>(optim::Sgd({.momentum = 0.9, .weight_decay = 1e-4}));
}

TEST_CASE("Resuming Adam from a checkpoint is bitwise exact", "[train][checkpoint]") {
  check_resume_is_exact<optim::Fp32>(optim::Adam({.weight_decay = 1e-4}));
}

TEST_CASE("Resuming fp16 training restores the masters and the loss scale bitwise",
          "[train][checkpoint]") {
  // Growth every 150 clean steps: the scale climbs until fp16 gradients overflow, so the run
  // both grows and backs off, and the checkpoint lands in the middle of an interval.
  check_resume_is_exact<optim::MixedFp16>(optim::Sgd({.momentum = 0.9}),
                                          {.init_scale = 1024.0f, .growth_interval = 150});
}

TEST_CASE("Resuming bf16 training with AdamW restores the fp32 masters bitwise",
          "[train][checkpoint]") {
  check_resume_is_exact<optim::MixedBf16>(optim::AdamW({.lr = 1e-3}));
}

// The control: a resume that loses one piece of state (here the dropout step counter) does not end
// with the same weights, so the exact comparisons above can fail.
TEST_CASE("A resume without the context step diverges", "[train][checkpoint]") {
  coltrain::testing::TempDir dir("coltrain_resume");
  const optim::Sgd settings({.momentum = 0.9});
  Trainer<optim::Fp32, optim::Sgd> original(settings);
  original.train(0, 200);
  train::save_checkpoint(dir.path(), original.net, original.optimizer, {.global_step = 200});
  original.train(200, 400);

  Trainer<optim::Fp32, optim::Sgd> resumed(settings);
  train::load_checkpoint(dir.path(), resumed.net, resumed.optimizer);
  resumed.net.context().set_step(0);
  resumed.train(200, 400);
  CHECK(train_test::state_bytes(resumed.net) != train_test::state_bytes(original.net));
}
