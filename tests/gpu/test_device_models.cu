// Whole models on the GPU against the same models on the CPU in float64: built from the same seed
// they start from the same weights, so one forward and backward pass must give the same logits and
// the same gradient for every parameter (fp32 on the GPU; cuDNN and cuBLAS without TF32).
//
// The reference is the float64 model, not the CPU's float one: the float CPU path runs 3x3
// convolutions as Winograd F(4x4, 3x3), whose rounding (about 1e-6 relative per layer) is enough
// to flip ReLUs of a randomly initialised ResNet-20 at batch 4. A flip moves some gradients (small
// BatchNorm biases) by up to 2e-2: the float64 model's own gradients move that much when its input
// moves by 1e-5 (and by 5e-6 when it moves by 1e-6), so the comparison must stay below that.

#include <coltrain/cuda/nn.cuh>
#include <coltrain/models.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/tensor/device_copy.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace coltrain;

double relative_error(const float* got, const double* expected, std::int64_t n) {
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double(got[i]) - expected[i]) * (double(got[i]) - expected[i]);
    norm += double(expected[i]) * expected[i];
  }
  return std::sqrt(diff / (norm > 0 ? norm : 1));
}

template <class Spec>
void check_model_matches_cpu(int batch, double tolerance) {
  nn::Network<Spec, double, tensor::Cpu> cpu({.threads = 1, .seed = 7});
  nn::Network<Spec, float, tensor::Cuda> gpu({.seed = 7});
  using Net = decltype(gpu);

  tensor::Tensor<float> images(Net::Input::batch(batch));
  tensor::Tensor<double> images64(Net::Input::batch(batch));
  nn::Rng rng(11);
  for (std::int64_t i = 0; i < images.numel(); ++i)
    images64.data()[i] = images.data()[i] = static_cast<float>(rng.uniform());
  tensor::Tensor<float> grad(Net::Output::batch(batch));
  tensor::Tensor<double> grad64(Net::Output::batch(batch));
  for (std::int64_t i = 0; i < grad.numel(); ++i)
    grad64.data()[i] = grad.data()[i] = static_cast<float>(rng.uniform()) - 0.5f;

  const auto device_images = tensor::to_device(images);
  const auto device_grad = tensor::to_device(grad);
  auto cpu_logits = cpu.forward(images64.view());
  auto gpu_logits = tensor::to_host(gpu.forward(device_images.view()), gpu.context().stream());
  INFO("logits");
  CHECK(relative_error(gpu_logits.data(), cpu_logits.data(), cpu_logits.numel()) < tolerance);

  cpu.zero_grad();
  gpu.zero_grad();
  cpu.backward(grad64.view());
  gpu.backward(device_grad.view());
  gpu.context().synchronize();

  std::map<std::string, tensor::Tensor<double>> cpu_grads;
  cpu.visit_parameters([&](const std::string& name, nn::Parameter<double, tensor::Cpu>& p) {
    cpu_grads.emplace(name, p.grad);
  });
  std::size_t compared = 0;
  gpu.visit_parameters([&](const std::string& name, nn::Parameter<float, tensor::Cuda>& p) {
    const auto host = tensor::to_host(p.grad);
    const auto& expected = cpu_grads.at(name);
    INFO("gradient of " << name);
    CHECK(relative_error(host.data(), expected.data(), expected.numel()) < tolerance);
    ++compared;
  });
  CHECK(compared == cpu_grads.size());
}

}  // namespace

TEST_CASE("MnistConvNet on the GPU in fp32 matches the CPU in float64") {
  check_model_matches_cpu<models::MnistConvNet>(5, 1e-4);
}

TEST_CASE("ResNet-20 on the GPU in fp32 matches the CPU in float64") {
  check_model_matches_cpu<models::ResNet<20>>(4, 1e-4);
}
