// The optimizer state a checkpoint carries, as an optim::OptimizerSnapshot: what PrecisionOptimizer
// exports for every policy (fp32, fp16, bf16) and optimizer (SGD with momentum, Adam), imported
// into a fresh optimizer and through a checkpoint bit for bit, and training on from there equal to
// an uninterrupted run; the device optimizer's counters (steps taken and skipped) through the
// sidecar; imports that do not fit rejected before anything changes; and checkpoints of format
// version 1, as the writer before snapshots wrote them (tests/train/checkpoint_v1), still loading
// and saving again to the same bytes.

#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/tensor/safetensors.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/state_dict.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"
#include "train_test_helpers.hpp"

#ifndef COLTRAIN_TEST_CHECKPOINT_V1_DIR
#error "COLTRAIN_TEST_CHECKPOINT_V1_DIR must name tests/train/checkpoint_v1"
#endif

namespace {

namespace fs = std::filesystem;
using namespace coltrain;
using Catch::Matchers::Contains;
using coltrain::testing::TempDir;
using train_test::Trainer;

// A scale that both grows and backs off within a few dozen steps of the tiny model.
constexpr optim::DynamicLossScaler::Options kScaler{.init_scale = 1024.0f, .growth_interval = 7};
constexpr std::int64_t kSteps = 30;

bool same_tensors(const std::vector<optim::OptimizerSnapshot::Tensor>& a,
                  const std::vector<optim::OptimizerSnapshot::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || !train_test::same_bits(a[i].values, b[i].values)) return false;
  }
  return true;
}

// Every field, bitwise.
void check_same(const optim::OptimizerSnapshot& got, const optim::OptimizerSnapshot& expected) {
  CHECK(same_tensors(got.state, expected.state));
  CHECK(got.step_counts == expected.step_counts);
  CHECK(same_tensors(got.masters, expected.masters));
  REQUIRE(got.loss_scale.has_value() == expected.loss_scale.has_value());
  if (expected.loss_scale) {
    CHECK(std::memcmp(&got.loss_scale->scale, &expected.loss_scale->scale, sizeof(float)) == 0);
    CHECK(got.loss_scale->growth_tracker == expected.loss_scale->growth_tracker);
  }
  CHECK(got.steps_taken == expected.steps_taken);
  CHECK(got.steps_skipped == expected.steps_skipped);
}

template <class Optimizer>
Optimizer settings() {
  if constexpr (std::is_same_v<Optimizer, optim::Sgd>) {
    return optim::Sgd({.momentum = 0.9, .weight_decay = 1e-4});
  } else {
    return optim::Adam({.lr = 1e-3});
  }
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEMPLATE_PRODUCT_TEST_CASE(
    "A precision optimizer's state round-trips through a snapshot and a "
    "checkpoint bit for bit",
    "[train][checkpoint][snapshot]", std::pair,
    ((optim::Fp32, optim::Sgd), (optim::Fp32, optim::Adam), (optim::MixedFp16, optim::Sgd),
     (optim::MixedFp16, optim::Adam), (optim::MixedBf16, optim::Sgd),
     (optim::MixedBf16, optim::Adam))) {
  using Policy = typename TestType::first_type;
  using Optimizer = typename TestType::second_type;
  constexpr bool kAdam = std::is_same_v<Optimizer, optim::Adam>;
  TempDir dir("coltrain_snapshot");

  Trainer<Policy, Optimizer> original(settings<Optimizer>(), kScaler);
  original.train(0, kSteps);
  const optim::OptimizerSnapshot snapshot = original.optimizer.export_state();

  // What it holds: 6 parameters' state under PyTorch's names, Adam's step counts, the masters of
  // 16-bit storage, the loss scale of fp16, and no device counters.
  REQUIRE(snapshot.state.size() == (kAdam ? 12u : 6u));
  CHECK(snapshot.state[0].name == (kAdam ? "conv.weight.exp_avg" : "conv.weight.momentum_buffer"));
  CHECK(snapshot.state[0].values.size() == 72);
  CHECK(snapshot.step_counts.size() == (kAdam ? 6u : 0u));
  if constexpr (kAdam) {
    CHECK(snapshot.step_counts[5].first == "fc.bias.step");
    CHECK(snapshot.step_counts[5].second == original.optimizer.optimizer().step_count(5));
  }
  CHECK(snapshot.masters.size() == (Policy::kMasterWeights ? 6u : 0u));
  CHECK(snapshot.loss_scale.has_value() == Policy::kLossScaling);
  if constexpr (Policy::kLossScaling) {
    // The scale moved (grown every 7 clean steps, halved on overflow): not the trivial state.
    CHECK(snapshot.loss_scale->scale != kScaler.init_scale);
  }
  CHECK(!snapshot.steps_taken);
  CHECK(!snapshot.steps_skipped);

  SECTION("imported into a fresh optimizer") {
    Trainer<Policy, Optimizer> fresh(settings<Optimizer>(), kScaler);
    fresh.optimizer.import_state(snapshot);
    check_same(fresh.optimizer.export_state(), snapshot);
  }

  SECTION("through a checkpoint, then trained on as if never interrupted") {
    train::save_checkpoint(dir.path(), original.net, original.optimizer,
                           {.epoch = 1, .global_step = kSteps});
    Trainer<Policy, Optimizer> resumed(settings<Optimizer>(), kScaler);
    const train::TrainingState state =
        train::load_checkpoint(dir.path(), resumed.net, resumed.optimizer);
    REQUIRE(state.global_step == kSteps);
    check_same(resumed.optimizer.export_state(), snapshot);
    CHECK(train_test::state_bytes(resumed.net) == train_test::state_bytes(original.net));

    original.train(kSteps, 2 * kSteps);
    resumed.train(kSteps, 2 * kSteps);
    CHECK(train_test::state_bytes(resumed.net) == train_test::state_bytes(original.net));
    check_same(resumed.optimizer.export_state(), original.optimizer.export_state());
  }
}

TEST_CASE("The device optimizer's counters go through the sidecar and the CPU ignores them",
          "[train][checkpoint][snapshot]") {
  TempDir dir("coltrain_snapshot");
  using Policy = optim::MixedFp16;
  Trainer<Policy, optim::Adam> run(optim::Adam({.lr = 1e-3}), kScaler);
  run.train(0, kSteps);
  // A snapshot as DevicePrecisionOptimizer exports it: one step count for every parameter, and
  // the counts of steps taken and skipped.
  optim::OptimizerSnapshot snapshot = run.optimizer.export_state();
  const std::int64_t taken = run.optimizer.optimizer().step_count(0);
  snapshot.steps_taken = taken;
  snapshot.steps_skipped = kSteps - taken;
  const auto files = train::detail::write_checkpoint<Policy>(
      dir.path(), train::detail::model_record(run.net, train::state_tensors(run.net)),
      run.optimizer.optimizer(), run.optimizer.scaler().options(), snapshot,
      {.epoch = 1, .global_step = kSteps}, {});
  const Json sidecar = Json::parse(read_text(files.sidecar));
  CHECK(sidecar["format_version"] == 1);
  CHECK(sidecar["optimizer"]["steps_taken"] == taken);
  CHECK(sidecar["optimizer"]["steps_skipped"] == kSteps - taken);

  // The reader hands them on (to the device optimizer)...
  Trainer<Policy, optim::Adam> target(optim::Adam({.lr = 1e-3}), kScaler);
  std::vector<std::string> names;
  for (std::size_t p = 0; p < target.optimizer.size(); ++p) {
    names.push_back(target.optimizer.parameter_name(p));
  }
  const train::detail::CheckpointContents contents = train::detail::read_checkpoint<Policy>(
      files.sidecar, train::detail::model_record(target.net, train::state_tensors(target.net)),
      target.optimizer.optimizer(), target.optimizer.scaler().options(), names, false, {});
  check_same(contents.optimizer, snapshot);

  // ...and the CPU optimizer, which does not count them, loads the rest.
  train::load_checkpoint(dir.path(), target.net, target.optimizer);
  snapshot.steps_taken.reset();
  snapshot.steps_skipped.reset();
  check_same(target.optimizer.export_state(), snapshot);
}

TEST_CASE("import_state rejects a snapshot that does not fit before changing anything",
          "[train][checkpoint][snapshot]") {
  Trainer<optim::MixedFp16, optim::Adam> source(optim::Adam({.lr = 1e-3}), kScaler);
  source.train(0, 5);
  const optim::OptimizerSnapshot good = source.optimizer.export_state();

  Trainer<optim::MixedFp16, optim::Adam> target(optim::Adam({.lr = 1e-3}), kScaler);
  const optim::OptimizerSnapshot untouched = target.optimizer.export_state();
  auto rejected = [&](const optim::OptimizerSnapshot& bad, const std::string& message) {
    CHECK_THROWS_WITH(target.optimizer.import_state(bad), Contains(message));
    check_same(target.optimizer.export_state(), untouched);
  };

  optim::OptimizerSnapshot bad = good;
  bad.state.pop_back();
  rejected(bad, "lack tensor 'fc.bias.exp_avg_sq'");
  bad = good;
  bad.state[1].values.pop_back();
  rejected(bad,
           "tensor 'conv.weight.exp_avg_sq' of the snapshot's optimizer state has 71 "
           "elements, expected 72");
  bad = good;
  bad.state.push_back({"fc.extra.exp_avg", {1.0f}});
  rejected(bad, "hold tensor 'fc.extra.exp_avg', which this optimizer does not have");
  bad = good;
  bad.step_counts[2].second = -1;
  rejected(bad, "step count 'bn.weight.step' is negative");
  bad = good;
  bad.masters[0].name = "conv.weights";
  rejected(bad, "lack tensor 'conv.weight'");
  bad = good;
  bad.loss_scale->growth_tracker = kScaler.growth_interval;
  rejected(bad, "growth tracker 7 is outside [0, 7)");
  bad = good;
  bad.loss_scale.reset();
  rejected(bad, "no loss-scaler state");

  Trainer<optim::MixedBf16, optim::Adam> bf16(optim::Adam({.lr = 1e-3}));
  CHECK_THROWS_WITH(bf16.optimizer.import_state(good), Contains("scales no loss"));
  Trainer<optim::Fp32, optim::Adam> fp32(optim::Adam({.lr = 1e-3}));
  CHECK_THROWS_WITH(fp32.optimizer.import_state(good), Contains("keeps none"));

  // A snapshot taken before the first step cannot reset an optimizer that has stepped.
  Trainer<optim::MixedFp16, optim::Adam> early(optim::Adam({.lr = 1e-3}), kScaler);
  CHECK_THROWS_WITH(source.optimizer.import_state(early.optimizer.export_state()),
                    Contains("import into a freshly constructed one"));

  target.optimizer.import_state(good);
  check_same(target.optimizer.export_state(), good);
}

TEST_CASE("Checkpoints of format version 1 load and save again to the same bytes",
          "[train][checkpoint][snapshot]") {
  // Written by the writer before snapshots (tests/train/checkpoint_v1): TinyNet after 12 steps of
  // fp16 Adam (loss scale from 1024, growth every 7 steps) and after 5 steps of fp32 SGD.
  const fs::path v1 = COLTRAIN_TEST_CHECKPOINT_V1_DIR;
  const std::string sidecar_name = "checkpoint-000001.json";
  const std::string model_name = "checkpoint-000001.model.safetensors";
  const std::string optimizer_name = "checkpoint-000001.optimizer.safetensors";

  auto check_case = [&](const std::string& which, auto& trainer, std::int64_t steps) {
    INFO(which);
    const fs::path saved = v1 / which;
    const train::TrainingState state = train::load_checkpoint(
        saved / sidecar_name, trainer.net, trainer.optimizer, {.model_name = "tiny"});
    CHECK(state.global_step == steps);
    CHECK(trainer.net.context().step() == static_cast<std::uint64_t>(steps));
    // What loaded is what the files hold.
    const tensor::SafetensorsReader optimizer_file(saved / optimizer_name);
    const optim::OptimizerSnapshot loaded = trainer.optimizer.export_state();
    for (const auto& t : loaded.state) {
      CHECK(train_test::same_bits(t.values, optimizer_file.read<float>(t.name)));
    }
    for (const auto& t : loaded.masters) {
      CHECK(train_test::same_bits(t.values, optimizer_file.read<float>(t.name + ".master_weight")));
    }

    TempDir again("coltrain_snapshot");
    train::save_checkpoint(again.path(), trainer.net, trainer.optimizer, state,
                           {.model_name = "tiny"});
    CHECK(read_text(again / model_name) == read_text(saved / model_name));
    CHECK(read_text(again / optimizer_name) == read_text(saved / optimizer_name));
    Json expected = Json::parse(read_text(saved / sidecar_name));
    Json written = Json::parse(read_text(again / sidecar_name));
    expected.erase("saved_at");
    written.erase("saved_at");
    CHECK(written.dump(2) == expected.dump(2));
  };

  Trainer<optim::MixedFp16, optim::Adam> fp16(optim::Adam({.lr = 1e-3}), kScaler);
  check_case("fp16_adam", fp16, 12);
  CHECK(fp16.optimizer.scaler().scale() == 2048.0f);
  CHECK(fp16.optimizer.scaler().growth_tracker() == 5);
  Trainer<optim::Fp32, optim::Sgd> fp32(optim::Sgd({.momentum = 0.9}));
  check_case("fp32_sgd", fp32, 5);
}
