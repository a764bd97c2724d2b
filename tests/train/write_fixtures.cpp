// Writes what the Python halves of the train tests read (tests/train/CMakeLists.txt runs it first):
//
//   train_fixture_writer checkpoints DIR
//       DIR/<case>/: a checkpoint (train/checkpoint.hpp) after a few training steps, and
//       outputs.safetensors with a fixed input and the network's evaluation-mode logits, for
//       load_checkpoint.py. Cases: mlp (fp32, SGD with momentum), resnet20 (fp32, SGD: BatchNorm
//       statistics and num_batches_tracked) and mlp_bf16 (bf16 storage, AdamW, fp32 masters).
//   train_fixture_writer run-log DIR
//       DIR/: a run log (train/run_log.hpp) of a short made-up run, for scripts/plot_run.
//
// DIR is emptied first, so that reruns start clean.

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/models/mlp.hpp>
#include <coltrain/models/resnet.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/tensor/safetensors.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/metrics.hpp>
#include <coltrain/train/phase_tracker.hpp>
#include <coltrain/train/run_log.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace coltrain;

// Uniform [0, 1) values stored as T, and labels in [0, 10), from a seed.
template <class T>
void fill(tensor::Tensor<T>& images, std::vector<std::int32_t>& labels, std::uint64_t seed) {
  nn::Rng rng(seed);
  for (std::int64_t i = 0; i < images.numel(); ++i) {
    images.data()[i] = T(static_cast<float>(rng.uniform()));
  }
  for (std::int32_t& label : labels) label = static_cast<std::int32_t>(rng.next() % 10);
}

// Trains `steps` steps, checkpoints into `dir`, and writes the evaluation-mode logits of a fixed
// batch of 4.
template <class Spec, class Policy, class Optimizer>
void write_case(const fs::path& dir, const std::string& model_name, Optimizer settings, int steps) {
  using T = typename Policy::Storage;
  using Input = typename nn::Network<Spec, T>::Input;
  constexpr std::int64_t kBatch = 4;
  nn::Network<Spec, T> net({.threads = 1, .seed = 3});
  auto params = optim::parameters_of(net);
  optim::PrecisionOptimizer<Policy, Optimizer> optimizer(params, settings);
  nn::SoftmaxCrossEntropy loss;
  tensor::Tensor<T> images(Input::batch(kBatch));
  tensor::Tensor<T> grad({kBatch, 10});
  std::vector<std::int32_t> labels(kBatch);
  for (int step = 0; step < steps; ++step) {
    fill(images, labels, 100 + static_cast<std::uint64_t>(step));
    net.zero_grad();
    const auto logits = net.forward(images.view());
    loss.loss_and_grad<T>(logits, labels, grad.view(), optimizer.loss_scale());
    net.backward(grad.view());
    optimizer.step(0.05);
  }
  train::save_checkpoint(dir, net, optimizer, {.epoch = 1, .global_step = steps},
                         {.model_name = model_name});

  net.eval();
  fill(images, labels, 7);
  const auto logits = net.forward(images.view());
  tensor::SafetensorsWriter outputs;
  const auto dims = images.shape().dims();
  outputs.add("input", std::vector<std::int64_t>(dims.begin(), dims.end()), images.span());
  outputs.add("logits", {kBatch, 10},
              std::span<const T>(logits.data(), static_cast<std::size_t>(logits.numel())));
  outputs.write(dir / "outputs.safetensors");
}

void write_checkpoints(const fs::path& dir) {
  write_case<models::Mlp, optim::Fp32>(dir / "mlp", "mlp", optim::Sgd({.momentum = 0.9}), 3);
  write_case<models::ResNet<20>, optim::Fp32>(
      dir / "resnet20", "resnet20", optim::Sgd({.momentum = 0.9, .weight_decay = 1e-4}), 2);
  write_case<models::Mlp, optim::MixedBf16>(dir / "mlp_bf16", "mlp", optim::AdamW({.lr = 1e-3}), 3);
}

// Five epochs of a run that learns: falling losses, rising accuracy, an evaluation every epoch.
void write_run_log(const fs::path& dir) {
  train::RunLog log(dir);
  log.write_config(
      Json::object({{"model", "resnet20"}, {"batch", 128}, {"lr", 0.1}, {"epochs", 5}}));
  train::PhaseTracker phases;
  for (int epoch = 1; epoch <= 5; ++epoch) {
    phases.start_epoch();
    phases.add_seconds(train::Phase::kForward, 1.0 + 0.1 * epoch, 390);
    phases.add_seconds(train::Phase::kBackward, 2.0, 390);
    train::EpochRecord record;
    record.epoch = epoch;
    record.global_step = 390 * epoch;
    record.train_loss = 2.3 / epoch;
    record.train_accuracy = 1.0 - 0.9 / epoch;
    record.val_loss = 2.4 / epoch;
    record.val_top1 = 1.0 - 0.95 / epoch;
    record.val_top5 = 1.0 - 0.5 / epoch;
    record.lr = 0.1;
    record.images_per_second = 400;
    record.epoch_seconds = 125;
    record.elapsed_seconds = 125.0 * epoch;
    record.phase_seconds = phases.epoch_json();
    log.append_epoch(record);
  }
  train::RunResult result;
  result.epochs = 5;
  result.global_step = 5 * 390;
  result.total_seconds = 625;
  result.backend = "none";
  result.target_accuracy = 0.75;
  log.write_result(result);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view usage = "usage: train_fixture_writer checkpoints|run-log DIR\n";
  if (argc != 3) {
    std::fputs(usage.data(), stderr);
    return 2;
  }
  const std::string_view what = argv[1];
  const fs::path dir = argv[2];
  try {
    fs::remove_all(dir);
    if (what == "checkpoints") {
      write_checkpoints(dir);
    } else if (what == "run-log") {
      write_run_log(dir);
    } else {
      std::fputs(usage.data(), stderr);
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fixture_writer: %s\n", e.what());
    return 1;
  }
  std::printf("wrote %s\n", dir.c_str());
  return 0;
}
