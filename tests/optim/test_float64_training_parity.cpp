// Parity with PyTorch 1.13 (CPU) over a long run, in float64: MnistConvNet trained for 100 steps
// under the Fp64 policy with SGD (Nesterov momentum, weight decay), Adam (L2 decay) and AdamW,
// against float64_training_references.py's runs of its PyTorch twin with torch.optim, from the same
// initial state_dict (loaded by name) on the same batches.
//
// Tolerance: every step's loss within 1e-10 relative of PyTorch's. In float32 the two runs drift
// apart within about ten steps (rounding differences grow each step; see test_model_parity.cpp's
// ResNet-20), which hides real differences; in float64 they start 1e-16 apart and stay far below
// 1e-10 over 100 steps, so any difference in the arithmetic of an optimizer, a layer or the loss
// shows. The worst relative difference of each run is printed.

#include <catch2/catch.hpp>

#include <coltrain/models/mnist_convnet.hpp>
#include <coltrain/nn/loss.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/optim/adam.hpp>
#include <coltrain/optim/network_parameters.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/optim/sgd.hpp>

#include "../nn/parity_helpers.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iomanip>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace nn_parity;  // NOLINT: the parity suites' vocabulary
namespace models = coltrain::models;
namespace optim = coltrain::optim;

constexpr double kLossRel = 1e-10;
constexpr const char* kReference = "mnist_convnet_float64.safetensors";

optim::BasicSgd<double>::Options sgd_options(const Json& spec) {
  return {.lr = spec["lr"].get<double>(),
          .momentum = spec["momentum"].get<double>(),
          .dampening = spec["dampening"].get<double>(),
          .weight_decay = spec["weight_decay"].get<double>(),
          .nesterov = spec["nesterov"].get<bool>()};
}

template <class Adam>
typename Adam::Options adam_options(const Json& spec) {
  typename Adam::Options options;
  options.lr = spec["lr"].get<double>();
  options.beta1 = spec["beta1"].get<double>();
  options.beta2 = spec["beta2"].get<double>();
  options.eps = spec["eps"].get<double>();
  options.weight_decay = spec["weight_decay"].get<double>();
  return options;
}

// Replays run `case_name`, requiring every step's loss within kLossRel of PyTorch's, and prints the
// worst relative difference.
template <class Optimizer>
void replay(const std::string& case_name, const Reader& reference,
              typename Optimizer::Options options) {
  const Json config = config_of(reference);
  const auto steps = config["steps"].get<std::int64_t>();
  const auto pool = config["pool"].get<std::int64_t>();
  const std::vector<double> torch_losses = reference.read<double>("loss." + case_name);
  REQUIRE(torch_losses.size() == static_cast<std::size_t>(steps));

  nn::Network<models::MnistConvNet, double> net({.threads = 2});
  net.eval();  // dropout off, as in PyTorch's run (the model has no BatchNorm)
  load_state(net, reference, "state.");
  const auto params = optim::parameters_of(net);
  optim::PrecisionOptimizer<optim::Fp64, Optimizer> optimizer(params, Optimizer(options));

  std::vector<tensor::Tensor<double>> inputs;
  std::vector<std::vector<std::int32_t>> labels;
  for (std::int64_t b = 0; b < pool; ++b) {
    const std::string name = "input." + std::to_string(b);
    inputs.emplace_back(tensor::Shape(std::span<const std::int64_t>(reference.entry(name).shape)));
    reference.read_into<double>(name, inputs.back().span());
    labels.push_back(reference.read<std::int32_t>("labels." + std::to_string(b)));
  }

  double worst = 0.0;
  std::vector<double> losses;
  for (std::int64_t step = 0; step < steps; ++step) {
    const auto b = static_cast<std::size_t>(step % pool);
    net.zero_grad();
    const auto logits = net.forward(inputs[b].view());
    tensor::Tensor<double> grad(logits.shape());
    losses.push_back(
        nn::SoftmaxCrossEntropy().loss_and_grad<double>(logits, labels[b], grad.view()));
    net.backward(grad.view());
    optimizer.step(optimizer.optimizer().options().lr);

    const double expected = torch_losses[static_cast<std::size_t>(step)];
    const double rel = std::abs(losses.back() - expected) / std::abs(expected);
    INFO(case_name << " step " << step << std::setprecision(17) << ": loss " << losses.back()
                   << ", PyTorch's " << expected);
    REQUIRE(rel <= kLossRel);
    worst = std::max(worst, rel);
  }
  // A run whose loss did not move would compare little: the reference's falls by a fifth or more.
  CHECK(losses.back() < 0.9 * losses.front());
  std::printf("[float64 parity] %-12s %lld steps: worst relative loss difference %.3e\n",
              case_name.c_str(), static_cast<long long>(steps), worst);
}

}  // namespace

TEST_CASE("float64 parity: MnistConvNet, 100 steps of SGD with Nesterov momentum and weight decay",
          "[optim][parity][float64]") {
  const Reader reference = parity_reference(kReference);
  const Json spec = config_of(reference)["cases"]["sgd_nesterov"];
  replay<optim::BasicSgd<double>>("sgd_nesterov", reference, sgd_options(spec));
}

TEST_CASE("float64 parity: MnistConvNet, 100 steps of Adam with L2 weight decay",
          "[optim][parity][float64]") {
  const Reader reference = parity_reference(kReference);
  const Json spec = config_of(reference)["cases"]["adam"];
  replay<optim::BasicAdam<double>>("adam", reference,
                                   adam_options<optim::BasicAdam<double>>(spec));
}

TEST_CASE("float64 parity: MnistConvNet, 100 steps of AdamW", "[optim][parity][float64]") {
  const Reader reference = parity_reference(kReference);
  const Json spec = config_of(reference)["cases"]["adamw"];
  replay<optim::BasicAdamW<double>>("adamw", reference,
                                    adam_options<optim::BasicAdamW<double>>(spec));
}
