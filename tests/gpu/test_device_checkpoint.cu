// Checkpoints of a GPU run (cuda/train/checkpoint.cuh) against the CPU's (train/checkpoint.hpp):
// MnistConvNet trained a few steps on the GPU, in fp32 and fp16, saved and loaded into the same
// model on the CPU (weights and optimizer state bit for bit, evaluation logits within 1e-4 in
// fp32); a CPU checkpoint loaded on the GPU; and a GPU run saved, loaded into a fresh network and
// optimizer and trained on, equal bit for bit to the uninterrupted run.
//
// Convolutions run as im2col + cuBLAS here: cuDNN times its algorithms per network, and two
// networks may pick different ones, which would make a bitwise resume compare algorithms rather
// than checkpoints.
#define COLTRAIN_CUDA_CONV_IM2COL 1

#include <coltrain/core/dtype.hpp>
#include <coltrain/cuda/nn.cuh>
#include <coltrain/cuda/optim/device_optimizer.cuh>
#include <coltrain/cuda/train/checkpoint.cuh>
#include <coltrain/models.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/tensor/device_copy.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/state_dict.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support/temp_dir.hpp"

namespace {

using namespace coltrain;
using coltrain::testing::TempDir;
using Model = models::MnistConvNet;

constexpr std::int64_t kBatch = 16;
constexpr std::int64_t kSteps = 8;
constexpr std::uint64_t kSeed = 23;
// A scale that grows within the run (every 3 clean steps), so that its state is not the initial.
constexpr optim::DynamicLossScaler::Options kScaler{.init_scale = 256.0f, .growth_interval = 3};

double learning_rate(std::int64_t step) { return 0.02 / (1.0 + static_cast<double>(step) / 10.0); }

// Batch `step`: images in [0, 1) and labels, functions of the step only.
template <class T>
void make_batch(std::int64_t step, tensor::Tensor<T>& images, std::span<std::int32_t> labels) {
  nn::Rng rng(0xba7c4 ^ (static_cast<std::uint64_t>(step) * 0x9E3779B97F4A7C15ull));
  for (std::int32_t& label : labels) label = static_cast<std::int32_t>(rng.next() % 10);
  for (T& v : images.span()) v = T(static_cast<float>(rng.uniform()));
}

template <class Policy, class Optimizer>
struct GpuRun {
  using T = typename Policy::Storage;
  using Net = nn::Network<Model, T, tensor::Cuda>;

  explicit GpuRun(Optimizer settings)
      : net({.seed = kSeed}), optimizer(net, std::move(settings), kScaler) {}

  void train(std::int64_t first, std::int64_t last) {
    net.train();
    const cudaStream_t stream = net.context().stream();
    for (std::int64_t step = first; step < last; ++step) {
      make_batch(step, host_images, labels);
      tensor::copy<T, tensor::Cpu, tensor::Cuda>(std::as_const(host_images).view(), images.view(),
                                                 stream);
      tensor::copy<std::int32_t, tensor::Cpu, tensor::Cuda>(
          tensor::TensorView<const std::int32_t>(labels.data(), tensor::Shape{kBatch}),
          device_labels.view(), stream);
      optimizer.set_lr(learning_rate(step));
      net.zero_grad();
      const auto logits = net.forward(images.view());
      loss.forward_backward<T>(logits, device_labels.view(), grad.view(),
                               optimizer.loss_scale_device(), stream);
      net.backward(grad.view());
      optimizer.step();
    }
    net.context().synchronize();
  }

  // Evaluation-mode logits of `input`, as floats.
  std::vector<float> logits(const tensor::Tensor<T>& input) {
    net.eval();
    const auto device_input = tensor::to_device(input);
    const auto out = tensor::to_host(net.forward(device_input.view()), net.context().stream());
    net.train();
    std::vector<float> values;
    for (const T& v : out.span()) values.push_back(static_cast<float>(v));
    return values;
  }

  // The state_dict as name -> bytes, read from the device.
  std::vector<std::pair<std::string, std::vector<std::byte>>> state_bytes() {
    const auto tensors = train::detail::device_state_tensors(net, true);
    std::vector<std::pair<std::string, std::vector<std::byte>>> out;
    for (const train::StateTensor& t : tensors.tensors) {
      out.emplace_back(t.name, std::vector<std::byte>(t.bytes.begin(), t.bytes.end()));
    }
    return out;
  }

  Net net;
  optim::DevicePrecisionOptimizer<Policy, Optimizer> optimizer;
  nn::DeviceSoftmaxCrossEntropy loss;
  tensor::Tensor<T> host_images{tensor::Shape{kBatch, 1, 28, 28}};
  std::vector<std::int32_t> labels = std::vector<std::int32_t>(kBatch);
  tensor::Tensor<T, tensor::Cuda> images{tensor::Shape{kBatch, 1, 28, 28}};
  tensor::Tensor<std::int32_t, tensor::Cuda> device_labels{tensor::Shape{kBatch}};
  tensor::Tensor<T, tensor::Cuda> grad{tensor::Shape{kBatch, 10}};
};

template <class Policy, class Optimizer>
struct CpuRun {
  using T = typename Policy::Storage;

  explicit CpuRun(Optimizer settings)
      : net({.threads = 1, .seed = kSeed}),
        params(optim::parameters_of(net)),
        optimizer(params, std::move(settings), kScaler) {}

  void train(std::int64_t first, std::int64_t last) {
    net.train();
    for (std::int64_t step = first; step < last; ++step) {
      make_batch(step, images, labels);
      net.zero_grad();
      const auto logits = net.forward(images.view());
      loss.loss_and_grad<T>(logits, labels, grad.view(), optimizer.loss_scale());
      net.backward(grad.view());
      optimizer.step(learning_rate(step));
    }
  }

  std::vector<float> logits(const tensor::Tensor<T>& input) {
    net.eval();
    const auto out = net.forward(input.view());
    net.train();
    std::vector<float> values;
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      values.push_back(static_cast<float>(out.data()[i]));
    }
    return values;
  }

  std::vector<std::pair<std::string, std::vector<std::byte>>> state_bytes() {
    std::vector<std::pair<std::string, std::vector<std::byte>>> out;
    for (const train::StateTensor& t : train::state_tensors(net)) {
      out.emplace_back(t.name, std::vector<std::byte>(t.bytes.begin(), t.bytes.end()));
    }
    return out;
  }

  nn::Network<Model, T> net;
  std::vector<optim::TypedParamRef<T>> params;
  optim::PrecisionOptimizer<Policy, Optimizer> optimizer;
  nn::SoftmaxCrossEntropy loss;
  tensor::Tensor<T> images{tensor::Shape{kBatch, 1, 28, 28}};
  tensor::Tensor<T> grad{tensor::Shape{kBatch, 10}};
  std::vector<std::int32_t> labels = std::vector<std::int32_t>(kBatch);
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_tensors(const std::vector<optim::OptimizerSnapshot::Tensor>& a,
                  const std::vector<optim::OptimizerSnapshot::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || !same_bits(a[i].values, b[i].values)) return false;
  }
  return true;
}

// The state both sides keep, bitwise; `counters` also compares steps taken and skipped (which
// only the device counts).
void check_same_state(const optim::OptimizerSnapshot& got, const optim::OptimizerSnapshot& expected,
                      bool counters) {
  CHECK(same_tensors(got.state, expected.state));
  CHECK(got.step_counts == expected.step_counts);
  CHECK(same_tensors(got.masters, expected.masters));
  REQUIRE(got.loss_scale.has_value() == expected.loss_scale.has_value());
  if (expected.loss_scale) {
    CHECK(got.loss_scale->scale == expected.loss_scale->scale);
    CHECK(got.loss_scale->growth_tracker == expected.loss_scale->growth_tracker);
  }
  if (counters) {
    CHECK(got.steps_taken == expected.steps_taken);
    CHECK(got.steps_skipped == expected.steps_skipped);
  }
}

// Logits of the two devices: the largest difference relative to max(1, |logit|).
double logit_error(const std::vector<float>& got, const std::vector<float>& expected) {
  REQUIRE(got.size() == expected.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double scale = std::max(1.0, std::abs(static_cast<double>(expected[i])));
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - expected[i]) / scale);
  }
  return worst;
}

template <class T>
tensor::Tensor<T> evaluation_batch() {
  tensor::Tensor<T> images(tensor::Shape{kBatch, 1, 28, 28});
  std::vector<std::int32_t> unused(kBatch);
  make_batch<T>(1'000'000, images, unused);
  return images;
}

// fp32: the two devices' arithmetic agrees to about 1e-6; 16-bit storage rounds each layer's
// output, and a one-ulp difference early (2^-11 in fp16, 2^-8 in bf16) shows in the logits.
template <class Policy>
constexpr double logit_tolerance() {
  using S = typename Policy::Storage;
  if constexpr (std::is_same_v<S, float>) {
    return 1e-4;
  } else if constexpr (std::is_same_v<S, coltrain::half>) {
    return 2e-2;
  } else {
    return 6e-2;
  }
}

template <class Policy, class Optimizer>
void check_gpu_checkpoint_loads_on_cpu(const Optimizer& settings) {
  TempDir dir("coltrain_gpu_ckpt");
  GpuRun<Policy, Optimizer> gpu(settings);
  gpu.train(0, kSteps);
  train::save_checkpoint(dir.path(), gpu.net, gpu.optimizer, {.epoch = 1, .global_step = kSteps},
                         {.model_name = "mnist_convnet"});

  CpuRun<Policy, Optimizer> cpu(settings);
  const train::TrainingState state =
      train::load_checkpoint(dir.path(), cpu.net, cpu.optimizer, {.model_name = "mnist_convnet"});
  CHECK(state.global_step == kSteps);
  CHECK(cpu.net.context().step() == static_cast<std::uint64_t>(kSteps));
  CHECK(cpu.state_bytes() == gpu.state_bytes());
  check_same_state(cpu.optimizer.export_state(), gpu.optimizer.export_state(), false);

  const auto images = evaluation_batch<typename Policy::Storage>();
  CHECK(logit_error(cpu.logits(images), gpu.logits(images)) < logit_tolerance<Policy>());
}

template <class Policy, class Optimizer>
void check_cpu_checkpoint_loads_on_gpu(const Optimizer& settings) {
  TempDir dir("coltrain_gpu_ckpt");
  CpuRun<Policy, Optimizer> cpu(settings);
  cpu.train(0, kSteps);
  train::save_checkpoint(dir.path(), cpu.net, cpu.optimizer, {.epoch = 1, .global_step = kSteps});

  GpuRun<Policy, Optimizer> gpu(settings);
  const train::TrainingState state = train::load_checkpoint(dir.path(), gpu.net, gpu.optimizer);
  CHECK(state.global_step == kSteps);
  CHECK(gpu.net.context().step() == static_cast<std::uint64_t>(kSteps));
  CHECK(gpu.state_bytes() == cpu.state_bytes());
  check_same_state(gpu.optimizer.export_state(), cpu.optimizer.export_state(), false);
  // Without the device's counters: none skipped, taken from the state (see import_state).
  CHECK(gpu.optimizer.steps_skipped() == 0);
  if constexpr (std::is_same_v<Optimizer, optim::Adam>) {
    CHECK(gpu.optimizer.steps_taken() == cpu.optimizer.optimizer().step_count(0));
  } else {
    CHECK(gpu.optimizer.steps_taken() == 1);
  }

  const auto images = evaluation_batch<typename Policy::Storage>();
  CHECK(logit_error(gpu.logits(images), cpu.logits(images)) < logit_tolerance<Policy>());
  // And it trains on from there, counting on from the imported step.
  const std::int64_t taken = gpu.optimizer.steps_taken();
  gpu.train(kSteps, kSteps + 2);
  CHECK(gpu.optimizer.steps_taken() + gpu.optimizer.steps_skipped() == taken + 2);
  for (const float logit : gpu.logits(images)) CHECK(std::isfinite(logit));
}

template <class Policy, class Optimizer>
void check_gpu_resume_is_exact(const Optimizer& settings) {
  TempDir dir("coltrain_gpu_ckpt");
  GpuRun<Policy, Optimizer> original(settings);
  original.train(0, kSteps);
  train::save_checkpoint(dir.path(), original.net, original.optimizer,
                         {.epoch = 2, .global_step = kSteps});
  original.train(kSteps, 2 * kSteps);

  GpuRun<Policy, Optimizer> resumed(settings);
  const train::TrainingState state =
      train::load_checkpoint(dir.path(), resumed.net, resumed.optimizer);
  CHECK(state.epoch == 2);
  REQUIRE(state.global_step == kSteps);
  resumed.train(kSteps, 2 * kSteps);

  const auto expected = original.state_bytes();
  const auto actual = resumed.state_bytes();
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO(expected[i].first);
    CHECK(actual[i].first == expected[i].first);
    CHECK(actual[i].second == expected[i].second);
  }
  check_same_state(resumed.optimizer.export_state(), original.optimizer.export_state(), true);
  CHECK(resumed.net.context().step() == original.net.context().step());
}

}  // namespace

TEST_CASE("A GPU checkpoint loads on the CPU: same weights and state, logits within 1e-4 (fp32)") {
  check_gpu_checkpoint_loads_on_cpu<optim::Fp32>(optim::Sgd({.momentum = 0.9}));
  check_gpu_checkpoint_loads_on_cpu<optim::Fp32>(optim::Adam({.lr = 1e-3}));
}

TEST_CASE("An fp16 GPU checkpoint loads on the CPU with its masters and loss scale") {
  check_gpu_checkpoint_loads_on_cpu<optim::MixedFp16>(optim::Adam({.lr = 1e-3}));
  check_gpu_checkpoint_loads_on_cpu<optim::MixedFp16>(optim::Sgd({.momentum = 0.9}));
}

TEST_CASE("A CPU checkpoint loads on the GPU") {
  check_cpu_checkpoint_loads_on_gpu<optim::Fp32>(optim::Adam({.lr = 1e-3}));
  check_cpu_checkpoint_loads_on_gpu<optim::MixedFp16>(optim::Sgd({.momentum = 0.9}));
  check_cpu_checkpoint_loads_on_gpu<optim::MixedBf16>(optim::Adam({.lr = 1e-3}));
}

TEST_CASE("Resuming on the GPU from a checkpoint equals the uninterrupted run bit for bit") {
  check_gpu_resume_is_exact<optim::Fp32>(optim::Sgd({.momentum = 0.9, .weight_decay = 1e-4}));
  check_gpu_resume_is_exact<optim::MixedFp16>(optim::Sgd({.momentum = 0.9}));
  check_gpu_resume_is_exact<optim::MixedFp16>(optim::Adam({.lr = 1e-3}));
  check_gpu_resume_is_exact<optim::MixedBf16>(optim::AdamW({.lr = 1e-3}));
}
