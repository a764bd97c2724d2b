// DevicePrecisionOptimizer against the CPU PrecisionOptimizer, step for step: SGD (momentum,
// dampening, Nesterov, weight decay with exempt parameters), Adam and AdamW, under the Fp32,
// MixedFp16 and MixedBf16 policies; the loss scaler's state machine with injected Inf and NaN and
// a short growth interval; a step captured into a CUDA graph and replayed with new learning rates.

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/optim/device_optimizer.cuh>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/optim/adam.hpp>
#include <coltrain/optim/loss_scaler.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/optim/sgd.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using coltrain::bfloat16;
using coltrain::half;
namespace optim = coltrain::optim;
namespace tensor = coltrain::tensor;

class Stream {
 public:
  Stream() { COLTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

template <class S>
S from_float(float value) {
  if constexpr (std::is_same_v<S, float>) {
    return value;
  } else {
    return S(value);
  }
}

template <class S>
std::uint16_t bits16(S value) {
  return value.bits();
}

// Sizes around the chunk (8192) and vector widths; one tensor is a misaligned view.
const std::vector<std::int64_t> kSizes = {1, 7, 33, 4099, 8192, 8193, 20000, 0, 100};
constexpr std::size_t kMisaligned = 3;

// A model twice: host vectors for the CPU optimizer, device tensors for the device one, equal.
template <class Policy, class Optimizer>
class Twin {
 public:
  using S = typename Policy::Storage;

  Twin(const Stream& stream, Optimizer cpu_optimizer, Optimizer device_optimizer,
       optim::DynamicLossScaler::Options scaler = {}, optim::DeviceOptimizerOptions options = {})
      : stream_(stream) {
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    values_.resize(kSizes.size());
    grads_.resize(kSizes.size());
    for (std::size_t p = 0; p < kSizes.size(); ++p) {
      const std::int64_t n = kSizes[p];
      for (std::int64_t i = 0; i < n; ++i) values_[p].push_back(from_float<S>(dist(rng)));
      grads_[p].assign(static_cast<std::size_t>(n), from_float<S>(0.0f));
      const std::int64_t offset = p == kMisaligned ? 1 : 0;
      device_values_.emplace_back(tensor::Shape{n + offset});
      device_grads_.emplace_back(tensor::Shape{n + offset});
    }
    for (std::size_t p = 0; p < kSizes.size(); ++p) {
      const std::string name = "layer" + std::to_string(p) + ".weight";
      const bool decay = p % 3 != 2;
      host_refs_.push_back({name, std::span<S>(values_[p]), std::span<S>(grads_[p]), decay});
      device_refs_.push_back({name, device_value(p), device_grad(p), values_[p].size(), decay});
      upload(device_value(p), values_[p]);
    }
    cpu_.emplace(std::span<const optim::TypedParamRef<S>>(host_refs_), std::move(cpu_optimizer),
                 scaler);
    device_.emplace(std::span<const optim::DeviceParamRef<S>>(device_refs_),
                    std::move(device_optimizer), stream.get(), scaler, options);
  }

  optim::PrecisionOptimizer<Policy, Optimizer>& cpu() { return *cpu_; }
  optim::DevicePrecisionOptimizer<Policy, Optimizer>& device() { return *device_; }

  // Fresh gradients of the size a loss scaled by the current scale gives, on both sides;
  // `poison` puts that value into one element of one tensor.
  void draw_grads(std::uint64_t seed, float poison = 0.0f) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-1e-2f, 1e-2f);
    const float scale = cpu_->loss_scale();
    for (std::size_t p = 0; p < grads_.size(); ++p) {
      for (S& g : grads_[p]) g = from_float<S>(dist(rng) * scale);
    }
    if (poison != 0.0f) grads_[4][17] = from_float<S>(poison);
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream_.get()));  // a step may still read them
    for (std::size_t p = 0; p < grads_.size(); ++p) upload(device_grad(p), grads_[p]);
  }

  // Compares everything the two optimizers hold after a step.
  void compare(const std::string& where) {
    INFO(where);
    CHECK(device_->loss_scale() == cpu_->loss_scale());
    for (std::size_t p = 0; p < values_.size(); ++p) {
      INFO("parameter " << p);
      const std::vector<S> device_values = download(device_value(p), values_[p].size());
      if constexpr (Policy::kMasterWeights) {
        const std::vector<float> master = device_->master_weights(p);
        const std::span<const float> reference = cpu_->master_weights(p);
        CHECK(relative_error(master, reference) <= 1e-6);
        // The model holds the masters rounded, and so within one 16-bit ulp of the CPU's model.
        std::size_t not_rounded = 0, far = 0;
        for (std::size_t i = 0; i < master.size(); ++i) {
          not_rounded += bits16(device_values[i]) == bits16(S(master[i])) ? 0 : 1;
          const int distance =
              static_cast<int>(bits16(device_values[i])) - static_cast<int>(bits16(values_[p][i]));
          far += std::abs(distance) <= 1 ? 0 : 1;
        }
        CHECK(not_rounded == 0);
        CHECK(far == 0);
      } else {
        CHECK(relative_error(device_values, std::span<const float>(values_[p])) <= 1e-6);
      }
      // The gradients were zeroed by the update launch.
      std::size_t nonzero = 0;
      for (S g : download(device_grad(p), grads_[p].size()))
        nonzero += static_cast<float>(g) == 0.0f ? 0 : 1;
      CHECK(nonzero == 0);
    }
  }

  S* device_value(std::size_t p) { return device_values_[p].data() + (p == kMisaligned ? 1 : 0); }
  S* device_grad(std::size_t p) { return device_grads_[p].data() + (p == kMisaligned ? 1 : 0); }

 private:
  static void upload(S* device, const std::vector<S>& host) {
    if (!host.empty()) {
      COLTRAIN_CHECK_CUDA(
          cudaMemcpy(device, host.data(), host.size() * sizeof(S), cudaMemcpyHostToDevice));
    }
  }
  std::vector<S> download(const S* device, std::size_t n) const {
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream_.get()));
    std::vector<S> host(n);
    if (n > 0)
      COLTRAIN_CHECK_CUDA(cudaMemcpy(host.data(), device, n * sizeof(S), cudaMemcpyDeviceToHost));
    return host;
  }
  template <class A>
  static double relative_error(const std::vector<A>& out, std::span<const float> ref) {
    double diff = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double o = static_cast<float>(out[i]);
      if (!std::isfinite(o)) return INFINITY;
      diff += (o - ref[i]) * (o - ref[i]);
      norm += static_cast<double>(ref[i]) * ref[i];
    }
    return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
  }

  const Stream& stream_;
  std::vector<std::vector<S>> values_, grads_;
  std::vector<tensor::Tensor<S, tensor::Cuda>> device_values_, device_grads_;
  std::vector<optim::TypedParamRef<S>> host_refs_;
  std::vector<optim::DeviceParamRef<S>> device_refs_;
  std::optional<optim::PrecisionOptimizer<Policy, Optimizer>> cpu_;
  std::optional<optim::DevicePrecisionOptimizer<Policy, Optimizer>> device_;
};

// Several steps at changing learning rates; poisons[step] injects that value into a gradient.
template <class Policy, class Optimizer>
void run_steps(const typename Optimizer::Options& options, int steps,
               optim::DynamicLossScaler::Options scaler = {},
               const std::vector<float>& poisons = {}) {
  const Stream stream;
  Twin<Policy, Optimizer> twin(stream, Optimizer(options), Optimizer(options), scaler);
  std::int64_t skipped = 0;
  for (int step = 0; step < steps; ++step) {
    const float poison = step < static_cast<int>(poisons.size()) ? poisons[step] : 0.0f;
    twin.draw_grads(100 + step, poison);
    const double lr = 0.05 / (1.0 + step);
    skipped += twin.cpu().step(lr) ? 0 : 1;
    twin.device().set_lr(lr);
    twin.device().step();
    CHECK(twin.device().steps_skipped() == skipped);
    if constexpr (Policy::kLossScaling) {
      CHECK(twin.device().growth_tracker() == twin.cpu().scaler().growth_tracker());
    } else {
      CHECK(twin.device().loss_scale() == 1.0f);
    }
    twin.compare(std::string(Policy::kName) + " step " + std::to_string(step));
  }
}

optim::Sgd::Options sgd_plain() { return {.lr = 0.1}; }
optim::Sgd::Options sgd_momentum() {
  return {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2};
}
optim::Sgd::Options sgd_nesterov() {
  return {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true};
}
optim::Adam::Options adam() { return {.lr = 1e-3, .weight_decay = 1e-2}; }
optim::AdamW::Options adamw() { return {.lr = 1e-3, .weight_decay = 1e-2}; }

TEST_CASE("device SGD equals the CPU optimizer under every policy", "[gpu][optim]") {
  for (const auto& options : {sgd_plain(), sgd_momentum(), sgd_nesterov()}) {
    run_steps<optim::Fp32, optim::Sgd>(options, 5);
    run_steps<optim::MixedFp16, optim::Sgd>(options, 5);
    run_steps<optim::MixedBf16, optim::Sgd>(options, 5);
  }
}

TEST_CASE("device Adam and AdamW equal the CPU optimizers under every policy", "[gpu][optim]") {
  run_steps<optim::Fp32, optim::Adam>(adam(), 5);
  run_steps<optim::MixedFp16, optim::Adam>(adam(), 5);
  run_steps<optim::MixedBf16, optim::Adam>(adam(), 5);
  run_steps<optim::Fp32, optim::AdamW>(adamw(), 5);
  run_steps<optim::MixedFp16, optim::AdamW>(adamw(), 5);
  run_steps<optim::MixedBf16, optim::AdamW>(adamw(), 5);
}

TEST_CASE("the device loss scaler skips overflowing steps, halves and grows the scale",
          "[gpu][optim][scaler]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  optim::DynamicLossScaler::Options scaler;
  scaler.growth_interval = 3;
  // Inf at steps 1 and 2 (two halvings), then clean steps: doubling after every 3, NaN at 9.
  const std::vector<float> poisons = {0, inf, -inf, 0, 0, 0, 0, 0, 0, nan, 0, 0, 0};
  run_steps<optim::MixedFp16, optim::Sgd>(sgd_momentum(), 13, scaler, poisons);
  run_steps<optim::MixedFp16, optim::Adam>(adam(), 13, scaler, poisons);
  // Without loss scaling a non-finite step is skipped all the same.
  run_steps<optim::Fp32, optim::Sgd>(sgd_nesterov(), 4, {}, {0, nan, 0, inf});
  run_steps<optim::MixedBf16, optim::AdamW>(adamw(), 4, {}, {0, inf, 0, 0});

  // The scale itself, step by step.
  const Stream stream;
  Twin<optim::MixedFp16, optim::Sgd> twin(stream, optim::Sgd(sgd_plain()), optim::Sgd(sgd_plain()),
                                          scaler);
  CHECK(twin.device().loss_scale() == 65536.0f);
  twin.draw_grads(1, inf);
  twin.device().step();
  CHECK(twin.device().loss_scale() == 32768.0f);
  CHECK(twin.device().steps_skipped() == 1);
  CHECK(twin.device().steps_taken() == 0);
  for (int i = 0; i < 3; ++i) {
    twin.draw_grads(2 + i);
    twin.device().step();
  }
  CHECK(twin.device().loss_scale() == 65536.0f);
  CHECK(twin.device().steps_taken() == 3);
}

TEST_CASE("the two halves: found_inf is a device flag the caller may overwrite", "[gpu][optim]") {
  const Stream stream;
  Twin<optim::MixedFp16, optim::Sgd> twin(stream, optim::Sgd(sgd_plain()), optim::Sgd(sgd_plain()));
  twin.draw_grads(1);
  twin.device().unscale_and_check();
  std::int32_t flag = -1;
  COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(&flag, twin.device().found_inf(), sizeof(flag),
                                      cudaMemcpyDeviceToHost, stream.get()));
  COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  CHECK(flag == 0);
  // Another rank overflowed: every rank skips.
  const std::int32_t one = 1;
  COLTRAIN_CHECK_CUDA(
      cudaMemcpy(twin.device().found_inf(), &one, sizeof(one), cudaMemcpyHostToDevice));
  twin.device().apply();
  CHECK(twin.device().steps_skipped() == 1);
  CHECK(twin.device().loss_scale() == 32768.0f);

  CHECK_THROWS_AS(twin.device().apply(), coltrain::Error);
  twin.device().unscale_and_check();
  CHECK_THROWS_AS(twin.device().unscale_and_check(), coltrain::Error);
  CHECK_THROWS_AS(twin.device().set_lr(-1.0), coltrain::InvalidArgument);
}

template <class Policy, class Optimizer>
void run_graph(const typename Optimizer::Options& options) {
  const Stream stream;
  Twin<Policy, Optimizer> twin(stream, Optimizer(options), Optimizer(options));
  // An eager first step, then the step captured once and replayed at other learning rates.
  twin.draw_grads(7);
  twin.cpu().step(0.05);
  twin.device().set_lr(0.05);
  twin.device().step();
  twin.compare("eager step");

  cudaGraph_t graph = nullptr;
  COLTRAIN_CHECK_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  twin.device().step();
  COLTRAIN_CHECK_CUDA(cudaStreamEndCapture(stream.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  COLTRAIN_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 4; ++replay) {
    const double lr = 0.02 * (replay + 1);
    twin.draw_grads(8 + replay, replay == 2 ? std::numeric_limits<float>::infinity() : 0.0f);
    twin.cpu().step(lr);
    twin.device().set_lr(lr);
    COLTRAIN_CHECK_CUDA(cudaGraphLaunch(exec, stream.get()));
    twin.compare(std::string(Policy::kName) + " replay " + std::to_string(replay));
  }
  CHECK(twin.device().steps_skipped() == 1);
  COLTRAIN_CHECK_CUDA(cudaGraphExecDestroy(exec));
  COLTRAIN_CHECK_CUDA(cudaGraphDestroy(graph));
}

TEST_CASE("a captured step replays with the learning rate set between replays",
          "[gpu][optim][graph]") {
  run_graph<optim::MixedFp16, optim::Adam>(adam());
  run_graph<optim::MixedFp16, optim::Sgd>(sgd_momentum());
  run_graph<optim::Fp32, optim::AdamW>(adamw());
}

// A stand-in for nn::Network<Spec, float, tensor::Cuda>: what the constructor needs of one.
struct TinyNetwork {
  using value_type = float;
  coltrain::nn::Parameter<float, tensor::Cuda> weight{tensor::Shape{4, 3}};
  coltrain::nn::Parameter<float, tensor::Cuda> bias{tensor::Shape{4}};
  coltrain::nn::Context<tensor::Cuda> context_;
  template <class F>
  void visit_parameters(F&& f) {
    f(std::string("fc.weight"), weight);
    f(std::string("fc.bias"), bias);
  }
  coltrain::nn::Context<tensor::Cuda>& context() { return context_; }
};

TEST_CASE("the device optimizer binds to a network's parameters and stream", "[gpu][optim]") {
  TinyNetwork network;
  const std::vector<float> ones(12, 1.0f);
  COLTRAIN_CHECK_CUDA(cudaMemcpy(network.weight.grad.data(), ones.data(), 12 * sizeof(float),
                                 cudaMemcpyHostToDevice));
  optim::DevicePrecisionOptimizer<optim::Fp32, optim::Sgd> opt(network, optim::Sgd({.lr = 0.5}));
  REQUIRE(opt.size() == 2);
  CHECK(opt.parameter_name(1) == "fc.bias");
  opt.step();
  std::vector<float> weight(12);
  network.context().synchronize();
  COLTRAIN_CHECK_CUDA(cudaMemcpy(weight.data(), network.weight.value.data(), 12 * sizeof(float),
                                 cudaMemcpyDeviceToHost));
  for (float w : weight) CHECK(w == -0.5f);
  CHECK_THROWS_AS((optim::DevicePrecisionOptimizer<optim::Fp32, optim::Sgd>(
                      network, optim::Sgd({.lr = 0.1, .nesterov = true}))),
                  coltrain::InvalidArgument);
}

}  // namespace
