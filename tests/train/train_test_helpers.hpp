#pragma once
// A tiny network with every kind of state a checkpoint must carry (parameters, BatchNorm statistics
// and its int64 counter, dropout masks that depend on the seed and step) and a training loop whose
// batches and learning rate are functions of the step, as a real trainer's are of (seed, epoch)
// and the step.

#include <catch2/catch.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/state_dict.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace train_test {

using namespace coltrain;

using TinyNet = nn::Sequential<nn::Input<2, 6, 6>, nn::Named<"conv", nn::Conv2d<4, 3, 1, 1>>,
                               nn::Named<"bn", nn::BatchNorm2d<>>, nn::ReLU, nn::Flatten,
                               nn::Dropout<0.25>, nn::Named<"fc", nn::Linear<5>>>;

inline constexpr std::int64_t kBatch = 8;
inline constexpr std::uint64_t kSeed = 17;

template <class Policy, class Optimizer>
struct Trainer {
  using T = typename Policy::Storage;

  explicit Trainer(Optimizer optimizer, optim::DynamicLossScaler::Options scaler = {},
                   std::uint64_t seed = kSeed)
      : net({.threads = 1, .seed = seed}),
        params(optim::parameters_of(net)),
        optimizer(params, std::move(optimizer), scaler) {}

  // Trains steps [first, last): the batch and the learning rate depend only on the step.
  void train(std::int64_t first, std::int64_t last) {
    for (std::int64_t step = first; step < last; ++step) {
      make_batch(step);
      net.zero_grad();
      const auto logits = net.forward(images.view());
      loss.loss_and_grad<T>(logits, labels, grad.view(), optimizer.loss_scale());
      net.backward(grad.view());
      optimizer.step(0.05 / (1.0 + static_cast<double>(step) / 1000.0));
    }
  }

  // Class c lights up channel c % 2 in row c of the image, under noise.
  void make_batch(std::int64_t step) {
    nn::Rng rng(0x5eed ^ (static_cast<std::uint64_t>(step) * 0x9E3779B97F4A7C15ull));
    for (std::int64_t i = 0; i < kBatch; ++i) {
      const auto label = static_cast<std::int32_t>(rng.next() % 5);
      labels[static_cast<std::size_t>(i)] = label;
      for (std::int64_t j = 0; j < 72; ++j) {
        const bool lit = j / 36 == label % 2 && (j % 36) / 6 == label;
        images.data()[i * 72 + j] =
            T(static_cast<float>((lit ? 1.0 : 0.0) + rng.uniform(-0.5, 0.5)));
      }
    }
  }

  nn::Network<TinyNet, T> net;
  std::vector<optim::TypedParamRef<T>> params;
  optim::PrecisionOptimizer<Policy, Optimizer> optimizer;
  nn::SoftmaxCrossEntropy loss;
  tensor::Tensor<T> images{tensor::Shape{kBatch, 2, 6, 6}};
  tensor::Tensor<T> grad{tensor::Shape{kBatch, 5}};
  std::vector<std::int32_t> labels = std::vector<std::int32_t>(kBatch);
};

// The network's state_dict as name -> bytes, for bitwise comparisons.
template <class Network>
std::vector<std::pair<std::string, std::vector<std::byte>>> state_bytes(Network& network) {
  std::vector<std::pair<std::string, std::vector<std::byte>>> out;
  for (const train::StateTensor& t : train::state_tensors(network)) {
    out.emplace_back(t.name, std::vector<std::byte>(t.bytes.begin(), t.bytes.end()));
  }
  return out;
}

// The optimizer's state tensors (and fp32 masters) as name -> values.
template <class Policy, class Optimizer>
std::vector<std::pair<std::string, std::vector<float>>> optimizer_values(
    const optim::PrecisionOptimizer<Policy, Optimizer>& optimizer) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  optimizer.optimizer().for_each_state([&](const std::string& name, std::span<const float> v) {
    out.emplace_back(name, std::vector<float>(v.begin(), v.end()));
  });
  if constexpr (Policy::kMasterWeights) {
    for (std::size_t p = 0; p < optimizer.size(); ++p) {
      const std::span<const float> v = optimizer.master_weights(p);
      out.emplace_back(optimizer.parameter_name(p) + ".master",
                       std::vector<float>(v.begin(), v.end()));
    }
  }
  return out;
}

// Bitwise, so that -0.0 vs 0.0 or two NaN payloads count as different.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace train_test
