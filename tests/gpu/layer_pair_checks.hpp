// Checks of a GPU layer against the CPU layer bound from the same spec, shared by the GPU layer
// tests (test_device_conv2d.cu, test_device_linear.cu). Compiled by nvcc only.
//
// LayerPair builds both from the same seed and checks that the GPU layer's initialize() drew the
// CPU layer's numbers rounded to T, then gives the CPU layer the rounded values, so that the
// comparison sees only the products' rounding. check_batch() runs one forward and two backward
// passes (the first without an input gradient) on random inputs rounded to T, with the GPU outputs
// poisoned (NaN) before each call, and compares the output, the input gradient and the parameter
// gradients after one pass and after two (doubled: backward adds to them) with the CPU layer's, in
// relative error: 1e-5 for fp32, 1e-2 for fp16 and bf16 (the CPU reference computes in fp32).
// check_graph_capture() replays forward and backward as a CUDA graph after a first eager call.

#pragma once

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/device_copy.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace layer_checks {

using coltrain::tensor::Cpu;
using coltrain::tensor::Cuda;
namespace nn = coltrain::nn;
namespace tensor = coltrain::tensor;

inline constexpr std::uint64_t kSeed = 20240607;

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

template <class T>
std::string type_name() {
  return std::string(coltrain::name_of(coltrain::data_type_v<T>));
}

// ||got - expected|| / ||expected||; infinity when anything is not finite or the sizes differ.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& expected) {
  if (got.size() != expected.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(got[i]) - expected[i];
    diff += d * d;
    norm += static_cast<double>(expected[i]) * expected[i];
  }
  return std::sqrt(diff / (norm > 0 ? norm : 1));
}

inline std::vector<float> scaled(const std::vector<float>& values, float factor) {
  std::vector<float> out(values);
  for (float& v : out) v *= factor;
  return out;
}

inline std::vector<float> values(const tensor::Tensor<float>& host) {
  return {host.data(), host.data() + host.numel()};
}

// Uniform in (-1, 1), rounded to T so that both layers see the same numbers.
template <class T>
tensor::Tensor<float> random_input(tensor::Shape shape, nn::Rng& rng) {
  tensor::Tensor<float> t(shape);
  for (float& v : t.span()) v = static_cast<float>(T(static_cast<float>(rng.uniform(-1, 1))));
  return t;
}

template <class T>
tensor::Tensor<T, Cuda> upload(const tensor::Tensor<float>& host) {
  tensor::Tensor<T> converted(host.shape());
  for (std::int64_t i = 0; i < host.numel(); ++i) converted.data()[i] = T(host.data()[i]);
  return tensor::to_device(converted);
}

template <class T>
std::vector<float> download(tensor::TensorView<const T, Cuda> device, cudaStream_t stream) {
  const tensor::Tensor<T> host = tensor::to_host<T>(device, stream);
  std::vector<float> out(static_cast<std::size_t>(host.numel()));
  for (std::int64_t i = 0; i < host.numel(); ++i)
    out[static_cast<std::size_t>(i)] = static_cast<float>(host.data()[i]);
  return out;
}

// All bytes 0xFF: a NaN in float, half and bfloat16.
template <class T>
void poison(tensor::TensorView<T, Cuda> v, cudaStream_t stream) {
  COLTRAIN_CHECK_CUDA(cudaMemsetAsync(v.data(), 0xFF, v.numel() * sizeof(T), stream));
}

template <class T, class D, class Layer>
std::vector<std::pair<std::string, nn::Parameter<T, D>*>> parameters_of(Layer& layer) {
  std::vector<std::pair<std::string, nn::Parameter<T, D>*>> out;
  layer.visit_parameters(
      [&](const std::string& name, nn::Parameter<T, D>& p) { out.emplace_back(name, &p); }, "");
  return out;
}

template <class T, class Layer>
void zero_device_gradients(Layer& layer, cudaStream_t stream) {
  for (auto& [name, p] : parameters_of<T, Cuda>(layer))
    COLTRAIN_CHECK_CUDA(cudaMemsetAsync(p->grad.data(), 0, p->grad.numel() * sizeof(T), stream));
}

template <class T, class Layer>
std::vector<std::vector<float>> device_gradients(Layer& layer, cudaStream_t stream) {
  std::vector<std::vector<float>> out;
  for (auto& [name, p] : parameters_of<T, Cuda>(layer))
    out.push_back(download<T>(p->grad.view(), stream));
  return out;
}

// A CPU layer (fp32) and a GPU layer (T) bound from Spec, with the same weights.
template <class Spec, class In, class T>
struct LayerPair {
  using CpuLayer = nn::bind_t<Spec, In, float, Cpu>;
  using GpuLayer = nn::bind_t<Spec, In, T, Cuda>;
  static_assert(std::is_same_v<typename CpuLayer::Output, typename GpuLayer::Output>);
  static_assert(CpuLayer::kParameterCount == GpuLayer::kParameterCount);
  static_assert(nn::forward_macs<CpuLayer>() == nn::forward_macs<GpuLayer>());

  CpuLayer cpu;
  GpuLayer gpu;
  nn::Context<Cpu> cpu_ctx{1};
  nn::Context<Cuda> ctx;

  LayerPair() {
    nn::Rng cpu_rng(kSeed), gpu_rng(kSeed);
    cpu.initialize(cpu_rng);
    gpu.initialize(gpu_rng);
    auto cpu_params = parameters_of<float, Cpu>(cpu);
    auto gpu_params = parameters_of<T, Cuda>(gpu);
    REQUIRE(cpu_params.size() == gpu_params.size());
    for (std::size_t i = 0; i < cpu_params.size(); ++i) {
      REQUIRE(cpu_params[i].first == gpu_params[i].first);
      tensor::Tensor<float>& value = cpu_params[i].second->value;
      const tensor::Tensor<T> drawn = tensor::to_host<T>(gpu_params[i].second->value.view());
      REQUIRE(drawn.shape() == value.shape());
      std::int64_t different = 0;
      for (std::int64_t j = 0; j < value.numel(); ++j) {
        const T expected(value.data()[j]);
        if (std::memcmp(&expected, drawn.data() + j, sizeof(T)) != 0) ++different;
        value.data()[j] = static_cast<float>(drawn.data()[j]);
      }
      INFO("initial " << cpu_params[i].first);
      CHECK(different == 0);
    }
  }
};

template <class Spec, class In, class T>
void check_batch(LayerPair<Spec, In, T>& layers, std::int64_t batch, const std::string& what) {
  using Out = typename LayerPair<Spec, In, T>::GpuLayer::Output;
  nn::Rng rng(kSeed + static_cast<std::uint64_t>(batch));
  const tensor::Tensor<float> x = random_input<T>(In::batch(batch), rng);
  const tensor::Tensor<float> dy = random_input<T>(Out::batch(batch), rng);

  std::vector<std::string> names;
  std::vector<std::vector<float>> expected_grads;
  tensor::Tensor<float> y(Out::batch(batch)), dx(In::batch(batch));
  for (auto& [name, p] : parameters_of<float, Cpu>(layers.cpu)) p->grad.fill(0.0f);
  layers.cpu.forward(x.view(), y.view(), layers.cpu_ctx);

  cudaStream_t stream = layers.ctx.stream();
  zero_device_gradients<T>(layers.gpu, stream);
  const auto device_x = upload<T>(x);
  const auto device_dy = upload<T>(dy);
  tensor::Tensor<T, Cuda> device_y(Out::batch(batch)), device_dx(In::batch(batch));
  poison<T>(device_y.view(), stream);
  layers.gpu.forward(device_x.view(), device_y.view(), layers.ctx);
  const std::vector<float> gpu_y = download<T>(device_y.view(), stream);
  const double out_error = relative_error(gpu_y, values(y));

  // The CPU's backward takes its ReLU mask from the GPU's output: an output within rounding of
  // zero may have either sign on the two sides, and one flipped mask changes a gradient by a whole
  // term, which says nothing about either implementation.
  tensor::Tensor<float> mask_source(Out::batch(batch));
  std::copy(gpu_y.begin(), gpu_y.end(), mask_source.data());
  layers.cpu.backward(x.view(), mask_source.view(), dy.view(), dx.view(), layers.cpu_ctx);
  for (auto& [name, p] : parameters_of<float, Cpu>(layers.cpu)) {
    names.push_back(name);
    expected_grads.push_back(values(p->grad));
  }

  layers.gpu.backward(device_x.view(), device_y.view(), device_dy.view(),
                      tensor::TensorView<T, Cuda>(), layers.ctx);
  const auto once = device_gradients<T>(layers.gpu, stream);
  poison<T>(device_dx.view(), stream);
  layers.gpu.backward(device_x.view(), device_y.view(), device_dy.view(), device_dx.view(),
                      layers.ctx);
  const auto twice = device_gradients<T>(layers.gpu, stream);
  const double dx_error = relative_error(download<T>(device_dx.view(), stream), values(dx));

  INFO(what << ", batch " << batch);
  CHECK(out_error < tolerance<T>());
  CHECK(dx_error < tolerance<T>());
  REQUIRE(once.size() == expected_grads.size());
  std::string grad_errors;
  for (std::size_t i = 0; i < once.size(); ++i) {
    const double once_error = relative_error(once[i], expected_grads[i]);
    const double twice_error = relative_error(twice[i], scaled(expected_grads[i], 2.0f));
    INFO("gradient of " << names[i] << " after one and two backward passes");
    CHECK(once_error < tolerance<T>());
    CHECK(twice_error < tolerance<T>());
    char text[96];
    std::snprintf(text, sizeof text, " d%s %.2e/%.2e", names[i].c_str(), once_error, twice_error);
    grad_errors += text;
  }
  std::printf("%s batch %lld: out %.2e dx %.2e%s\n", what.c_str(), static_cast<long long>(batch),
              out_error, dx_error, grad_errors.c_str());
}

// Forward and backward captured into a CUDA graph after a first (eager) call at the batch size:
// nothing in them may allocate or synchronise (global capture mode turns that into an error). The
// replay must reproduce the eager results; `configure` is applied to the layer first.
template <class Spec, class In, class T, class Configure>
void check_graph_capture(Configure&& configure, const std::string& what) {
  using Layer = nn::bind_t<Spec, In, T, Cuda>;
  using Out = typename Layer::Output;
  constexpr std::int64_t kBatch = 6;
  Layer layer;
  nn::Rng init(kSeed);
  layer.initialize(init);
  configure(layer);
  nn::Context<Cuda> ctx;
  cudaStream_t stream = ctx.stream();
  nn::Rng rng(kSeed + 1);
  const auto x = upload<T>(random_input<T>(In::batch(kBatch), rng));
  const auto dy = upload<T>(random_input<T>(Out::batch(kBatch), rng));
  tensor::Tensor<T, Cuda> y(Out::batch(kBatch)), dx(In::batch(kBatch));
  const auto results = [&] {
    std::vector<std::vector<float>> out{download<T>(y.view(), stream),
                                        download<T>(dx.view(), stream)};
    for (auto& grad : device_gradients<T>(layer, stream)) out.push_back(std::move(grad));
    return out;
  };

  zero_device_gradients<T>(layer, stream);
  layer.forward(x.view(), y.view(), ctx);
  layer.backward(x.view(), y.view(), dy.view(), dx.view(), ctx);
  const auto eager = results();

  zero_device_gradients<T>(layer, stream);
  poison<T>(y.view(), stream);
  poison<T>(dx.view(), stream);
  ctx.synchronize();
  cudaGraph_t graph = nullptr;
  COLTRAIN_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  layer.forward(x.view(), y.view(), ctx);
  layer.backward(x.view(), y.view(), dy.view(), dx.view(), ctx);
  COLTRAIN_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  COLTRAIN_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  COLTRAIN_CHECK_CUDA(cudaGraphLaunch(exec, stream));
  ctx.synchronize();
  const auto replayed = results();
  COLTRAIN_CHECK_CUDA(cudaGraphExecDestroy(exec));
  COLTRAIN_CHECK_CUDA(cudaGraphDestroy(graph));

  REQUIRE(replayed.size() == eager.size());
  for (std::size_t i = 0; i < eager.size(); ++i) {
    INFO(what << " " << type_name<T>() << ", result " << i
              << " (output, input gradient, parameter gradients)");
    CHECK(relative_error(replayed[i], eager[i]) < 1e-3);
  }
}

}  // namespace layer_checks
