// Mixed-precision storage, thread counts and batch sizes: a network's results do not depend on how
// they are computed beyond rounding.
//
// Tolerances (e = the float result, a = the other):
//   - fp16 / bf16 storage against a float network holding the same (16-bit) weights, on the same
//     rounded input, both with 2 threads: per tensor max|a - e| <= tol * max|e| for outputs and
//     BatchNorm statistics (half 3e-3, bfloat16 2e-2), and, in a model without ReLU and max pooling,
//     for every parameter gradient (half 2e-2, bfloat16 0.12) with ||a - e||_2 <= tol * ||e||_2 over
//     all gradients (half 3e-3, bfloat16 2.5e-2); in the model with every layer type only that l2
//     bound, loosened to 0.1 / 0.3, as ReLU and max-pool decisions flip under rounding;
//   - 1 thread against 2 threads in float: per tensor max|a - e| <= 1e-5 * max|e| (measured 1e-6);
//   - a smaller batch after a larger one: bit for bit a fresh network's results.
// Set NN_PRECISION_REPORT=1 to print the measured errors.

#include <catch2/catch.hpp>

#include <coltrain/core/dtype.hpp>
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
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace nn = coltrain::nn;
namespace tensor = coltrain::tensor;
namespace models = coltrain::models;
using coltrain::bfloat16;
using coltrain::half;
using nn::Input;
using nn::Sequential;

// max |a - e| / max |e| over two tensors of any element types.
template <class A, class E>
double relative_to_largest(std::span<const A> actual, std::span<const E> expected) {
  REQUIRE(actual.size() == expected.size());
  double largest = 0.0, worst = 0.0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    largest = std::max(largest, std::abs(nn_test::as_double(expected[i])));
    worst = std::max(worst, std::abs(nn_test::as_double(actual[i]) - nn_test::as_double(expected[i])));
  }
  return largest == 0.0 ? worst : worst / largest;
}

template <class T, class U>
tensor::Tensor<T> converted(const tensor::Tensor<U>& from) {
  tensor::Tensor<T> to(from.shape());
  for (std::int64_t i = 0; i < from.numel(); ++i) to.data()[i] = nn_test::convert<T>(from.data()[i]);
  return to;
}

}  // namespace

namespace {

// Every layer type, with sizes past the layers' parallel thresholds at batch 37.
using MixedModel =
    Sequential<Input<3, 16, 16>, nn::Conv2d<8, 3, 1, 1, false>, nn::BatchNorm2d<>, nn::ReLU,
               models::BasicBlock<8, 1, false>, models::BasicBlock<12, 2, true>, nn::MaxPool2d<3, 2, 1>,
               nn::Dropout<0.2>, nn::AvgPool2d<2, 1, 1>, nn::Conv2d<16, 1>, nn::GlobalAvgPool,
               nn::Linear<32>, nn::ReLU, nn::Linear<10>>;

// The same without ReLU and max pooling, whose decisions (a unit on or off, which element is the
// maximum) can flip when values are rounded to 16 bits: each flip moves a whole sample's share of a
// gradient, so only this model's gradients are held to rounding-level tolerances.
using SmoothModel =
    Sequential<Input<3, 16, 16>, nn::Conv2d<8, 3, 1, 1, false>, nn::BatchNorm2d<>, nn::Conv2d<12, 3, 2, 1>,
               nn::AvgPool2d<3, 2, 1>, nn::Dropout<0.2>,
               nn::Residual<Sequential<nn::Conv2d<12, 3, 1, 1, false>, nn::BatchNorm2d<>>>,
               nn::Residual<Sequential<nn::Conv2d<16, 3, 2, 1, false>, nn::BatchNorm2d<>>, nn::Projection<16, 2>>,
               nn::Conv2d<16, 1>, nn::Flatten, nn::Linear<32>, nn::Linear<10>>;

struct RunResult {
  std::vector<double> output;
  std::vector<std::vector<double>> grads;
  std::vector<std::vector<double>> buffers;
  double loss = 0;
};

// One training step's forward and backward of `net` on `input` (converted to T).
template <class Model, class T>
RunResult run_step(nn::Network<Model, T>& net, const tensor::Tensor<float>& input,
                   const std::vector<std::int32_t>& labels) {
  const tensor::Tensor<T> x = converted<T>(input);
  const auto y = net.forward(x.view());
  RunResult result;
  for (const T& v : y.span()) result.output.push_back(nn_test::as_double(v));
  tensor::Tensor<T> grad(y.shape());
  result.loss = nn::SoftmaxCrossEntropy().loss_and_grad<T>(y, labels, grad.view());
  net.zero_grad();
  net.backward(grad.view());
  net.visit_parameters([&](const std::string&, auto& p) {
    auto& g = result.grads.emplace_back();
    for (const auto& v : p.grad.span()) g.push_back(nn_test::as_double(v));
  });
  net.visit_buffers([&](const std::string&, auto& t) {
    auto& b = result.buffers.emplace_back();
    for (const auto& v : t.span()) b.push_back(nn_test::as_double(v));
  });
  return result;
}

// The worst per-tensor max|a - e| / max|e|.
double worst_of(const std::vector<std::vector<double>>& actual, const std::vector<std::vector<double>>& expected) {
  REQUIRE(actual.size() == expected.size());
  double worst = 0;
  for (std::size_t k = 0; k < actual.size(); ++k)
    worst = std::max(worst, relative_to_largest<double, double>(actual[k], expected[k]));
  return worst;
}

// ||a - e||_2 / ||e||_2 over all tensors together.
double l2_of(const std::vector<std::vector<double>>& actual, const std::vector<std::vector<double>>& expected) {
  REQUIRE(actual.size() == expected.size());
  double difference = 0, norm = 0;
  for (std::size_t k = 0; k < actual.size(); ++k) {
    REQUIRE(actual[k].size() == expected[k].size());
    for (std::size_t i = 0; i < actual[k].size(); ++i) {
      difference += (actual[k][i] - expected[k][i]) * (actual[k][i] - expected[k][i]);
      norm += expected[k][i] * expected[k][i];
    }
  }
  return std::sqrt(difference / norm);
}

struct PrecisionReport {
  double output = 0, grads = 0, grads_l2 = 0, buffers = 0, loss = 0;
};

// A 16-bit network against a float network holding its (rounded) weights, on the rounded input.
template <class Model, class T>
PrecisionReport compare_with_float() {
  constexpr int kBatch = 37;
  tensor::Tensor<float> input(tensor::Shape{kBatch, 3, 16, 16});
  nn_test::fill_uniform(input.span(), 31, -1.0, 1.0);
  std::vector<std::int32_t> labels(kBatch);
  for (int i = 0; i < kBatch; ++i) labels[static_cast<std::size_t>(i)] = (i * 7) % 10;
  nn::Network<Model, T> low({.threads = 2, .seed = 2});
  nn::Network<Model, float> reference({.threads = 2, .seed = 2});  // same seed: same dropout masks
  nn_test::copy_state(low, reference);
  const RunResult a = run_step(low, input, labels);
  const RunResult e = run_step(reference, converted<float>(converted<T>(input)), labels);
  PrecisionReport report;
  report.output = relative_to_largest<double, double>(a.output, e.output);
  report.grads = worst_of(a.grads, e.grads);
  report.grads_l2 = l2_of(a.grads, e.grads);
  report.buffers = worst_of(a.buffers, e.buffers);
  report.loss = std::abs(a.loss - e.loss) / e.loss;
  if (std::getenv("NN_PRECISION_REPORT"))
    std::printf("[precision] %s: output %.3e, gradients %.3e (l2 %.3e), buffers %.3e, loss %.3e\n",
                std::is_same_v<T, half> ? "half" : "bfloat16", report.output, report.grads,
                report.grads_l2, report.buffers, report.loss);
  INFO((std::is_same_v<T, half> ? "half" : "bfloat16")
       << ": output " << report.output << ", gradients " << report.grads << " (l2 " << report.grads_l2
       << "), buffers " << report.buffers << ", loss " << report.loss);
  // The 16-bit storage really is 16-bit: results differ from float's.
  CHECK(report.output > 0.0);
  return report;
}

}  // namespace

TEST_CASE("mixed precision: half and bfloat16 storage track float, every layer type", "[nn][precision]") {
  // Outputs and BatchNorm statistics are held to rounding level; gradients only loosely, since
  // ReLU and max-pool decisions flip under rounding (see SmoothModel). Measured: half output 8e-4,
  // statistics 4e-4, gradients l2 2.5e-2; bfloat16 output 4.6e-3, statistics 2e-3, gradients l2 7.9e-2.
  const PrecisionReport f16 = compare_with_float<MixedModel, half>();
  CHECK(f16.output <= 3e-3);
  CHECK(f16.buffers <= 2e-3);
  CHECK(f16.loss <= 1e-4);
  CHECK(f16.grads_l2 <= 0.1);
  const PrecisionReport b16 = compare_with_float<MixedModel, bfloat16>();
  CHECK(b16.output <= 2e-2);
  CHECK(b16.buffers <= 1e-2);
  CHECK(b16.loss <= 1e-3);
  CHECK(b16.grads_l2 <= 0.3);
}

TEST_CASE("mixed precision: half and bfloat16 gradients track float without ReLU and max pooling",
          "[nn][precision]") {
  // Measured: half output 7.6e-4, worst gradient tensor 5.8e-3, gradients l2 8.7e-4; bfloat16
  // output 4.7e-3, worst gradient tensor 3.9e-2 (a BatchNorm bias whose gradient is small next to
  // the terms it sums), gradients l2 6.7e-3.
  const PrecisionReport f16 = compare_with_float<SmoothModel, half>();
  CHECK(f16.output <= 3e-3);
  CHECK(f16.grads <= 2e-2);
  CHECK(f16.grads_l2 <= 3e-3);
  CHECK(f16.buffers <= 2e-3);
  CHECK(f16.loss <= 1e-4);
  const PrecisionReport b16 = compare_with_float<SmoothModel, bfloat16>();
  CHECK(b16.output <= 2e-2);
  CHECK(b16.grads <= 0.12);
  CHECK(b16.grads_l2 <= 2.5e-2);
  CHECK(b16.buffers <= 1.2e-2);
  CHECK(b16.loss <= 1e-3);
}

TEST_CASE("threads: 1 and 2 threads give the same results in float", "[nn][threads]") {
  constexpr int kBatch = 37;
  tensor::Tensor<float> input(tensor::Shape{kBatch, 3, 16, 16});
  nn_test::fill_uniform(input.span(), 32, -1.0, 1.0);
  std::vector<std::int32_t> labels(kBatch);
  for (int i = 0; i < kBatch; ++i) labels[static_cast<std::size_t>(i)] = (i * 3) % 10;
  nn::Network<MixedModel, float> one({.threads = 1, .seed = 4});
  nn::Network<MixedModel, float> two({.threads = 2, .seed = 4});
  double worst = 0;
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    const RunResult a = run_step(one, input, labels);
    const RunResult b = run_step(two, input, labels);
    const double out = relative_to_largest<double, double>(b.output, a.output);
    const double grads = worst_of(b.grads, a.grads);
    const double buffers = worst_of(b.buffers, a.buffers);
    INFO("output " << out << ", gradients " << grads << ", buffers " << buffers);
    CHECK(out <= 1e-5);
    CHECK(grads <= 1e-5);
    CHECK(buffers <= 1e-5);
    CHECK(a.loss == Approx(b.loss).epsilon(1e-6));
    worst = std::max({worst, out, grads, buffers});
  }
  if (std::getenv("NN_PRECISION_REPORT")) std::printf("[threads] 1 vs 2 threads: worst %.3e\n", worst);
}

TEST_CASE("Network: a smaller batch after a larger one gives a fresh network's results", "[nn][network]") {
  // Tensor::resize keeps (and does not clear) storage that is large enough, so a layer that relied on
  // zeroed scratch memory would differ here.
  using Model = MixedModel;
  nn::Network<Model> used({.threads = 2, .seed = 8});
  nn::Network<Model> fresh({.threads = 2, .seed = 8});
  tensor::Tensor<float> big(tensor::Shape{9, 3, 16, 16});
  nn_test::fill_uniform(big.span(), 41, -1.0, 1.0);
  tensor::Tensor<float> small(tensor::Shape{5, 3, 16, 16});
  nn_test::fill_uniform(small.span(), 42, -1.0, 1.0);
  const std::vector<std::int32_t> big_labels{0, 1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<std::int32_t> small_labels{9, 8, 7, 6, 5};
  run_step(used, big, big_labels);
  // Same step counter (dropout masks) and statistics: bring `fresh` to `used`'s state.
  nn_test::copy_state(used, fresh);
  fresh.context().set_step(used.context().step());
  const RunResult a = run_step(used, small, small_labels);
  const RunResult b = run_step(fresh, small, small_labels);
  CHECK(a.output == b.output);
  CHECK(a.grads == b.grads);
  CHECK(a.buffers == b.buffers);
}
