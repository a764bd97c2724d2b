// The layers and models beyond their gradients: compile-time shapes and parameter counts,
// state_dict names in PyTorch's order, BatchNorm's running statistics, Dropout's statistics,
// initialisation, gradient accumulation, errors, top-k accuracy.
//
// Results are exact, checked against values computed here in double, or statistical with stated
// margins (Dropout, initialisation); mixed precision, thread counts and batch sizes are in
// test_precision.cpp.

#include <catch2/catch.hpp>

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/models/cifar_net.hpp>
#include <coltrain/models/mlp.hpp>
#include <coltrain/models/mnist_convnet.hpp>
#include <coltrain/models/resnet.hpp>
#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/dropout.hpp>
#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/loss.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/pooling.hpp>
#include <coltrain/nn/residual.hpp>
#include <coltrain/nn/sequential.hpp>

#include "nn_test_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

namespace nn = coltrain::nn;
namespace tensor = coltrain::tensor;
namespace models = coltrain::models;
using coltrain::bfloat16;
using coltrain::half;
using nn::Input;
using nn::Sequential;
using tensor::Chw;
using tensor::Cpu;
using tensor::Flat;

template <class Spec, class In>
using OutputOf = typename nn::bind_t<Spec, In, float, Cpu>::Output;

// ----------------------------------------------------------------------------------------------
// Compile-time shapes and parameter counts.

// Conv2d: (H + 2P - K) / S + 1.
static_assert(std::is_same_v<OutputOf<nn::Conv2d<8, 3, 1, 1>, Chw<3, 32, 32>>, Chw<8, 32, 32>>);
static_assert(std::is_same_v<OutputOf<nn::Conv2d<8, 3, 2, 1>, Chw<3, 32, 32>>, Chw<8, 16, 16>>);
static_assert(std::is_same_v<OutputOf<nn::Conv2d<4, 3>, Chw<1, 28, 28>>, Chw<4, 26, 26>>);
static_assert(std::is_same_v<OutputOf<nn::Conv2d<4, 1, 2>, Chw<2, 5, 5>>, Chw<4, 3, 3>>);
static_assert(std::is_same_v<OutputOf<nn::Conv2d<4, 3, 2, 0>, Chw<2, 6, 7>>, Chw<4, 2, 3>>);
static_assert(OutputOf<nn::Conv2d<4, 3>, Chw<2, 5, 5>>::kSize == 36);
static_assert(nn::bind_t<nn::Conv2d<8, 3>, Chw<3, 9, 9>, float, Cpu>::kParameterCount == 8 * 3 * 9 + 8);
static_assert(nn::bind_t<nn::Conv2d<8, 3, 1, 1, false>, Chw<3, 9, 9>, float, Cpu>::kParameterCount ==
              8 * 3 * 9);
// Pooling: floor division, padding counted; the stride defaults to the kernel.
static_assert(std::is_same_v<OutputOf<nn::MaxPool2d<2>, Chw<3, 5, 5>>, Chw<3, 2, 2>>);
static_assert(std::is_same_v<OutputOf<nn::MaxPool2d<3, 2, 1>, Chw<3, 7, 7>>, Chw<3, 4, 4>>);
static_assert(std::is_same_v<OutputOf<nn::AvgPool2d<3, 2, 1>, Chw<2, 8, 8>>, Chw<2, 4, 4>>);
static_assert(std::is_same_v<OutputOf<nn::AvgPool2d<2, 1>, Chw<2, 4, 4>>, Chw<2, 3, 3>>);
static_assert(std::is_same_v<OutputOf<nn::GlobalAvgPool, Chw<7, 4, 5>>, Flat<7>>);
// Shape-preserving layers.
static_assert(std::is_same_v<OutputOf<nn::Flatten, Chw<2, 3, 4>>, Flat<24>>);
static_assert(std::is_same_v<OutputOf<nn::Flatten, Flat<5>>, Flat<5>>);
static_assert(std::is_same_v<OutputOf<nn::ReLU, Chw<2, 3, 4>>, Chw<2, 3, 4>>);
static_assert(std::is_same_v<OutputOf<nn::Dropout<0.5>, Flat<9>>, Flat<9>>);
static_assert(std::is_same_v<OutputOf<nn::BatchNorm2d<>, Chw<2, 3, 4>>, Chw<2, 3, 4>>);
static_assert(nn::bind_t<nn::BatchNorm2d<>, Chw<6, 3, 4>, float, Cpu>::kParameterCount == 12);
static_assert(std::is_same_v<OutputOf<nn::Linear<10>, Flat<84>>, Flat<10>>);
static_assert(nn::bind_t<nn::Linear<10>, Flat<84>, float, Cpu>::kParameterCount == 850);
static_assert(nn::bind_t<nn::Linear<10, false>, Flat<84>, float, Cpu>::kParameterCount == 840);
// Residual blocks: the projection shortcut changes channels and resolution with the body.
static_assert(std::is_same_v<OutputOf<models::BasicBlock<16, 1, false>, Chw<16, 32, 32>>, Chw<16, 32, 32>>);
static_assert(std::is_same_v<OutputOf<models::BasicBlock<32, 2, true>, Chw<16, 32, 32>>, Chw<32, 16, 16>>);
// conv1 16*16*9, bn1 32, conv2 16*16*9, bn2 32.
static_assert(nn::bind_t<models::BasicBlock<16, 1, false>, Chw<16, 8, 8>, float, Cpu>::kParameterCount ==
              2 * (16 * 16 * 9 + 32));
// conv1 16*32*9, bn1 64, conv2 32*32*9, bn2 64, shortcut conv 16*32, shortcut bn 64.
static_assert(nn::bind_t<models::BasicBlock<32, 2, true>, Chw<16, 8, 8>, float, Cpu>::kParameterCount ==
              16 * 32 * 9 + 64 + 32 * 32 * 9 + 64 + 16 * 32 + 64);
// A Sequential's input and output, and nested Sequentials.
static_assert(std::is_same_v<Sequential<Input<3, 8, 8>, nn::Conv2d<4, 3>>::DeclaredInput, Chw<3, 8, 8>>);
static_assert(std::is_void_v<Sequential<nn::Conv2d<4, 3>>::DeclaredInput>);
static_assert(std::is_same_v<OutputOf<Sequential<nn::Flatten, Sequential<nn::Linear<5>, nn::ReLU>>, Chw<1, 2, 2>>,
                             Flat<5>>);

// The models (counts from their PyTorch twins: sum(p.numel() for p in model.parameters())).
static_assert(std::is_same_v<nn::Network<models::Mlp>::Input, Chw<1, 28, 28>>);
static_assert(std::is_same_v<nn::Network<models::Mlp>::Output, Flat<10>>);
static_assert(nn::Network<models::Mlp>::kParameterCount == 136'074);
static_assert(std::is_same_v<nn::Network<models::MnistConvNet>::Output, Flat<10>>);
static_assert(nn::Network<models::MnistConvNet>::kParameterCount == 1'199'882);
static_assert(std::is_same_v<nn::Network<models::CifarNet>::Input, Chw<3, 32, 32>>);
static_assert(std::is_same_v<nn::Network<models::CifarNet>::Output, Flat<10>>);
static_assert(nn::Network<models::CifarNet>::kParameterCount == 350'142);
static_assert(std::is_same_v<nn::Network<models::ResNet<20>>::Output, Flat<10>>);
static_assert(nn::Network<models::ResNet<20>>::kParameterCount == 272'474);  // 269,722 + 2 projections
static_assert(nn::Network<models::ResNet<32>>::kParameterCount == 466'906);
static_assert(nn::Network<models::ResNet<56>>::kParameterCount == 855'770);
static_assert(std::is_same_v<nn::Network<models::ResNet18>::Output, Flat<10>>);
static_assert(nn::Network<models::ResNet18>::kParameterCount == 11'173'962);

// ----------------------------------------------------------------------------------------------
// Helpers

struct Entry {
  std::string name;
  std::vector<std::int64_t> shape;
  bool operator==(const Entry&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Entry& e) {
  os << e.name << " [";
  for (std::size_t i = 0; i < e.shape.size(); ++i) os << (i ? ", " : "") << e.shape[i];
  return os << "]";
}

template <class Net>
std::vector<Entry> parameter_entries(Net& net) {
  std::vector<Entry> entries;
  net.visit_parameters([&](const std::string& name, auto& p) {
    const auto dims = p.value.shape().dims();
    entries.push_back({name, {dims.begin(), dims.end()}});
  });
  return entries;
}

template <class Net>
std::vector<Entry> buffer_entries(Net& net) {
  std::vector<Entry> entries;
  net.visit_buffers([&](const std::string& name, auto& t) {
    const auto dims = t.shape().dims();
    entries.push_back({name, {dims.begin(), dims.end()}});
  });
  return entries;
}

void check_entries(const std::vector<Entry>& actual, const std::vector<Entry>& expected) {
  CHECK(actual.size() == expected.size());
  for (std::size_t i = 0; i < std::min(actual.size(), expected.size()); ++i) {
    INFO("entry " << i);
    CHECK(actual[i] == expected[i]);
  }
}

template <class Net>
std::int64_t counted_parameters(Net& net) {
  std::int64_t total = 0;
  net.visit_parameters([&](const std::string&, auto& p) {
    total += p.value.numel();
    CHECK(p.grad.shape() == p.value.shape());
  });
  return total;
}

std::vector<Entry> bn_buffers(const std::string& prefix, std::int64_t channels) {
  return {{prefix + "running_mean", {channels}},
          {prefix + "running_var", {channels}},
          {prefix + "num_batches_tracked", {}}};
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// Parameter counts and state_dict names

TEST_CASE("models: the visited parameters add up to the compile-time counts", "[nn][models]") {
  nn::Network<models::Mlp> mlp;
  CHECK(counted_parameters(mlp) == 136'074);
  nn::Network<models::MnistConvNet> mnist;
  CHECK(counted_parameters(mnist) == 1'199'882);
  nn::Network<models::CifarNet> cifar;
  CHECK(counted_parameters(cifar) == 350'142);
  nn::Network<models::ResNet<20>> resnet20;
  CHECK(counted_parameters(resnet20) == 272'474);
  nn::Network<models::ResNet18> resnet18;
  CHECK(counted_parameters(resnet18) == 11'173'962);
}

TEST_CASE("models: Mlp state_dict names and shapes in PyTorch order", "[nn][models][state_dict]") {
  nn::Network<models::Mlp> net;
  check_entries(parameter_entries(net), {{"fc1.weight", {128, 784}},
                                         {"fc1.bias", {128}},
                                         {"fc2.weight", {256, 128}},
                                         {"fc2.bias", {256}},
                                         {"fc3.weight", {10, 256}},
                                         {"fc3.bias", {10}}});
  CHECK(buffer_entries(net).empty());
}

TEST_CASE("models: MnistConvNet state_dict names and shapes in PyTorch order", "[nn][models][state_dict]") {
  nn::Network<models::MnistConvNet> net;
  check_entries(parameter_entries(net), {{"conv1.weight", {32, 1, 3, 3}},
                                         {"conv1.bias", {32}},
                                         {"conv2.weight", {64, 32, 3, 3}},
                                         {"conv2.bias", {64}},
                                         {"fc1.weight", {128, 9216}},
                                         {"fc1.bias", {128}},
                                         {"fc2.weight", {10, 128}},
                                         {"fc2.bias", {10}}});
  CHECK(buffer_entries(net).empty());
}

TEST_CASE("models: CifarNet state_dict names and shapes in PyTorch order", "[nn][models][state_dict]") {
  nn::Network<models::CifarNet> net;
  check_entries(parameter_entries(net), {{"conv1.weight", {32, 3, 3, 3}},
                                         {"conv1.bias", {32}},
                                         {"conv2.weight", {64, 32, 3, 3}},
                                         {"conv2.bias", {64}},
                                         {"conv3.weight", {128, 64, 3, 3}},
                                         {"conv3.bias", {128}},
                                         {"fc1.weight", {120, 2048}},
                                         {"fc1.bias", {120}},
                                         {"fc2.weight", {84, 120}},
                                         {"fc2.bias", {84}},
                                         {"fc3.weight", {10, 84}},
                                         {"fc3.bias", {10}}});
  CHECK(buffer_entries(net).empty());
}

namespace {
// The names of the CIFAR ResNets' PyTorch twins (module attributes conv1, bn1, layerS (a Sequential
// of blocks), linear; a block's conv1, bn1, conv2, bn2 and, where the shape changes, shortcut =
// Sequential(Conv2d, BatchNorm2d)), written out from that description.
void expected_resnet(const std::vector<std::int64_t>& widths, int blocks, std::vector<Entry>& parameters,
                     std::vector<Entry>& buffers) {
  auto bn = [&](const std::string& prefix, std::int64_t c) {
    parameters.push_back({prefix + "weight", {c}});
    parameters.push_back({prefix + "bias", {c}});
    for (Entry& e : bn_buffers(prefix, c)) buffers.push_back(e);
  };
  parameters.push_back({"conv1.weight", {widths[0], 3, 3, 3}});
  bn("bn1.", widths[0]);
  std::int64_t in = widths[0];
  for (std::size_t stage = 0; stage < widths.size(); ++stage) {
    const std::int64_t c = widths[stage];
    for (int b = 0; b < blocks; ++b) {
      const std::string prefix = "layer" + std::to_string(stage + 1) + "." + std::to_string(b) + ".";
      parameters.push_back({prefix + "conv1.weight", {c, in, 3, 3}});
      bn(prefix + "bn1.", c);
      parameters.push_back({prefix + "conv2.weight", {c, c, 3, 3}});
      bn(prefix + "bn2.", c);
      if (in != c) {
        parameters.push_back({prefix + "shortcut.0.weight", {c, in, 1, 1}});
        bn(prefix + "shortcut.1.", c);
      }
      in = c;
    }
  }
  parameters.push_back({"linear.weight", {10, in}});
  parameters.push_back({"linear.bias", {10}});
}
}  // namespace

TEST_CASE("models: ResNet<20> state_dict names and shapes in PyTorch order", "[nn][models][state_dict]") {
  nn::Network<models::ResNet<20>> net;
  std::vector<Entry> parameters, buffers;
  expected_resnet({16, 32, 64}, 3, parameters, buffers);
  REQUIRE(parameters.size() == 65);
  REQUIRE(buffers.size() == 63);
  check_entries(parameter_entries(net), parameters);
  check_entries(buffer_entries(net), buffers);
  CHECK(parameter_entries(net)[21].name == "layer2.0.conv1.weight");
  CHECK(parameter_entries(net)[27].name == "layer2.0.shortcut.0.weight");
}

TEST_CASE("models: ResNet18 state_dict names and shapes in PyTorch order", "[nn][models][state_dict]") {
  nn::Network<models::ResNet18> net;
  std::vector<Entry> parameters, buffers;
  expected_resnet({64, 128, 256, 512}, 2, parameters, buffers);
  REQUIRE(parameters.size() == 62);
  REQUIRE(buffers.size() == 60);
  check_entries(parameter_entries(net), parameters);
  check_entries(buffer_entries(net), buffers);
}

TEST_CASE("layers: Named, Repeat and nested Sequential name parameters as torch does", "[nn][state_dict]") {
  using Block = Sequential<nn::Named<"proj", nn::Linear<4>>, nn::ReLU>;
  nn::Network<Sequential<Input<3>, nn::Linear<4, false>, nn::Repeat<2, Block>, nn::Named<"head", Block>,
                         nn::Repeat<0, Block>, nn::Linear<2>>>
      net;
  check_entries(parameter_entries(net), {{"0.weight", {4, 3}},
                                         {"1.proj.weight", {4, 4}},
                                         {"1.proj.bias", {4}},
                                         {"2.proj.weight", {4, 4}},
                                         {"2.proj.bias", {4}},
                                         {"head.proj.weight", {4, 4}},
                                         {"head.proj.bias", {4}},
                                         {"4.weight", {2, 4}},
                                         {"4.bias", {2}}});
}

// ----------------------------------------------------------------------------------------------
// BatchNorm2d

TEST_CASE("BatchNorm2d: running statistics and num_batches_tracked follow PyTorch", "[nn][batch_norm]") {
  constexpr int kBatch = 4, kChannels = 2, kPlane = 6;
  nn::Network<Sequential<Input<kChannels, 2, 3>, nn::BatchNorm2d<>>> net;
  std::map<std::string, tensor::Tensor<float>*> stats;
  tensor::Tensor<std::int64_t>* tracked = nullptr;
  net.visit_buffers([&](const std::string& name, auto& t) {
    using U = typename std::remove_cvref_t<decltype(t)>::value_type;
    if constexpr (std::is_same_v<U, float>) stats[name] = &t;
    if constexpr (std::is_same_v<U, std::int64_t>) tracked = &t;
  });
  REQUIRE(stats.size() == 2);
  REQUIRE(tracked != nullptr);
  CHECK(tracked->data()[0] == 0);
  for (int c = 0; c < kChannels; ++c) {
    CHECK(stats["0.running_mean"]->data()[c] == 0.0f);
    CHECK(stats["0.running_var"]->data()[c] == 1.0f);
  }

  tensor::Tensor<float> x(tensor::Shape{kBatch, kChannels, 2, 3});
  nn_test::fill_uniform(x.span(), 5, -2.0, 3.0);
  // Batch statistics of channel c, in double: the mean and the unbiased variance.
  auto moments = [&](const tensor::Tensor<float>& input, int c) {
    double sum = 0, squares = 0;
    for (int b = 0; b < kBatch; ++b)
      for (int i = 0; i < kPlane; ++i) sum += input.data()[(b * kChannels + c) * kPlane + i];
    const double mean = sum / (kBatch * kPlane);
    for (int b = 0; b < kBatch; ++b)
      for (int i = 0; i < kPlane; ++i) {
        const double d = input.data()[(b * kChannels + c) * kPlane + i] - mean;
        squares += d * d;
      }
    return std::pair{mean, squares / (kBatch * kPlane - 1)};
  };

  const auto y = net.forward(x.view());
  CHECK(tracked->data()[0] == 1);
  std::vector<double> mean(kChannels), var(kChannels);
  for (int c = 0; c < kChannels; ++c) {
    const auto [m, v] = moments(x, c);
    mean[static_cast<std::size_t>(c)] = 0.1 * m;
    var[static_cast<std::size_t>(c)] = 0.9 + 0.1 * v;
    CHECK(stats["0.running_mean"]->data()[c] == Approx(mean[static_cast<std::size_t>(c)]).epsilon(1e-6));
    CHECK(stats["0.running_var"]->data()[c] == Approx(var[static_cast<std::size_t>(c)]).epsilon(1e-6));
    // The output is normalised with the biased batch variance.
    double out_sum = 0, out_squares = 0;
    for (int b = 0; b < kBatch; ++b)
      for (int i = 0; i < kPlane; ++i) {
        const double value = y.data()[(b * kChannels + c) * kPlane + i];
        out_sum += value;
        out_squares += value * value;
      }
    const double biased = v * (kBatch * kPlane - 1) / (kBatch * kPlane);
    CHECK(out_sum / (kBatch * kPlane) == Approx(0.0).margin(1e-6));
    CHECK(out_squares / (kBatch * kPlane) == Approx(biased / (biased + 1e-5)).epsilon(1e-5));
  }

  // A second step moves the statistics from where the first left them.
  tensor::Tensor<float> x2(x.shape());
  nn_test::fill_uniform(x2.span(), 6, -1.0, 1.0);
  net.forward(x2.view());
  CHECK(tracked->data()[0] == 2);
  for (int c = 0; c < kChannels; ++c) {
    const auto [m, v] = moments(x2, c);
    const auto k = static_cast<std::size_t>(c);
    mean[k] = 0.9 * mean[k] + 0.1 * m;
    var[k] = 0.9 * var[k] + 0.1 * v;
    CHECK(stats["0.running_mean"]->data()[c] == Approx(mean[k]).epsilon(1e-6));
    CHECK(stats["0.running_var"]->data()[c] == Approx(var[k]).epsilon(1e-6));
  }

  // Evaluation uses the running statistics and changes nothing.
  net.eval();
  const auto z = net.forward(x.view());
  CHECK(tracked->data()[0] == 2);
  for (int c = 0; c < kChannels; ++c) {
    const auto k = static_cast<std::size_t>(c);
    CHECK(stats["0.running_mean"]->data()[c] == Approx(mean[k]).epsilon(1e-6));
    for (int b = 0; b < kBatch; ++b)
      for (int i = 0; i < kPlane; ++i) {
        const int at = (b * kChannels + c) * kPlane + i;
        CHECK(z.data()[at] == Approx((x.data()[at] - mean[k]) / std::sqrt(var[k] + 1e-5)).epsilon(1e-5));
      }
  }
}

// The layer splits its channels into blocks of at most 512 KiB over the batch (here 3 channels of
// 61 x 24 x 24 floats: blocks of 3, 3 and 2 channels on 1, 2 and 3 threads, a block cut short at
// the end). Each channel is summed by one thread in sample order, so the bits do not depend on the
// threads; and every block gets its own statistics: a float64 reference of the formulas checks
// every channel, forward and backward, with the fused ReLU and with a residual addend.
TEST_CASE(
    "BatchNorm2d: the same bits on 1, 2 and 3 threads, and the float64 formulas, in channel blocks",
    "[nn][batch_norm]") {
  constexpr std::int64_t kBatch = 61, kChannels = 5, kSide = 24, kPlane = kSide * kSide;
  using Shape = Chw<kChannels, kSide, kSide>;
  const tensor::Shape shape{kBatch, kChannels, kSide, kSide};
  tensor::Tensor<float> x(shape), dy(shape), addend(shape);
  nn_test::fill_uniform(x.span(), 11, -1.0, 3.0);
  nn_test::fill_uniform(dy.span(), 12, -1.0, 1.0);
  nn_test::fill_uniform(addend.span(), 13, -0.5, 0.5);
  // Channel c of x is shifted and scaled differently, so that a channel read in place of another
  // changes every statistic.
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (std::int64_t c = 0; c < kChannels; ++c)
      for (std::int64_t i = 0; i < kPlane; ++i) {
        float& v = x.data()[(b * kChannels + c) * kPlane + i];
        v = v * static_cast<float>(c + 1) + static_cast<float>(10 * c);
      }

  struct Result {
    tensor::Tensor<float> y, dx;
    std::vector<float> weight_grad, bias_grad, running;
  };
  const auto run = [&]<bool FusedRelu, bool Add>(int threads) {
    nn::BatchNorm2dLayer<0.1, 1e-5, FusedRelu, Shape, float, Cpu> layer;
    nn::Rng rng(1);
    layer.initialize(rng);
    nn::Context<Cpu> ctx(threads);
    std::vector<nn::Parameter<float, Cpu>*> parameters;
    layer.visit_parameters([&](const std::string&, auto& p) { parameters.push_back(&p); }, "");
    for (std::int64_t c = 0; c < kChannels; ++c) {
      parameters[0]->value.data()[c] = 0.5f + 0.25f * static_cast<float>(c);  // gamma
      parameters[1]->value.data()[c] = 0.1f * static_cast<float>(c) - 0.2f;   // beta
    }
    Result r{tensor::Tensor<float>(shape), tensor::Tensor<float>(shape), {}, {}, {}};
    if constexpr (Add)
      layer.forward_add(x.view(), addend.data(), r.y.view(), ctx, std::true_type{});
    else
      layer.forward(x.view(), r.y.view(), ctx);
    layer.backward(x.view(), r.y.view(), dy.view(), r.dx.view(), ctx);
    r.weight_grad.assign(parameters[0]->grad.data(), parameters[0]->grad.data() + kChannels);
    r.bias_grad.assign(parameters[1]->grad.data(), parameters[1]->grad.data() + kChannels);
    layer.visit_buffers(
        [&](const std::string&, auto& t) {
          using U = typename std::remove_cvref_t<decltype(t)>::value_type;
          if constexpr (std::is_same_v<U, float>)
            r.running.insert(r.running.end(), t.data(), t.data() + t.numel());
        },
        "");
    return r;
  };
  const auto same_bits = [](const float* a, const float* b, std::int64_t n) {
    return std::equal(a, a + n, b,
                      [](float u, float v) { return std::memcmp(&u, &v, sizeof u) == 0; });
  };

  const auto check = [&]<bool FusedRelu, bool Add>() {
    INFO("fused ReLU " << FusedRelu << ", addend " << Add);
    const Result one = run.template operator()<FusedRelu, Add>(1);
    for (int threads : {2, 3}) {
      INFO(threads << " threads");
      const Result many = run.template operator()<FusedRelu, Add>(threads);
      CHECK(same_bits(one.y.data(), many.y.data(), one.y.numel()));
      CHECK(same_bits(one.dx.data(), many.dx.data(), one.dx.numel()));
      CHECK(same_bits(one.weight_grad.data(), many.weight_grad.data(), kChannels));
      CHECK(same_bits(one.bias_grad.data(), many.bias_grad.data(), kChannels));
      CHECK(same_bits(one.running.data(), many.running.data(), 2 * kChannels));
    }
    // The float64 formulas, channel by channel.
    const double count = static_cast<double>(kBatch * kPlane);
    for (std::int64_t c = 0; c < kChannels; ++c) {
      INFO("channel " << c);
      const auto at = [&](std::int64_t b, std::int64_t i) {
        return (b * kChannels + c) * kPlane + i;
      };
      double sum = 0, squares = 0;
      for (std::int64_t b = 0; b < kBatch; ++b)
        for (std::int64_t i = 0; i < kPlane; ++i) sum += x.data()[at(b, i)];
      const double mean = sum / count;
      for (std::int64_t b = 0; b < kBatch; ++b)
        for (std::int64_t i = 0; i < kPlane; ++i) squares += std::pow(x.data()[at(b, i)] - mean, 2);
      const double var = squares / count, inv_std = 1.0 / std::sqrt(var + 1e-5);
      const double gamma = 0.5 + 0.25 * static_cast<double>(c),
                   beta = 0.1 * static_cast<double>(c) - 0.2;
      CHECK(one.running[static_cast<std::size_t>(c)] == Approx(0.1 * mean).epsilon(1e-5));
      CHECK(one.running[static_cast<std::size_t>(kChannels + c)] ==
            Approx(0.9 + 0.1 * squares / (count - 1)).epsilon(1e-5));
      // The gradient reaching the normalisation: dy, where the output is positive with the fused
      // ReLU. (After a residual sum, the block applies the ReLU's backward before this layer's.)
      const auto upstream = [&](std::int64_t b, std::int64_t i) {
        return FusedRelu && one.y.data()[at(b, i)] <= 0.0f
                   ? 0.0
                   : static_cast<double>(dy.data()[at(b, i)]);
      };
      double sum_g = 0, sum_g_xhat = 0;
      for (std::int64_t b = 0; b < kBatch; ++b)
        for (std::int64_t i = 0; i < kPlane; ++i) {
          const double xhat = (x.data()[at(b, i)] - mean) * inv_std;
          double y = gamma * xhat + beta + (Add ? addend.data()[at(b, i)] : 0.0);
          if (FusedRelu || Add) y = std::max(0.0, y);
          REQUIRE(one.y.data()[at(b, i)] == Approx(y).margin(1e-5));
          sum_g += upstream(b, i);
          sum_g_xhat += upstream(b, i) * xhat;
        }
      CHECK(one.bias_grad[static_cast<std::size_t>(c)] == Approx(sum_g).epsilon(1e-4).margin(1e-3));
      CHECK(one.weight_grad[static_cast<std::size_t>(c)] ==
            Approx(sum_g_xhat).epsilon(1e-4).margin(1e-3));
      for (std::int64_t b = 0; b < kBatch; ++b)
        for (std::int64_t i = 0; i < kPlane; ++i) {
          const double xhat = (x.data()[at(b, i)] - mean) * inv_std;
          const double dx =
              gamma * inv_std * (upstream(b, i) - sum_g / count - xhat * sum_g_xhat / count);
          REQUIRE(one.dx.data()[at(b, i)] == Approx(dx).margin(1e-5));
        }
    }
  };
  check.template operator()<false, false>();
  check.template operator()<true, false>();
  check.template operator()<false, true>();
}

TEST_CASE("BatchNorm2d: momentum and eps are template parameters", "[nn][batch_norm]") {
  nn::Network<Sequential<Input<1, 1, 4>, nn::BatchNorm2d<0.5, 0.25>>> net;
  tensor::Tensor<float> x(tensor::Shape{2, 1, 1, 4});
  const float values[] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::copy(std::begin(values), std::end(values), x.data());
  const auto y = net.forward(x.view());
  // mean 4.5, biased variance 5.25, unbiased 6.
  std::vector<float> stats;
  net.visit_buffers([&](const std::string&, auto& t) {
    using U = typename std::remove_cvref_t<decltype(t)>::value_type;
    if constexpr (std::is_same_v<U, float>) stats.push_back(t.data()[0]);
  });
  REQUIRE(stats.size() == 2);
  CHECK(stats[0] == Approx(0.5 * 4.5));
  CHECK(stats[1] == Approx(0.5 * 1.0 + 0.5 * 6.0));
  CHECK(y.data()[0] == Approx((1 - 4.5) / std::sqrt(5.25 + 0.25)));
}

TEST_CASE("BatchNorm2d: training on one value per channel is an error", "[nn][batch_norm]") {
  nn::Network<Sequential<Input<2, 1, 1>, nn::BatchNorm2d<>>> net;
  tensor::Tensor<float> x(tensor::Shape{1, 2, 1, 1});
  CHECK_THROWS_AS(net.forward(x.view()), coltrain::InvalidArgument);
  net.eval();
  CHECK_NOTHROW(net.forward(x.view()));
}

// A fused layer and its separate twin, with the same parameters (filled in name order), give the
// same names, outputs and parameter gradients, bit for bit, in storage type T. With `relu`, a tenth
// of the outputs at least must be zeros, so that the ReLU is exercised.
template <class Fused, class Separate, class T = float>
void check_fusion(tensor::Shape input, tensor::Shape output, bool training, bool relu = true) {
  INFO((training ? "training" : "evaluation"));
  nn::Network<Fused, T> fused({.threads = 2});
  nn::Network<Separate, T> separate({.threads = 2});
  std::vector<std::string> fused_names, separate_names;
  fused.visit_parameters([&](const std::string& name, auto& p) {
    fused_names.push_back(name);
    nn_test::fill_uniform(p.value.span(), 3 + fused_names.size(), -1.0, 1.0);
  });
  separate.visit_parameters([&](const std::string& name, auto& p) {
    separate_names.push_back(name);
    nn_test::fill_uniform(p.value.span(), 3 + separate_names.size(), -1.0, 1.0);
  });
  CHECK(fused_names == separate_names);
  if (!training) {
    fused.eval();
    separate.eval();
  }
  tensor::Tensor<T> x(input), dy(output);
  nn_test::fill_uniform(x.span(), 1, -2.0, 2.0);
  nn_test::fill_uniform(dy.span(), 2, -1.0, 1.0);
  const auto y1 = fused.forward(x.view());
  const auto y2 = separate.forward(x.view());
  std::int64_t zeros = 0;
  for (std::int64_t i = 0; i < y1.numel(); ++i) {
    REQUIRE(nn_test::as_double(y1.data()[i]) == nn_test::as_double(y2.data()[i]));
    zeros += nn_test::as_double(y1.data()[i]) == 0.0;
  }
  if (relu) CHECK(zeros > y1.numel() / 10);
  fused.backward(dy.view());
  separate.backward(dy.view());
  std::vector<std::vector<double>> grads;
  fused.visit_parameters([&](const std::string&, auto& p) {
    grads.emplace_back();
    for (const auto& g : p.grad.span()) grads.back().push_back(nn_test::as_double(g));
  });
  std::size_t index = 0;
  separate.visit_parameters([&](const std::string& name, auto& p) {
    INFO(name);
    const std::vector<double>& g = grads[index++];
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == nn_test::as_double(p.grad.span()[i]));
  });
}

TEST_CASE("BatchNormReLU2d: equals BatchNorm2d then ReLU, bit for bit, with the same names",
          "[nn][batch_norm]") {
  using Fused = Sequential<Input<3, 5, 5>, nn::Named<"bn", nn::BatchNormReLU2d<>>>;
  using Separate = Sequential<Input<3, 5, 5>, nn::Named<"bn", nn::BatchNorm2d<>>, nn::ReLU>;
  for (const bool training : {true, false})
    check_fusion<Fused, Separate>(tensor::Shape{4, 3, 5, 5}, tensor::Shape{4, 3, 5, 5}, training);
}

TEST_CASE("Conv2dReLU: equals Conv2d then ReLU, bit for bit, with the same names", "[nn][conv2d]") {
  // A 1x1 convolution goes first, so that its weight gradient carries the fused layer's input
  // gradient too. 16x16 maps take the indirect product; 6x6 ones im2col, several images at a time.
  using nn::Named;
  check_fusion<
      Sequential<Input<3, 16, 16>, Named<"pre", nn::Conv2d<3, 1>>, Named<"conv", nn::Conv2dReLU<16, 3, 1, 1>>>,
      Sequential<Input<3, 16, 16>, Named<"pre", nn::Conv2d<3, 1>>, Named<"conv", nn::Conv2d<16, 3, 1, 1>>,
                 nn::ReLU>>(tensor::Shape{5, 3, 16, 16}, tensor::Shape{5, 16, 16, 16}, true);
  check_fusion<
      Sequential<Input<4, 6, 6>, Named<"pre", nn::Conv2d<4, 1>>, Named<"conv", nn::Conv2dReLU<8, 3, 1, 1, false>>>,
      Sequential<Input<4, 6, 6>, Named<"pre", nn::Conv2d<4, 1>>, Named<"conv", nn::Conv2d<8, 3, 1, 1, false>>,
                 nn::ReLU>>(tensor::Shape{11, 4, 6, 6}, tensor::Shape{11, 8, 6, 6}, true);
}

// A block whose body ends in BatchNorm2d adds the shortcut and applies the ReLU in the BatchNorm's
// output pass (nn/layer.hpp, forward_add); a Dropout<0> (the identity) after the BatchNorm turns
// that off, so the twin sums in a pass of its own. A layer before the block carries its input
// gradient into a weight gradient. 16-bit storage rounds the BatchNorm's output before the sum in
// both.
TEMPLATE_TEST_CASE("Residual: the sum in the BatchNorm's pass equals the sum after it, bit for bit",
                   "[nn][residual]", float, bfloat16, half, double) {
  using nn::Named;
  using Body = Sequential<Named<"conv1", nn::Conv2d<8, 3, 1, 1, false>>, Named<"bn1", nn::BatchNormReLU2d<>>,
                          Named<"conv2", nn::Conv2d<8, 3, 1, 1, false>>, Named<"bn2", nn::BatchNorm2d<>>>;
  using Twin = Sequential<Named<"conv1", nn::Conv2d<8, 3, 1, 1, false>>, Named<"bn1", nn::BatchNormReLU2d<>>,
                          Named<"conv2", nn::Conv2d<8, 3, 1, 1, false>>, Named<"bn2", nn::BatchNorm2d<>>,
                          nn::Dropout<0.0>>;
  using Projected = Sequential<Named<"conv1", nn::Conv2d<8, 3, 2, 1, false>>, Named<"bn2", nn::BatchNorm2d<>>>;
  using ProjectedTwin =
      Sequential<Named<"conv1", nn::Conv2d<8, 3, 2, 1, false>>, Named<"bn2", nn::BatchNorm2d<>>, nn::Dropout<0.0>>;
  const tensor::Shape in{9, 8, 12, 12}, halved{9, 8, 6, 6};
  for (const bool training : {true, false}) {
    check_fusion<Sequential<Input<8, 12, 12>, Named<"pre", nn::Conv2d<8, 1>>,
                            Named<"block", nn::Residual<Body, nn::IdentityShortcut, nn::ReLU>>>,
                 Sequential<Input<8, 12, 12>, Named<"pre", nn::Conv2d<8, 1>>,
                            Named<"block", nn::Residual<Twin, nn::IdentityShortcut, nn::ReLU>>>,
                 TestType>(in, in, training);
    check_fusion<Sequential<Input<8, 12, 12>, Named<"pre", nn::Conv2d<8, 1>>,
                            Named<"block", nn::Residual<Projected, nn::Projection<8, 2>, nn::ReLU>>>,
                 Sequential<Input<8, 12, 12>, Named<"pre", nn::Conv2d<8, 1>>,
                            Named<"block", nn::Residual<ProjectedTwin, nn::Projection<8, 2>, nn::ReLU>>>,
                 TestType>(in, halved, training);
    check_fusion<Sequential<Input<8, 12, 12>, Named<"pre", nn::Conv2d<8, 1>>, Named<"block", nn::Residual<Body>>>,
                 Sequential<Input<8, 12, 12>, Named<"pre", nn::Conv2d<8, 1>>, Named<"block", nn::Residual<Twin>>>,
                 TestType>(in, in, training, /*relu=*/false);
  }
}

// ----------------------------------------------------------------------------------------------
// Dropout

TEST_CASE("Dropout: drops a fraction p, scales the rest by 1/(1-p), identity in eval", "[nn][dropout]") {
  constexpr std::int64_t kBatch = 4, kSize = 50'000;
  nn::Network<Sequential<Input<kSize>, nn::Dropout<0.3>>> net({.threads = 2, .seed = 11});
  tensor::Tensor<float> x(tensor::Shape{kBatch, kSize});
  x.fill(1.0f);
  const auto y = net.forward(x.view());
  const float kept = static_cast<float>(1.0 / (1.0 - 0.3));
  std::int64_t dropped = 0, other = 0;
  for (float v : y.span()) {
    if (v == 0.0f)
      ++dropped;
    else if (v != kept)
      ++other;
  }
  CHECK(other == 0);
  // Binomial(200000, 0.3): standard deviation 0.001 of the fraction; allow 5 of them.
  const double fraction = static_cast<double>(dropped) / (kBatch * kSize);
  CHECK(fraction == Approx(0.3).margin(0.005));

  // Without training the layer is the identity, and draws nothing.
  net.eval();
  nn_test::fill_uniform(x.span(), 2, -1.0, 1.0);
  const auto z = net.forward(x.view());
  for (std::int64_t i = 0; i < x.numel(); ++i) REQUIRE(z.data()[i] == x.data()[i]);
}

TEST_CASE("Dropout: masks are a function of seed, step and layer", "[nn][dropout]") {
  using Model = Sequential<Input<2000>, nn::Dropout<0.5>, nn::Named<"second", nn::Dropout<0.5>>>;
  tensor::Tensor<float> x(tensor::Shape{3, 2000});
  x.fill(1.0f);
  auto zeros = [](tensor::TensorView<const float> v) {
    std::vector<bool> mask;
    for (float value : v.span()) mask.push_back(value == 0.0f);
    return mask;
  };
  auto differing = [](const std::vector<bool>& a, const std::vector<bool>& b) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
    return n;
  };
  nn::Network<Model> one({.threads = 1, .seed = 5});
  nn::Network<Model> two({.threads = 2, .seed = 5});
  nn::Network<Model> other_seed({.threads = 1, .seed = 6});
  const auto first = zeros(one.forward(x.view()));
  CHECK(one.context().step() == 1);
  // The same seed and step give the same mask on any number of threads.
  CHECK(zeros(two.forward(x.view())) == first);
  CHECK(differing(zeros(other_seed.forward(x.view())), first) > 1000);
  // A new step draws a new mask; going back to the step draws the old one again.
  const auto second = zeros(one.forward(x.view()));
  CHECK(differing(second, first) > 1000);
  one.context().set_step(0);
  CHECK(zeros(one.forward(x.view())) == first);

  // Two layers of one network draw different masks: with p = 0.5 each, about 3/4 are dropped.
  std::size_t dropped = 0;
  for (bool z : first) dropped += z;
  CHECK(static_cast<double>(dropped) / static_cast<double>(first.size()) == Approx(0.75).margin(0.03));
}

TEST_CASE("Dropout: the integer draw against uniform_threshold decides as hash_uniform >= p",
          "[nn][dropout]") {
  // The layer compares 53-bit draws with uniform_threshold(p) instead of converting each to double;
  // the masks must stay those of hash_uniform (the GPU layer and saved runs draw with it). Near the
  // threshold the two could differ by one draw, so check there as well as on random draws.
  for (const double p :
       {0.0, 0.1, 0.25, 0.3, 1.0 / 3.0, 0.5, 0.7, 0.999, 0x1.0p-53, 1.0 - 0x1.0p-53}) {
    const std::uint64_t threshold = nn::uniform_threshold(p);
    CAPTURE(p, threshold);
    REQUIRE(static_cast<double>(threshold) * 0x1.0p-53 >= p);
    if (threshold > 0) REQUIRE(static_cast<double>(threshold - 1) * 0x1.0p-53 < p);
    const std::uint64_t key = nn::hash_key(7, 3, 0x1234);
    std::int64_t kept = 0;
    for (std::uint64_t i = 0; i < 20'000; ++i) {
      const bool by_bits = nn::hash_bits(key, i) >= threshold;
      REQUIRE(by_bits == (nn::hash_uniform(7, 3, 0x1234, i) >= p));
      kept += by_bits;
    }
    CHECK(static_cast<double>(kept) / 20'000 == Approx(1.0 - p).margin(0.02));
  }
}

TEST_CASE("Dropout: p = 0 is the identity in training", "[nn][dropout]") {
  nn::Network<Sequential<Input<100>, nn::Dropout<0.0>>> net;
  tensor::Tensor<float> x(tensor::Shape{2, 100});
  nn_test::fill_uniform(x.span(), 4, -1.0, 1.0);
  const auto y = net.forward(x.view());
  for (std::int64_t i = 0; i < x.numel(); ++i) CHECK(y.data()[i] == x.data()[i]);
}

// ----------------------------------------------------------------------------------------------
// Initialisation

TEST_CASE("init: PyTorch's default bounds, kaiming uniform, deterministic per seed", "[nn][init]") {
  nn::Network<models::CifarNet> net({.seed = 3});
  std::map<std::string, std::int64_t> fan_in;
  net.visit_parameters([&](const std::string& name, nn::Parameter<float, Cpu>& p) {
    const auto& shape = p.value.shape();
    const std::string module = name.substr(0, name.rfind('.'));
    if (name.ends_with(".weight")) fan_in[module] = p.value.numel() / shape[0];
    REQUIRE(fan_in.count(module) == 1);
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in[module]));
    double sum = 0, squares = 0, largest = 0;
    for (float v : p.value.span()) {
      sum += v;
      squares += static_cast<double>(v) * v;
      largest = std::max(largest, std::abs(static_cast<double>(v)));
    }
    INFO(name << ": bound " << bound << ", largest " << largest);
    CHECK(largest <= bound);
    CHECK(largest >= 0.5 * bound);  // drawn from the whole range
    const double n = static_cast<double>(p.value.numel());
    if (n >= 1000) {
      // U(-b, b): mean 0, variance b^2 / 3; loose checks (many standard errors).
      CHECK(std::abs(sum / n) <= 0.05 * bound);
      CHECK(squares / n == Approx(bound * bound / 3).epsilon(0.1));
    }
  });
  CHECK(fan_in["conv1"] == 27);
  CHECK(fan_in["conv3"] == 576);
  CHECK(fan_in["fc1"] == 2048);

  // The same seed gives the same weights; another seed others.
  nn::Network<models::CifarNet> same({.seed = 3});
  nn::Network<models::CifarNet> other({.seed = 4});
  std::vector<float> a, b, c;
  net.visit_parameters([&](const std::string&, auto& p) { a.insert(a.end(), p.value.span().begin(), p.value.span().end()); });
  same.visit_parameters([&](const std::string&, auto& p) { b.insert(b.end(), p.value.span().begin(), p.value.span().end()); });
  other.visit_parameters([&](const std::string&, auto& p) { c.insert(c.end(), p.value.span().begin(), p.value.span().end()); });
  CHECK(a == b);
  CHECK(a != c);
  // Gradients start at zero.
  net.visit_parameters([&](const std::string& name, auto& p) {
    INFO(name);
    CHECK(std::all_of(p.grad.span().begin(), p.grad.span().end(), [](float g) { return g == 0.0f; }));
  });
}

TEST_CASE("init: BatchNorm starts at weight 1, bias 0, mean 0, variance 1", "[nn][init][batch_norm]") {
  nn::Network<models::ResNet<20>> net({.seed = 9});
  int batch_norms = 0;
  net.visit_parameters([&](const std::string& name, auto& p) {
    if (name.find("bn") == std::string::npos && name.find("shortcut.1") == std::string::npos) return;
    const float expected = name.ends_with("weight") ? 1.0f : 0.0f;
    batch_norms += name.ends_with("weight");
    for (float v : p.value.span()) REQUIRE(v == expected);
  });
  CHECK(batch_norms == 21);
  net.visit_buffers([&](const std::string& name, auto& t) {
    using U = typename std::remove_cvref_t<decltype(t)>::value_type;
    INFO(name);
    if constexpr (std::is_same_v<U, std::int64_t>) {
      CHECK(t.numel() == 1);
      CHECK(t.data()[0] == 0);
    } else {
      const float expected = name.ends_with("running_var") ? 1.0f : 0.0f;
      for (float v : t.span()) REQUIRE(v == expected);
    }
  });
}

// ----------------------------------------------------------------------------------------------
// Gradient accumulation

TEST_CASE("backward: gradients accumulate until zero_grad", "[nn][network]") {
  using Model = Sequential<Input<3, 8, 8>, nn::Conv2d<4, 3, 1, 1>, nn::BatchNorm2d<>, nn::ReLU,
                           nn::MaxPool2d<2>, models::BasicBlock<6, 2, true>, nn::Flatten, nn::Linear<5>>;
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    nn::Network<Model> net({.threads = threads, .seed = 1});
    tensor::Tensor<float> x(tensor::Shape{5, 3, 8, 8});
    nn_test::fill_uniform(x.span(), 7, -1.0, 1.0);
    tensor::Tensor<float> g(tensor::Shape{5, 5});
    nn_test::fill_uniform(g.span(), 8, -1.0, 1.0);
    net.forward(x.view());
    net.backward(g.view());
    std::vector<std::vector<float>> once;
    net.visit_parameters([&](const std::string&, auto& p) { once.emplace_back(p.grad.span().begin(), p.grad.span().end()); });
    net.backward(g.view());
    std::size_t k = 0;
    // The second backward computes the same increments, so the sum is exactly twice the first.
    net.visit_parameters([&](const std::string& name, auto& p) {
      INFO(name);
      const auto& first = once[k++];
      for (std::size_t i = 0; i < first.size(); ++i) REQUIRE(p.grad.data()[i] == 2.0f * first[i]);
    });
    net.zero_grad();
    net.visit_parameters([&](const std::string&, auto& p) {
      for (float v : p.grad.span()) REQUIRE(v == 0.0f);
    });
    net.backward(g.view());
    k = 0;
    net.visit_parameters([&](const std::string& name, auto& p) {
      INFO(name);
      const auto& first = once[k++];
      for (std::size_t i = 0; i < first.size(); ++i) REQUIRE(p.grad.data()[i] == first[i]);
    });
  }
}

TEST_CASE("Network: parameters live in one arena, last parameter first, each 64-byte aligned",
          "[nn][network][parameter_arena]") {
  using Model = Sequential<Input<3, 8, 8>, nn::Conv2d<4, 3, 1, 1>, nn::BatchNorm2d<>, nn::ReLU,
                           nn::Flatten, nn::Linear<5>>;
  nn::Network<Model> net({.seed = 1});
  auto& arena = net.parameter_arena();
  std::vector<const float*> starts;
  std::vector<const float*> values;
  std::vector<std::size_t> sizes;
  net.visit_parameters([&](const std::string&, auto& p) {
    starts.push_back(p.grad.data());
    values.push_back(p.value.data());
    sizes.push_back(p.grad.span().size());
  });
  REQUIRE(arena.parameters() == starts.size());
  // Reverse state_dict order, each start on a 64-byte boundary, nothing between but padding.
  std::size_t next = 0;
  for (std::size_t p = starts.size(); p-- > 0;) {
    INFO("parameter " << p);
    CHECK(starts[p] == arena.gradients() + next);
    CHECK(arena.offset(p) == next);
    CHECK(reinterpret_cast<std::uintptr_t>(starts[p]) % 64 == 0);
    CHECK(arena.size(p) == sizes[p]);
    CHECK(arena.extent(p) >= sizes[p]);
    CHECK(arena.extent(p) < sizes[p] + 16);
    next += arena.extent(p);
  }
  CHECK(arena.size() == next);

  // The range of consecutive parameters, as a bucket lists them; others are refused.
  const std::size_t last = starts.size() - 1;
  const std::vector<std::size_t> tail = {last, last - 1};
  CHECK(arena.range(tail) ==
        std::pair<std::size_t, std::size_t>{0, arena.extent(last) + arena.extent(last - 1)});
  CHECK_THROWS_AS(arena.range(std::vector<std::size_t>{last, last - 2}), coltrain::InvalidArgument);
  CHECK_THROWS_AS(arena.range(std::vector<std::size_t>{last - 1, last}), coltrain::InvalidArgument);

  // Initialised values were moved in: the padding is zero, the parameters are not all zero.
  std::size_t nonzero_values = 0;
  for (std::size_t p = 0; p < values.size(); ++p) {
    for (std::size_t i = 0; i < arena.size(p); ++i) nonzero_values += values[p][i] != 0.0f;
    for (std::size_t i = arena.size(p); i < arena.extent(p); ++i) REQUIRE(values[p][i] == 0.0f);
  }
  CHECK(nonzero_values > 0);

  // A backward pass writes gradients, never the padding; zero_grad clears all gradients.
  tensor::Tensor<float> x(tensor::Shape{2, 3, 8, 8});
  nn_test::fill_uniform(x.span(), 7, -1.0, 1.0);
  tensor::Tensor<float> g(tensor::Shape{2, 5});
  nn_test::fill_uniform(g.span(), 8, -1.0, 1.0);
  net.forward(x.view());
  net.backward(g.view());
  std::size_t nonzero = 0;
  for (std::size_t p = 0; p < starts.size(); ++p) {
    for (std::size_t i = 0; i < arena.size(p); ++i) nonzero += starts[p][i] != 0.0f;
    for (std::size_t i = arena.size(p); i < arena.extent(p); ++i) REQUIRE(starts[p][i] == 0.0f);
  }
  CHECK(nonzero > 0);
  net.zero_grad();
  for (std::size_t i = 0; i < arena.size(); ++i) REQUIRE(arena.gradients()[i] == 0.0f);
}

// ----------------------------------------------------------------------------------------------
// Errors

TEST_CASE("Network: a wrong input shape throws InvalidArgument naming both shapes", "[nn][network][errors]") {
  nn::Network<models::Mlp> net;
  tensor::Tensor<float> flat(tensor::Shape{2, 784});
  CHECK_THROWS_AS(net.forward(flat.view()), coltrain::InvalidArgument);
  CHECK_THROWS_WITH(net.forward(flat.view()),
                    Catch::Contains("[2, 784]") && Catch::Contains("[2, 1, 28, 28]"));
  tensor::Tensor<float> transposed(tensor::Shape{3, 28, 28, 1});
  CHECK_THROWS_WITH(net.forward(transposed.view()),
                    Catch::Contains("[3, 28, 28, 1]") && Catch::Contains("[3, 1, 28, 28]"));
  CHECK_THROWS_AS(net.forward(tensor::TensorView<const float>{}), coltrain::InvalidArgument);

  // The output gradient must match the last output.
  tensor::Tensor<float> images(tensor::Shape{2, 1, 28, 28});
  net.forward(images.view());
  tensor::Tensor<float> wrong(tensor::Shape{2, 9});
  CHECK_THROWS_WITH(net.backward(wrong.view()), Catch::Contains("[2, 9]") && Catch::Contains("[2, 10]"));
  tensor::Tensor<float> right(tensor::Shape{2, 10});
  CHECK_NOTHROW(net.backward(right.view()));
}

TEST_CASE("SoftmaxCrossEntropy: errors name the problem and the sample", "[nn][loss][errors]") {
  tensor::Tensor<float> logits(tensor::Shape{4, 10});
  tensor::Tensor<float> grad(tensor::Shape{4, 10});
  const nn::SoftmaxCrossEntropy loss;
  const std::vector<std::int32_t> out_of_range{1, 2, 10, 3};
  CHECK_THROWS_AS(loss.loss<float>(logits.view(), out_of_range), coltrain::InvalidArgument);
  CHECK_THROWS_WITH(loss.loss<float>(logits.view(), out_of_range),
                    Catch::Contains("label 10 of sample 2") && Catch::Contains("[0, 10)"));
  const std::vector<std::int32_t> negative{0, 0, 0, -1};
  CHECK_THROWS_WITH(loss.loss_and_grad<float>(logits.view(), negative, grad.view()),
                    Catch::Contains("label -1 of sample 3"));
  const std::vector<std::int32_t> too_few{1, 2, 3};
  CHECK_THROWS_WITH(loss.loss<float>(logits.view(), too_few),
                    Catch::Contains("3 labels") && Catch::Contains("batch of 4"));
  const std::vector<std::int32_t> labels{1, 2, 3, 4};
  tensor::Tensor<float> wrong_grad(tensor::Shape{4, 9});
  CHECK_THROWS_WITH(loss.loss_and_grad<float>(logits.view(), labels, wrong_grad.view()),
                    Catch::Contains("[4, 9]") && Catch::Contains("[4, 10]"));
  tensor::Tensor<float> cube(tensor::Shape{4, 2, 5});
  CHECK_THROWS_WITH(loss.loss<float>(cube.view(), labels), Catch::Contains("[4, 2, 5]"));
  CHECK_THROWS_AS(nn::SoftmaxCrossEntropy(-0.1), coltrain::InvalidArgument);
  CHECK_THROWS_AS(nn::SoftmaxCrossEntropy(1.5), coltrain::InvalidArgument);
  CHECK_THROWS_AS(nn::SoftmaxCrossEntropy(std::numeric_limits<double>::quiet_NaN()), coltrain::InvalidArgument);
}

TEST_CASE("SoftmaxCrossEntropy: values", "[nn][loss]") {
  // Equal logits: log(classes), with or without smoothing.
  tensor::Tensor<float> zeros(tensor::Shape{3, 10});
  const std::vector<std::int32_t> labels{0, 5, 9};
  CHECK(nn::SoftmaxCrossEntropy().loss<float>(zeros.view(), labels) == Approx(std::log(10.0)));
  CHECK(nn::SoftmaxCrossEntropy(0.3).loss<float>(zeros.view(), labels) == Approx(std::log(10.0)));
  // Large logits stay finite (log-sum-exp after subtracting the maximum).
  tensor::Tensor<float> large(tensor::Shape{1, 3});
  large.data()[0] = 1000.0f;
  large.data()[1] = 0.0f;
  large.data()[2] = -1000.0f;
  CHECK(nn::SoftmaxCrossEntropy().loss<float>(large.view(), std::vector<std::int32_t>{0}) == Approx(0.0).margin(1e-12));
  CHECK(nn::SoftmaxCrossEntropy().loss<float>(large.view(), std::vector<std::int32_t>{1}) == Approx(1000.0));
  // Smoothing e on 3 classes: -(1 - e + e/3) log p_label - e/3 sum_{others} log p_j.
  const double e = 0.3;
  const double log_p0 = 0.0, log_p1 = -1000.0, log_p2 = -2000.0;
  const double expected = -((1 - e + e / 3) * log_p0 + e / 3 * (log_p1 + log_p2));
  CHECK(nn::SoftmaxCrossEntropy(e).loss<float>(large.view(), std::vector<std::int32_t>{0}) ==
        Approx(expected).epsilon(1e-9));
  // An empty batch has loss 0.
  tensor::Tensor<float> empty(tensor::Shape{0, 10});
  CHECK(nn::SoftmaxCrossEntropy().loss<float>(empty.view(), std::vector<std::int32_t>{}) == 0.0);
}

TEST_CASE("topk_correct: counts labels among the k largest, ties to the lower index", "[nn][loss]") {
  tensor::Tensor<float> logits(tensor::Shape{5, 4});
  const float rows[5][4] = {
      {0.1f, 0.9f, 0.3f, 0.2f},  // ranking 1, 2, 3, 0
      {1.0f, 3.0f, 3.0f, 0.0f},  // tie between 1 and 2: 1 first
      {1.0f, 3.0f, 3.0f, 0.0f},
      {2.0f, 2.0f, 2.0f, 2.0f},  // all tied: 0, 1, 2, 3
      {0.5f, 0.4f, 0.3f, 0.2f},
  };
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 4; ++c) logits.data()[r * 4 + c] = rows[r][c];
  const std::vector<std::int32_t> labels{2, 1, 2, 3, 0};
  // top-1: sample 1 (label 1 wins the tie) and sample 4.
  CHECK(nn::topk_correct<float>(logits.view(), labels, 1) == 2);
  // top-2: adds sample 2 (label 2 second after the tie) and sample 0 (0.3 is second).
  CHECK(nn::topk_correct<float>(logits.view(), labels, 2) == 4);
  CHECK(nn::topk_correct<float>(logits.view(), labels, 3) == 4);
  CHECK(nn::topk_correct<float>(logits.view(), labels, 4) == 5);
  CHECK(nn::topk_correct<float>(logits.view(), labels, 0) == 0);
  // A label outside the classes is never correct; a label count mismatch is an error.
  const std::vector<std::int32_t> outside{7, -1, 1, 0, 0};
  CHECK(nn::topk_correct<float>(logits.view(), outside, 4) == 3);
  CHECK_THROWS_AS(nn::topk_correct<float>(logits.view(), std::vector<std::int32_t>{0, 1}, 1),
                  coltrain::InvalidArgument);
}

TEST_CASE("topk_correct: NaN ranks above every number, as in torch.topk", "[nn][loss]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  tensor::Tensor<float> logits(tensor::Shape{3, 3});
  const float rows[3][3] = {
      {0.5f, nan, 0.9f},  // label 1 is NaN: first
      {0.9f, nan, 0.1f},  // label 0 comes after the NaN: second
      {nan, 0.3f, nan},   // label 2 ties with the NaN at 0, which has the lower index: second
  };
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) logits.data()[r * 3 + c] = rows[r][c];
  const std::vector<std::int32_t> labels{1, 0, 2};
  CHECK(nn::topk_correct<float>(logits.view(), labels, 1) == 1);
  CHECK(nn::topk_correct<float>(logits.view(), labels, 2) == 3);
  CHECK(nn::ranks_above(nan, 1e30f));
  CHECK_FALSE(nn::ranks_above(1e30f, nan));
  CHECK_FALSE(nn::ranks_above(nan, nan));
  CHECK_FALSE(nn::ranks_above(2.0, 2.0));
}

TEST_CASE("models: a forward and backward of every model runs and is finite", "[nn][models]") {
  auto finite = [](tensor::TensorView<const float> v) {
    return std::all_of(v.span().begin(), v.span().end(), [](float x) { return std::isfinite(x); });
  };
  tensor::Tensor<float> mnist(tensor::Shape{2, 1, 28, 28});
  nn_test::fill_uniform(mnist.span(), 1, 0.0, 1.0);
  tensor::Tensor<float> cifar(tensor::Shape{2, 3, 32, 32});
  nn_test::fill_uniform(cifar.span(), 2, -1.0, 1.0);
  tensor::Tensor<float> grad(tensor::Shape{2, 10});
  grad.fill(0.1f);
  nn::Network<models::Mlp> mlp;
  CHECK(finite(mlp.forward(mnist.view())));
  mlp.backward(grad.view());
  nn::Network<models::MnistConvNet> mnist_net;
  CHECK(finite(mnist_net.forward(mnist.view())));
  mnist_net.backward(grad.view());
  nn::Network<models::CifarNet> cifar_net({.threads = 2});
  CHECK(finite(cifar_net.forward(cifar.view())));
  cifar_net.backward(grad.view());
  nn::Network<models::ResNet<20>> resnet({.threads = 2});
  const auto y = resnet.forward(cifar.view());
  CHECK(y.shape() == tensor::Shape{2, 10});
  CHECK(finite(y));
  resnet.backward(grad.view());
  resnet.eval();
  CHECK(finite(resnet.forward(cifar.view())));
}

TEST_CASE("MaxPool2d: a NaN in the window propagates, as in PyTorch", "[nn][pooling]") {
  nn::Network<Sequential<Input<1, 2, 2>, nn::MaxPool2d<2>>> net;
  tensor::Tensor<float> x(tensor::Shape{1, 1, 2, 2});
  x.data()[0] = 1.0f;
  x.data()[1] = std::numeric_limits<float>::quiet_NaN();
  x.data()[2] = 3.0f;
  CHECK(std::isnan(net.forward(x.view()).data()[0]));
}

// torch.relu(nan) is nan: a NaN activation must reach the loss, not vanish.
TEST_CASE("ReLU: NaN propagates as in torch.relu", "[nn][activation]") {
  nn::Network<Sequential<Input<3>, nn::ReLU>> net;
  tensor::Tensor<float> x(tensor::Shape{1, 3});
  x.data()[0] = std::numeric_limits<float>::quiet_NaN();
  x.data()[1] = -1.0f;
  x.data()[2] = std::numeric_limits<float>::infinity();
  const auto y = net.forward(x.view());
  CHECK(y.data()[1] == 0.0f);
  CHECK(y.data()[2] == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(y.data()[0]));
}

// MaxPool2d<2> runs on vector packs when the output rows split into them (16, 4, 2 and 1 outputs
// wide here; 3x8x7 in the parity test takes the one-lane form), and with even sides and packs of
// 4 lanes or more (32 x 32 and 4 x 8 here) its backward writes whole rows of the input gradient:
// ties and NaNs in every window position, odd leftover rows and columns, against the rule stated
// directly: a window holding a NaN yields its first NaN, else its first maximum, and the gradient
// goes to that position alone (a -0 gradient as +0, as PyTorch adds it onto zeros).
template <class Scalar, class Image>
void check_pairwise_max_pool() {
  using Layer = nn::bind_t<nn::MaxPool2d<2>, Image, Scalar, Cpu>;
  constexpr std::int64_t kC = Image::kDims[0], kH = Image::kDims[1], kW = Image::kDims[2];
  constexpr std::int64_t kOutH = kH / 2, kOutW = kW / 2, kBatch = 3;
  tensor::Tensor<Scalar> x(tensor::Shape{kBatch, kC, kH, kW});
  tensor::Tensor<Scalar> y(tensor::Shape{kBatch, kC, kOutH, kOutW}), dy(y.shape());
  tensor::Tensor<Scalar> dx(x.shape());
  std::mt19937 engine(11);
  std::uniform_int_distribution<int> value(-1, 2), nan_one_in(0, 19);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data()[i] = nan_one_in(engine) == 0 ? std::numeric_limits<Scalar>::quiet_NaN()
                                          : static_cast<Scalar>(value(engine));
  for (std::int64_t o = 0; o < dy.numel(); ++o)
    dy.data()[o] = o % 7 == 3 ? -Scalar(0) : static_cast<Scalar>(o + 1);
  Layer layer;
  nn::Context<Cpu> context{2};
  layer.forward(x.view(), y.view(), context);
  layer.backward(x.view(), y.view(), dy.view(), dx.view(), context);

  std::vector<Scalar> expected_dx(static_cast<std::size_t>(x.numel()), Scalar(0));
  int nan_windows = 0, tied_windows = 0;
  for (std::int64_t plane = 0; plane < kBatch * kC; ++plane)
    for (std::int64_t oh = 0; oh < kOutH; ++oh)
      for (std::int64_t ow = 0; ow < kOutW; ++ow) {
        std::vector<std::int64_t> window;
        for (std::int64_t r = 0; r < 2; ++r)
          for (std::int64_t c = 0; c < 2; ++c)
            window.push_back((plane * kH + 2 * oh + r) * kW + 2 * ow + c);
        const auto is_nan = [&](std::int64_t i) { return std::isnan(x.data()[i]); };
        const auto first_nan = std::find_if(window.begin(), window.end(), is_nan);
        std::int64_t chosen = window[0];
        if (first_nan != window.end()) {
          chosen = *first_nan;
          ++nan_windows;
        } else {
          for (std::int64_t i : window)
            if (x.data()[i] > x.data()[chosen]) chosen = i;
          tied_windows += std::count_if(window.begin(), window.end(), [&](std::int64_t i) {
                            return x.data()[i] == x.data()[chosen];
                          }) > 1;
        }
        const std::int64_t o = (plane * kOutH + oh) * kOutW + ow;
        INFO("plane " << plane << ", output (" << oh << ", " << ow << ")");
        if (std::isnan(x.data()[chosen]))
          CHECK(std::isnan(y.data()[o]));
        else
          CHECK(y.data()[o] == x.data()[chosen]);
        expected_dx[static_cast<std::size_t>(chosen)] = dy.data()[o] + Scalar(0);
      }
  CHECK(nan_windows > 0);
  CHECK(tied_windows > 0);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    INFO("input gradient at " << i);
    CHECK(dx.data()[i] == expected_dx[static_cast<std::size_t>(i)]);
    CHECK(std::signbit(dx.data()[i]) == std::signbit(expected_dx[static_cast<std::size_t>(i)]));
  }
}

TEST_CASE("MaxPool2d<2>: whole output rows at once keep the first maximum and the NaN rule",
          "[nn][pooling]") {
  check_pairwise_max_pool<float, Chw<3, 9, 33>>();
  check_pairwise_max_pool<float, Chw<2, 4, 8>>();
  check_pairwise_max_pool<float, Chw<2, 32, 32>>();
  check_pairwise_max_pool<float, Chw<2, 28, 28>>();
  check_pairwise_max_pool<float, Chw<2, 2, 2>>();
  check_pairwise_max_pool<double, Chw<3, 9, 33>>();
}
