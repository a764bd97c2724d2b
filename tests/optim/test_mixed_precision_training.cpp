// End to end: a small network stored in fp16 or bf16 trains like its fp32 twin through
// PrecisionOptimizer, and fp16 overflow is caught, skipped and backed off inside a real training
// loop (the loss scaler's state machine with real gradients, not hand-made ones).

#include <catch2/catch.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using namespace coltrain;

// Two Gaussian blobs per class in 16 dimensions, 4 classes: learnable in a few dozen steps.
using SmallNet = nn::Sequential<nn::Input<16>, nn::Linear<32>, nn::ReLU, nn::Linear<4>>;

struct Data {
  tensor::Tensor<float> images{tensor::Shape{64, 16}};
  std::vector<std::int32_t> labels = std::vector<std::int32_t>(64);
};

Data make_data() {
  Data d;
  nn::Rng rng(11);
  for (int i = 0; i < 64; ++i) {
    const int label = i % 4;
    d.labels[static_cast<std::size_t>(i)] = label;
    for (int j = 0; j < 16; ++j)
      d.images.data()[i * 16 + j] = static_cast<float>((j % 4 == label ? 1.5 : 0.0) + rng.uniform(-0.5, 0.5));
  }
  return d;
}

// Trains `steps` SGD steps with storage type T under policy P; returns the losses.
template <class P>
std::vector<double> train(int steps, double loss_multiplier_at_step_5 = 1.0,
                          std::vector<float>* scales = nullptr) {
  using T = typename P::Storage;
  const Data data = make_data();
  nn::Network<SmallNet, T> net({.seed = 5});
  tensor::Tensor<T> images(data.images.shape());
  for (std::int64_t i = 0; i < images.numel(); ++i) images.data()[i] = T(data.images.data()[i]);
  auto params = optim::parameters_of(net);
  optim::PrecisionOptimizer<P, optim::Sgd> sgd(params, optim::Sgd({.lr = 0.1, .momentum = 0.9}));
  nn::SoftmaxCrossEntropy loss;
  tensor::Tensor<T> grad({64, 4});
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    net.zero_grad();
    auto logits = net.forward(images.view());
    // A huge factor at one step makes the scaled fp16 gradients overflow.
    const double factor = step == 5 ? loss_multiplier_at_step_5 : 1.0;
    losses.push_back(loss.loss_and_grad<T>(logits, data.labels, grad.view(), sgd.loss_scale() * factor));
    net.backward(grad.view());
    if (scales) scales->push_back(sgd.loss_scale());
    sgd.step(0.1);
  }
  return losses;
}

}  // namespace

TEST_CASE("fp16 and bf16 storage train like fp32", "[optim][precision][training]") {
  const auto fp32 = train<optim::Fp32>(40);
  const auto fp16 = train<optim::MixedFp16>(40);
  const auto bf16 = train<optim::MixedBf16>(40);
  REQUIRE(fp32.back() < 0.1 * fp32.front());
  // Same initial weights (rounded), so the curves start together and end close.
  CHECK(std::abs(fp16.front() - fp32.front()) < 1e-2);
  CHECK(std::abs(bf16.front() - fp32.front()) < 5e-2);
  CHECK(fp16.back() < 0.1 * fp16.front());
  CHECK(bf16.back() < 0.1 * bf16.front());
  CHECK(std::abs(fp16.back() - fp32.back()) < 0.05);
  CHECK(std::abs(bf16.back() - fp32.back()) < 0.05);
}

TEST_CASE("An fp16 overflow in training is skipped and halves the loss scale", "[optim][precision][training]") {
  std::vector<float> scales;
  // 2^16 (the scale) x 1e5: fp16's largest finite value is 65504, so gradients become Inf.
  const auto losses = train<optim::MixedFp16>(12, 1e5, &scales);
  REQUIRE(scales.size() == 12);
  CHECK(scales[5] == 65536.0f);
  CHECK(scales[6] == 32768.0f);   // halved after the overflowing step
  CHECK(scales[11] == 32768.0f);  // no growth before 2000 clean steps
  // The skipped step left the weights alone: training still converges afterwards.
  CHECK(losses.back() < 0.2 * losses.front());
}
