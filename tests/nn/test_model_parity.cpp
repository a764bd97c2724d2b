// Parity with PyTorch 1.13 (CPU), training. layer_references.py trains each model's PyTorch twin
// for 5 SGD steps (lr 0.05, momentum 0.9, written out by hand on both sides) and stores the initial
// state_dict, every batch and loss, the first step's logits and gradients and the final state_dict;
// this suite loads the initial state_dict BY NAME (the name sets must be equal on both sides) and
// replays the run on coltrain's own weights.
//
// Tolerances, per tensor, with e = PyTorch's tensor and a = coltrain's (see parity_helpers.hpp):
//   max_i |a_i - e_i| <= rel * max(max_i |e_i|, 1e-6)
// rel = 1e-5 for the first step's logits, loss and gradients; rel = 1e-4 for every step's loss and
// the final weights and BatchNorm statistics (float32). ResNet-20's float32 run is chaotic (see its
// test case): there the first output and loss are held to 1e-5 and the losses to 2e-2, and the
// whole run is held to 1e-5 in float64 instead; ResNet-32 and ResNet-56 run in float64 alone. Set
// NN_PARITY_REPORT=1 to print every comparison's error.

#include <catch2/catch.hpp>

#include <coltrain/models/cifar_net.hpp>
#include <coltrain/models/mlp.hpp>
#include <coltrain/models/mnist_convnet.hpp>
#include <coltrain/models/resnet.hpp>
#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/loss.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/pooling.hpp>
#include <coltrain/nn/sequential.hpp>

#include "parity_helpers.hpp"

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace nn_parity;  // NOLINT: the suite's vocabulary
namespace models = coltrain::models;
using nn::Input;
using nn::Sequential;

// ---------------------------------------------------------------------------------------------
// Models: 5 SGD steps with momentum, by hand on both sides.

// One SGD step with momentum as layer_references.py takes it: buf = grad at the first step, then
// buf = momentum * buf + grad; p -= lr * buf.
template <class Net, class T>
void sgd_step(Net& net, std::map<std::string, std::vector<T>>& buffers, T lr, T momentum) {
  net.visit_parameters([&](const std::string& name, nn::Parameter<T, tensor::Cpu>& p) {
    std::vector<T>& buf = buffers[name];
    const T* g = p.grad.data();
    T* v = p.value.data();
    if (buf.empty()) {
      buf.assign(g, g + p.grad.numel());
    } else {
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = momentum * buf[i] + g[i];
    }
    for (std::size_t i = 0; i < buf.size(); ++i) v[i] -= lr * buf[i];
  });
}

struct TrainingChecks {
  double loss_rel;            // every step's loss (the first one always at kRel)
  bool first_step_gradients;  // the first step's parameter gradients at kRel
  double final_rel;           // the state_dict after the last step; 0: not compared
};

// Replays the reference's SGD run on coltrain's own weights (loaded once, by name).
template <class Model, class T>
void check_training(const std::string& file, int threads, const TrainingChecks& checks) {
  const Reader reference = parity_reference(file);
  const Json config = config_of(reference);
  nn::Network<Model, T> net({.threads = threads});
  if (config["mode"] == "eval") net.eval();
  load_state(net, reference, "state.");
  const int steps = config["steps"].get<int>();
  REQUIRE(steps >= 2);
  const T lr = config["lr"].get<T>();
  const T momentum = config["momentum"].get<T>();
  std::map<std::string, std::vector<T>> buffers;
  std::vector<double> losses, torch_losses;
  for (int step = 0; step < steps; ++step) {
    const std::string k = std::to_string(step);
    tensor::Tensor<T> x(
        tensor::Shape(std::span<const std::int64_t>(reference.entry("input." + k).shape)));
    reference.read_into<T>("input." + k, x.span());
    const std::vector<std::int32_t> labels = reference.read<std::int32_t>("labels." + k);
    net.zero_grad();
    const auto logits = net.forward(x.view());
    tensor::Tensor<T> grad(logits.shape());
    losses.push_back(nn::SoftmaxCrossEntropy().loss_and_grad<T>(logits, labels, grad.view()));
    torch_losses.push_back(reference.read<double>("loss." + k).at(0));
    net.backward(grad.view());
    if (step == 0) {
      compare(logits.span(), std::span<const T>(reference.read<T>("output.0")), kRel,
              file + " step 0 output");
      compare(std::vector<double>{losses[0]}, std::vector<double>{torch_losses[0]}, kRel,
              file + " step 0 loss");
      if (checks.first_step_gradients)
        compare_state(net, reference, "grad.0.", Parameters::kGradients, false, kRel,
                      file + " step 0");
    }
    sgd_step(net, buffers, lr, momentum);
  }
  compare(losses, torch_losses, checks.loss_rel,
          file + " losses of " + std::to_string(steps) + " SGD steps");
  // Training moves the loss: a comparison of two constant curves would prove little.
  CHECK(losses.front() != losses.back());
  if (checks.final_rel > 0)
    compare_state(net, reference, "final.", Parameters::kValues, true, checks.final_rel,
                  file + " after training:");
}

}  // namespace

// Float32 training runs: every step's loss within 1e-4, the first step's output, loss and gradients
// within 1e-5, the final weights and statistics within 1e-4.
TEST_CASE("parity: Mlp, 5 SGD steps", "[nn][parity][training]") {
  check_training<models::Mlp, float>("model_mlp.safetensors", 2,
                                     {kTrainingRel, true, kTrainingRel});
}

TEST_CASE("parity: MnistConvNet (eval mode: dropout off), 5 SGD steps", "[nn][parity][training]") {
  check_training<models::MnistConvNet, float>("model_mnist_convnet.safetensors", 2,
                                              {kTrainingRel, true, kTrainingRel});
}

TEST_CASE("parity: CifarNet, 5 SGD steps", "[nn][parity][training]") {
  check_training<models::CifarNet, float>("model_cifar_net.safetensors", 2,
                                          {kTrainingRel, true, kTrainingRel});
}

// ResNet-20 (batch 8, random labels, lr 0.05, momentum 0.9) is another matter in float32:
//   - its run is chaotic: in PyTorch alone, scaling the initial weights by 1 + 1e-6 N(0, 1) moves
//   the
//     fifth loss by 6e-3 and the final BatchNorm biases by tens of percent (coltrain's F(4x4, 3x3)
//     convolutions, 5e-6 from the direct product, move it by 8.6e-3);
//   - even one step's gradients are fragile: with some 1.5 million ReLU inputs, most of them
//     BatchNorm outputs of unit scale, about one lies within float32 rounding of zero, and a ReLU
//     that PyTorch opens and coltrain closes moves the first convolution's gradient by ~1e-3.
// So in float32 only the forward quantities are held to 1e-5 (first output and loss) and the loss
// curve to kResNetRunRel; the same run in float64 (no decision flips at 1e-16) is compared whole:
// every loss, the first step's gradients and the final weights and BatchNorm statistics, at 1e-5.
TEST_CASE("parity: ResNet<20> with BatchNorm in training mode, 5 SGD steps in float32",
          "[nn][parity][training]") {
  check_training<models::ResNet<20>, float>("model_resnet20.safetensors", 2,
                                            {kResNetRunRel, false, 0.0});
}

TEST_CASE("parity: ResNet<20> with BatchNorm in training mode, 5 SGD steps in float64",
          "[nn][parity][training]") {
  check_training<models::ResNet<20>, double>("model_resnet20_double.safetensors", 2,
                                             {kRel, true, kRel});
}

// ResNet-32 and ResNet-56: ResNet-20's blocks, 5 and 9 per stage, held as ResNet-20's float64 run
// is (worst errors measured: 6e-12 and 2.5e-10 of the 1e-5 allowed).
TEST_CASE("parity: ResNet<32> with BatchNorm in training mode, 5 SGD steps in float64",
          "[nn][parity][training]") {
  check_training<models::ResNet<32>, double>("model_resnet32_double.safetensors", 2,
                                             {kRel, true, kRel});
}

TEST_CASE("parity: ResNet<56> with BatchNorm in training mode, 5 SGD steps in float64",
          "[nn][parity][training]") {
  check_training<models::ResNet<56>, double>("model_resnet56_double.safetensors", 2,
                                             {kRel, true, kRel});
}
