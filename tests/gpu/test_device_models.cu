// Whole models on the GPU against the same models on the CPU: built from the same seed they start
// from the same weights, so one forward and backward pass must give the same logits and the same
// gradient for every parameter (fp32; cuDNN and cuBLAS without TF32).

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

double relative_error(const float* got, const float* expected, std::int64_t n) {
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
  nn::Network<Spec, float, tensor::Cpu> cpu({.threads = 1, .seed = 7});
  nn::Network<Spec, float, tensor::Cuda> gpu({.seed = 7});
  using Net = decltype(cpu);

  tensor::Tensor<float> images(Net::Input::batch(batch));
  nn::Rng rng(11);
  for (float& v : images.span()) v = static_cast<float>(rng.uniform());
  tensor::Tensor<float> grad(Net::Output::batch(batch));
  for (float& v : grad.span()) v = static_cast<float>(rng.uniform()) - 0.5f;

  const auto device_images = tensor::to_device(images);
  const auto device_grad = tensor::to_device(grad);
  auto cpu_logits = cpu.forward(images.view());
  auto gpu_logits = tensor::to_host(gpu.forward(device_images.view()), gpu.context().stream());
  INFO("logits");
  CHECK(relative_error(gpu_logits.data(), cpu_logits.data(), cpu_logits.numel()) < tolerance);

  cpu.zero_grad();
  gpu.zero_grad();
  cpu.backward(grad.view());
  gpu.backward(device_grad.view());
  gpu.context().synchronize();

  std::map<std::string, tensor::Tensor<float>> cpu_grads;
  cpu.visit_parameters([&](const std::string& name, nn::Parameter<float, tensor::Cpu>& p) {
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

TEST_CASE("MnistConvNet on the GPU matches the CPU in fp32") {
  check_model_matches_cpu<models::MnistConvNet>(5, 1e-4);
}

TEST_CASE("ResNet-20 on the GPU matches the CPU in fp32") {
  check_model_matches_cpu<models::ResNet<20>>(4, 1e-4);
}
