// Winograd convolution (coltrain/nn/winograd_convolution.hpp) against the same layer in float64:
// forward, input gradient and weight gradient, at ResNet-20's three stages and an F(2x2) shape.
// Built twice (tests/nn/CMakeLists.txt): portably, and for this machine's instruction set, where
// the transforms join several rows of tiles into one wide pack (rows_per_pack).

#include <catch2/catch.hpp>

#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

namespace nn = coltrain::nn;
namespace tensor = coltrain::tensor;
using tensor::Chw;
using tensor::Cpu;

// Winograd's rounding, measured where it matters: the GPU layer tests
// (tests/gpu/layer_pair_checks.hpp) hold cuDNN's fp32 products to 1e-5 (relative L2) of this CPU
// layer's, so the CPU's own error must stay well inside that. Each product in float against the
// same layer in float64, at ResNet-20's three stages (F(4x4, 3x3)), a 4 x 4 map and an F(2x2, 3x3)
// shape.
template <std::size_t InChannels, std::size_t OutChannels, std::int64_t Size>
void check_winograd_rounding(int expected_tile) {
  using In = Chw<InChannels, Size, Size>;
  using Spec = nn::Conv2d<OutChannels, 3, 1, 1, false>;
  nn::bind_t<Spec, In, float, Cpu> single;
  nn::bind_t<Spec, In, double, Cpu> reference;
  REQUIRE(single.kWinogradOutputTile == expected_tile);
  nn::Rng rng(11);
  single.initialize(rng);
  std::vector<nn::Parameter<float, Cpu>*> single_parameters;
  std::vector<nn::Parameter<double, Cpu>*> reference_parameters;
  single.visit_parameters(
      [&](const std::string&, nn::Parameter<float, Cpu>& p) { single_parameters.push_back(&p); },
      "");
  reference.visit_parameters(
      [&](const std::string&, nn::Parameter<double, Cpu>& p) {
        reference_parameters.push_back(&p);
      },
      "");
  REQUIRE(single_parameters.size() == 1);
  REQUIRE(reference_parameters.size() == 1);
  const tensor::Tensor<float>& w = single_parameters[0]->value;
  std::copy_n(w.data(), w.numel(), reference_parameters[0]->value.data());
  single_parameters[0]->grad.fill(0.0f);
  reference_parameters[0]->grad.fill(0.0);

  // 6 and 5 images on the two threads: runs of 4 joined images and single ones (8 x 8 maps and
  // smaller join whole images into one vector).
  constexpr std::int64_t kBatch = 11;
  const tensor::Shape in_shape{kBatch, static_cast<std::int64_t>(InChannels), Size, Size};
  const tensor::Shape out_shape{kBatch, static_cast<std::int64_t>(OutChannels), Size, Size};
  tensor::Tensor<float> x(in_shape), dx(in_shape), dy(out_shape), y(out_shape);
  tensor::Tensor<double> x64(in_shape), dx64(in_shape), dy64(out_shape), y64(out_shape);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::mt19937 engine(5);
  for (std::int64_t i = 0; i < x.numel(); ++i) x64.data()[i] = x.data()[i] = uniform(engine);
  for (std::int64_t i = 0; i < dy.numel(); ++i) dy64.data()[i] = dy.data()[i] = uniform(engine);
  nn::Context<Cpu> context{2}, context64{2};
  single.forward(x.view(), y.view(), context);
  reference.forward(x64.view(), y64.view(), context64);
  single.backward(x.view(), y.view(), dy.view(), dx.view(), context);
  reference.backward(x64.view(), y64.view(), dy64.view(), dx64.view(), context64);

  const auto relative_l2 = [](const float* got, const double* expected, std::int64_t n) {
    double difference = 0, norm = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      difference += (got[i] - expected[i]) * (got[i] - expected[i]);
      norm += expected[i] * expected[i];
    }
    return std::sqrt(difference / norm);
  };
  const tensor::Tensor<float>& dw = single_parameters[0]->grad;
  const double y_error = relative_l2(y.data(), y64.data(), y.numel());
  const double dx_error = relative_l2(dx.data(), dx64.data(), dx.numel());
  const double dw_error = relative_l2(dw.data(), reference_parameters[0]->grad.data(), dw.numel());
  INFO(InChannels << " to " << OutChannels << " channels on " << Size << "x" << Size << ": output "
                  << y_error << ", input gradient " << dx_error << ", weight gradient "
                  << dw_error);
  CHECK(y_error < 3e-6);
  CHECK(dx_error < 3e-6);
  CHECK(dw_error < 3e-6);
  // The float64 layer is itself exact to far below that: the comparison measures the float one.
  CHECK(y_error > 0);
}

TEST_CASE("Conv2d: Winograd's float rounding stays within 3e-6 (relative L2) of float64",
          "[nn][conv2d]") {
  check_winograd_rounding<16, 16, 32>(4);
  check_winograd_rounding<32, 32, 16>(4);
  check_winograd_rounding<64, 64, 8>(4);
  check_winograd_rounding<32, 32, 4>(4);  // one tile an image
  check_winograd_rounding<16, 16, 6>(2);
  // Unequal sides: backward's input-gradient products share buffers sized for the larger.
  check_winograd_rounding<16, 32, 16>(4);
  check_winograd_rounding<48, 16, 8>(4);
}

}  // namespace
