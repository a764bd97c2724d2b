// BatchNorm2d and BatchNormReLU2d on the GPU against the CPU layers in fp32 on the same inputs
// (16-bit inputs are rounded first and the CPU sees the rounded values): outputs, input gradients,
// weight and bias gradients (added to gradients already there), running statistics and
// num_batches_tracked after two training steps, then evaluation mode, then a step without an input
// gradient. Outputs are poisoned with NaN bytes before every call, so an unwritten element fails.
// Shapes are ResNet-20's (16x32x32, 32x16x16, 64x8x8) at even and odd batches, plus planes that no
// vector divides and a view that starts inside a vector (the one-element path).

#include <coltrain/cuda/nn/batch_norm.cuh>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/tensor/device_copy.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

namespace {

// The CPU layer that the GPU is held to runs in double: the fp32 CPU layer's own rounding (of
// x - mean, of the gradient sums) is as large as the GPU's, so it cannot referee 1e-5.
using Reference = double;

using namespace coltrain;
using tensor::Cpu;
using tensor::Cuda;

template <class Spec>
struct SpecTraits;
template <double Momentum, double Eps>
struct SpecTraits<nn::BatchNorm2d<Momentum, Eps>> {
  static constexpr bool kFused = false;
};
template <double Momentum, double Eps>
struct SpecTraits<nn::BatchNormReLU2d<Momentum, Eps>> {
  static constexpr bool kFused = true;
  static constexpr double kEps = Eps;
};

template <class T>
double tolerance_for() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

// ||got - expected|| / ||expected||; infinite when `got` holds a NaN or an infinity.
double relative_error(const std::vector<double>& got, const std::vector<double>& expected) {
  REQUIRE(got.size() == expected.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (got[i] - expected[i]) * (got[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  return std::sqrt(diff / (norm > 0 ? norm : 1));
}

template <class U>
std::vector<double> as_doubles(const U* data, std::int64_t n) {
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<U, coltrain::half> || std::is_same_v<U, coltrain::bfloat16>)
      out[static_cast<std::size_t>(i)] = static_cast<float>(data[i]);
    else
      out[static_cast<std::size_t>(i)] = static_cast<double>(data[i]);
  }
  return out;
}

// Host copy of device memory, read after the context's stream has finished.
template <class U>
std::vector<double> download(const U* device, std::int64_t n, nn::Context<Cuda>& ctx) {
  ctx.synchronize();
  std::vector<U> host(static_cast<std::size_t>(n));
  COLTRAIN_CHECK_CUDA(cudaMemcpy(host.data(), device, n * sizeof(U), cudaMemcpyDeviceToHost));
  return as_doubles(host.data(), n);
}

template <class U>
void upload(U* device, const std::vector<U>& host, nn::Context<Cuda>& ctx) {
  COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(U),
                                      cudaMemcpyHostToDevice, ctx.stream()));
  ctx.synchronize();
}

// All bytes 0xff: a NaN in float, half and bfloat16.
template <class U>
void poison(U* device, std::int64_t n, nn::Context<Cuda>& ctx) {
  COLTRAIN_CHECK_CUDA(cudaMemsetAsync(device, 0xff, n * sizeof(U), ctx.stream()));
}

// Values stored as T on the device and, rounded alike, as float for the CPU reference, drawn per
// channel of [batch, channels, plane] as offset + spread * uniform(-1, 1), so that the channels'
// means and variances differ (and some means are large against the spread).
template <class T>
struct Values {
  std::int64_t batch, channels, plane;
  std::vector<double> offset, spread;  // per channel
  std::vector<T> stored;
  std::vector<float> exact;

  void redraw(std::size_t i, nn::Rng& rng) {
    const auto c = static_cast<std::size_t>((static_cast<std::int64_t>(i) / plane) % channels);
    stored[i] = T(static_cast<float>(offset[c] + spread[c] * rng.uniform(-1, 1)));
    exact[i] = static_cast<float>(stored[i]);
  }
};

template <class T>
Values<T> draw(std::int64_t batch, std::int64_t channels, std::int64_t plane, nn::Rng& rng,
               double max_offset, double min_spread, double max_spread) {
  Values<T> v{batch, channels, plane, {}, {}, {}, {}};
  for (std::int64_t c = 0; c < channels; ++c) {
    v.offset.push_back(rng.uniform(-max_offset, max_offset));
    v.spread.push_back(rng.uniform(min_spread, max_spread));
  }
  const auto n = static_cast<std::size_t>(batch * channels * plane);
  v.stored.resize(n);
  v.exact.resize(n);
  for (std::size_t i = 0; i < n; ++i) v.redraw(i, rng);
  return v;
}

// The pre-ReLU value of every element as the CPU layer would compute it, in double: with the
// batch's statistics, or with `running` (mean, variance) in evaluation.
template <class T>
std::vector<double> pre_activation(const Values<T>& x, const std::vector<double>& gamma,
                                   const std::vector<double>& beta, double eps,
                                   const std::vector<double>* running_mean,
                                   const std::vector<double>* running_var) {
  const auto channels = static_cast<std::size_t>(x.channels);
  std::vector<double> mean(channels), var(channels);
  const double count = static_cast<double>(x.batch * x.plane);
  const auto channel_of = [&](std::size_t i) {
    return static_cast<std::size_t>((static_cast<std::int64_t>(i) / x.plane) % x.channels);
  };
  if (running_mean) {
    mean = *running_mean;
    var = *running_var;
  } else {
    for (std::size_t i = 0; i < x.exact.size(); ++i) mean[channel_of(i)] += x.exact[i] / count;
    for (std::size_t i = 0; i < x.exact.size(); ++i)
      var[channel_of(i)] +=
          (x.exact[i] - mean[channel_of(i)]) * (x.exact[i] - mean[channel_of(i)]) / count;
  }
  std::vector<double> v(x.exact.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::size_t c = channel_of(i);
    v[i] = (x.exact[i] - mean[c]) / std::sqrt(var[c] + eps) * gamma[c] + beta[c];
  }
  return v;
}

// Redraws the inputs whose pre-ReLU value lies near 0, where the CPU and the GPU, whose statistics
// differ in the last bits, could disagree on the ReLU's mask: one such element would change a
// channel's gradient sums by a whole term.
template <class T>
void keep_away_from_the_kink(Values<T>& x, const std::vector<double>& gamma,
                             const std::vector<double>& beta, double eps,
                             const std::vector<double>* running_mean,
                             const std::vector<double>* running_var, nn::Rng& rng) {
  constexpr double kBand = 1e-3;
  for (int round = 0; round < 8; ++round) {
    const auto v = pre_activation(x, gamma, beta, eps, running_mean, running_var);
    bool moved = false;
    for (std::size_t i = 0; i < v.size(); ++i)
      if (std::abs(v[i]) < kBand) {
        x.redraw(i, rng);
        moved = true;
      }
    if (!moved) return;
  }
  const auto v = pre_activation(x, gamma, beta, eps, running_mean, running_var);
  for (double value : v) REQUIRE(std::abs(value) > kBand / 10);
}

// Device memory of `n` elements of T starting `offset` elements into its allocation.
template <class T>
class DeviceArray {
 public:
  DeviceArray(std::int64_t n, std::int64_t offset)
      : storage_(tensor::Shape{n + offset}), offset_(offset) {}
  T* data() { return storage_.data() + offset_; }

 private:
  tensor::Tensor<T, Cuda> storage_;
  std::int64_t offset_;
};

template <class Layer, class Device>
std::map<std::string, std::vector<double>> buffers_of(Layer& layer, nn::Context<Cuda>& ctx) {
  std::map<std::string, std::vector<double>> out;
  layer.visit_buffers(
      [&](const std::string& name, auto& t) {
        if constexpr (std::is_same_v<Device, Cpu>)
          out[name] = as_doubles(t.data(), t.numel());
        else
          out[name] = download(t.data(), t.numel(), ctx);
      },
      "");
  return out;
}

// Gamma, beta and their gradients drawn (rounded to T) and given to both layers, so that the
// affine map and the adding of gradients are exercised.
template <class T, class GpuLayer, class CpuLayer>
void share_random_parameters(GpuLayer& gpu, CpuLayer& cpu, nn::Rng& rng, nn::Context<Cuda>& ctx) {
  std::map<std::string, nn::Parameter<Reference, Cpu>*> cpu_parameters;
  cpu.visit_parameters(
      [&](const std::string& name, nn::Parameter<Reference, Cpu>& p) { cpu_parameters[name] = &p; },
      "");
  gpu.visit_parameters(
      [&](const std::string& name, nn::Parameter<T, Cuda>& p) {
        nn::Parameter<Reference, Cpu>& reference = *cpu_parameters.at(name);
        const auto fill = [&](tensor::Tensor<T, Cuda>& device, tensor::Tensor<Reference, Cpu>& host,
                              double low, double high) {
          std::vector<T> stored;
          for (Reference& v : host.span()) {
            const double sign = rng.uniform() < 0.5 ? -1 : 1;
            stored.emplace_back(static_cast<float>(sign * rng.uniform(low, high)));
            v = static_cast<float>(stored.back());
          }
          upload(device.data(), stored, ctx);
        };
        fill(p.value, reference.value, 0.5, 1.5);
        fill(p.grad, reference.grad, 0.0, 1.0);
      },
      "");
}

template <class T, class GpuLayer, class CpuLayer>
void compare_parameter_gradients(GpuLayer& gpu, CpuLayer& cpu, nn::Context<Cuda>& ctx) {
  std::map<std::string, std::vector<double>> expected;
  cpu.visit_parameters(
      [&](const std::string& name, nn::Parameter<Reference, Cpu>& p) {
        expected[name] = as_doubles(p.grad.data(), p.grad.numel());
      },
      "");
  gpu.visit_parameters(
      [&](const std::string& name, nn::Parameter<T, Cuda>& p) {
        INFO("gradient of " << name);
        auto got = download(p.grad.data(), p.grad.numel(), ctx);
        auto want = expected.at(name);
        // Accumulated over several steps, a weight gradient can pass fp16's largest value (65504)
        // in the evaluation step, where x is far from the running mean: there fp16 must give Inf
        // (which loss scaling then catches), and the finite entries are compared.
        if constexpr (std::is_same_v<T, coltrain::half>) {
          for (std::size_t i = 0; i < want.size(); ++i) {
            if (std::abs(want[i]) < 65520.0) continue;
            CHECK(std::isinf(got[i]));
            got[i] = want[i] = 0.0;
          }
        }
        CHECK(relative_error(got, want) < tolerance_for<T>());
      },
      "");
}

template <class GpuLayer, class CpuLayer>
void compare_buffers(GpuLayer& gpu, CpuLayer& cpu, nn::Context<Cuda>& ctx, double tolerance) {
  const auto got = buffers_of<GpuLayer, Cuda>(gpu, ctx);
  const auto expected = buffers_of<CpuLayer, Cpu>(cpu, ctx);
  REQUIRE(got.size() == expected.size());
  for (const auto& [name, values] : expected) {
    INFO("buffer " << name);
    if (name == "num_batches_tracked")
      CHECK(got.at(name) == values);
    else
      CHECK(relative_error(got.at(name), values) <= tolerance);
  }
}

// One forward and backward pass of both layers on fresh inputs; compares the outputs, the input
// gradients (unless `input_gradient` is false: then grad_in is empty) and parameter gradients.
template <class Spec, class T, class In, class GpuLayer, class CpuLayer>
void step_and_compare(GpuLayer& gpu, CpuLayer& cpu, nn::Context<Cuda>& gctx, nn::Context<Cpu>& cctx,
                      std::int64_t batch, std::int64_t offset, bool input_gradient, nn::Rng& rng) {
  constexpr std::int64_t kC = In::kDims[0], kH = In::kDims[1], kW = In::kDims[2];
  const tensor::Shape shape{batch, kC, kH, kW};
  const std::int64_t n = shape.numel();
  Values<T> x = draw<T>(batch, kC, kH * kW, rng, 4.0, 0.1, 2.0);
  const Values<T> dy = draw<T>(batch, kC, kH * kW, rng, 0.5, 0.5, 1.0);
  if constexpr (SpecTraits<Spec>::kFused) {
    std::map<std::string, std::vector<double>> parameters;
    cpu.visit_parameters(
        [&](const std::string& name, nn::Parameter<Reference, Cpu>& p) {
          parameters[name] = as_doubles(p.value.data(), p.value.numel());
        },
        "");
    const auto running = buffers_of<CpuLayer, Cpu>(cpu, gctx);
    const bool training = cctx.training();
    keep_away_from_the_kink(x, parameters.at("weight"), parameters.at("bias"),
                            SpecTraits<Spec>::kEps,
                            training ? nullptr : &running.at("running_mean"),
                            training ? nullptr : &running.at("running_var"), rng);
  }

  DeviceArray<T> x_device(n, offset), y_device(n, offset), dy_device(n, offset),
      dx_device(n, offset);
  upload(x_device.data(), x.stored, gctx);
  upload(dy_device.data(), dy.stored, gctx);
  poison(y_device.data(), n, gctx);
  poison(dx_device.data(), n, gctx);
  const tensor::TensorView<const T, Cuda> x_view(x_device.data(), shape);
  const tensor::TensorView<T, Cuda> y_view(y_device.data(), shape);
  gpu.forward(x_view, y_view, gctx);
  gpu.backward(x_view, y_view, tensor::TensorView<const T, Cuda>(dy_device.data(), shape),
               input_gradient ? tensor::TensorView<T, Cuda>(dx_device.data(), shape)
                              : tensor::TensorView<T, Cuda>(),
               gctx);

  tensor::Tensor<Reference, Cpu> x_host(shape), y_host(shape), dy_host(shape), dx_host(shape);
  std::copy(x.exact.begin(), x.exact.end(), x_host.data());
  std::copy(dy.exact.begin(), dy.exact.end(), dy_host.data());
  cpu.forward(x_host.view(), y_host.view(), cctx);
  cpu.backward(x_host.view(), y_host.view(), dy_host.view(),
               input_gradient ? dx_host.view() : tensor::TensorView<Reference, Cpu>(), cctx);

  {
    INFO("output");
    CHECK(relative_error(download(y_device.data(), n, gctx), as_doubles(y_host.data(), n)) <
          tolerance_for<T>());
  }
  if (input_gradient) {
    INFO("input gradient");
    CHECK(relative_error(download(dx_device.data(), n, gctx), as_doubles(dx_host.data(), n)) <
          tolerance_for<T>());
  }
  compare_parameter_gradients<T>(gpu, cpu, gctx);
}

// Two training steps, evaluation, then a training step without an input gradient.
template <class Spec, class In, class T>
void check_against_cpu(std::int64_t batch, std::int64_t offset = 0) {
  using GpuLayer = nn::bind_t<Spec, In, T, Cuda>;
  using CpuLayer = nn::bind_t<Spec, In, Reference, Cpu>;
  INFO("batch " << batch << ", shape " << In::kDims[0] << "x" << In::kDims[1] << "x" << In::kDims[2]
                << ", offset " << offset);
  nn::Context<Cuda> gctx(1, 3);
  nn::Context<Cpu> cctx(1, 3);
  GpuLayer gpu;
  CpuLayer cpu;
  nn::Rng init_gpu(5), init_cpu(5), rng(static_cast<std::uint64_t>(17 + batch));
  gpu.initialize(init_gpu);
  cpu.initialize(init_cpu);
  compare_buffers(gpu, cpu, gctx, 0.0);
  share_random_parameters<T>(gpu, cpu, rng, gctx);

  for (int step = 0; step < 2; ++step) {
    INFO("training step " << step);
    step_and_compare<Spec, T, In>(gpu, cpu, gctx, cctx, batch, offset, true, rng);
  }
  // Running statistics see the same (rounded) inputs on both sides.
  compare_buffers(gpu, cpu, gctx, 1e-5);

  gctx.set_mode(nn::Mode::kEval);
  cctx.set_mode(nn::Mode::kEval);
  {
    INFO("evaluation");
    step_and_compare<Spec, T, In>(gpu, cpu, gctx, cctx, batch, offset, true, rng);
    compare_buffers(gpu, cpu, gctx, 1e-5);
  }

  gctx.set_mode(nn::Mode::kTrain);
  cctx.set_mode(nn::Mode::kTrain);
  {
    INFO("training without an input gradient");
    step_and_compare<Spec, T, In>(gpu, cpu, gctx, cctx, batch, offset, false, rng);
    compare_buffers(gpu, cpu, gctx, 1e-5);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("BatchNorm2d on the GPU matches the CPU layer on ResNet-20's shapes",
                   "[gpu][batch_norm]", float, coltrain::half, coltrain::bfloat16) {
  check_against_cpu<nn::BatchNorm2d<>, nn::Chw<16, 32, 32>, TestType>(2);
  check_against_cpu<nn::BatchNorm2d<>, nn::Chw<16, 32, 32>, TestType>(7);
  check_against_cpu<nn::BatchNorm2d<>, nn::Chw<32, 16, 16>, TestType>(33);
  check_against_cpu<nn::BatchNorm2d<>, nn::Chw<64, 8, 8>, TestType>(2);
  check_against_cpu<nn::BatchNorm2d<>, nn::Chw<64, 8, 8>, TestType>(64);
}

TEMPLATE_TEST_CASE("BatchNormReLU2d on the GPU matches the CPU layer on ResNet-20's shapes",
                   "[gpu][batch_norm]", float, coltrain::half, coltrain::bfloat16) {
  check_against_cpu<nn::BatchNormReLU2d<>, nn::Chw<16, 32, 32>, TestType>(64);
  check_against_cpu<nn::BatchNormReLU2d<>, nn::Chw<32, 16, 16>, TestType>(3);
  check_against_cpu<nn::BatchNormReLU2d<>, nn::Chw<64, 8, 8>, TestType>(5);
}

TEMPLATE_TEST_CASE("BatchNorm2d on the GPU with planes no vector divides and unaligned views",
                   "[gpu][batch_norm]", float, coltrain::half, coltrain::bfloat16) {
  check_against_cpu<nn::BatchNorm2d<>, nn::Chw<3, 5, 5>, TestType>(4);
  check_against_cpu<nn::BatchNormReLU2d<>, nn::Chw<3, 5, 5>, TestType>(1);
  check_against_cpu<nn::BatchNorm2d<>, nn::Chw<16, 8, 8>, TestType>(3, 1);
  check_against_cpu<nn::BatchNormReLU2d<>, nn::Chw<16, 8, 8>, TestType>(9, 3);
}

TEST_CASE("BatchNorm2d on the GPU with other momentum and eps", "[gpu][batch_norm]") {
  check_against_cpu<nn::BatchNorm2d<0.3, 1e-3>, nn::Chw<8, 6, 6>, float>(5);
  check_against_cpu<nn::BatchNormReLU2d<1.0, 1e-2>, nn::Chw<8, 6, 6>, coltrain::half>(5);
}

TEST_CASE("BatchNorm2d on the GPU refuses to train on one value per channel", "[gpu][batch_norm]") {
  nn::Context<Cuda> ctx;
  nn::bind_t<nn::BatchNorm2d<>, nn::Chw<4, 1, 1>, float, Cuda> layer;
  nn::Rng rng(1);
  layer.initialize(rng);
  tensor::Tensor<float, Cuda> x(tensor::Shape{1, 4, 1, 1}), y(tensor::Shape{1, 4, 1, 1});
  CHECK_THROWS_AS(layer.forward(x.view(), y.view(), ctx), InvalidArgument);
}

// Statistics are combined in a fixed order: the same input gives the same bits. A forward and
// backward pass captured as a CUDA graph (which fails on any allocation or synchronisation while
// capturing) replays to the same bits as the direct calls.
TEST_CASE("BatchNormReLU2d on the GPU is deterministic and replays from a CUDA graph",
          "[gpu][batch_norm]") {
  using Layer = nn::bind_t<nn::BatchNormReLU2d<>, nn::Chw<16, 32, 32>, coltrain::half, Cuda>;
  constexpr std::int64_t kBatch = 37;
  const tensor::Shape shape{kBatch, 16, 32, 32};
  const std::int64_t n = shape.numel();
  nn::Context<Cuda> ctx;
  Layer layer;
  nn::Rng rng(9);
  layer.initialize(rng);
  const Values<coltrain::half> x = draw<coltrain::half>(kBatch, 16, 1024, rng, 3.0, 0.2, 2.0);
  const Values<coltrain::half> dy = draw<coltrain::half>(kBatch, 16, 1024, rng, 0.5, 0.5, 1.0);
  tensor::Tensor<coltrain::half, Cuda> x_device(shape), y(shape), dy_device(shape), dx(shape);
  upload(x_device.data(), x.stored, ctx);
  upload(dy_device.data(), dy.stored, ctx);

  const auto pass = [&] {
    layer.forward(x_device.view(), y.view(), ctx);
    layer.backward(x_device.view(), y.view(), dy_device.view(), dx.view(), ctx);
  };
  pass();
  const auto y_first = download(y.data(), n, ctx), dx_first = download(dx.data(), n, ctx);
  poison(y.data(), n, ctx);
  poison(dx.data(), n, ctx);
  pass();
  CHECK(download(y.data(), n, ctx) == y_first);
  CHECK(download(dx.data(), n, ctx) == dx_first);

  poison(y.data(), n, ctx);
  poison(dx.data(), n, ctx);
  ctx.synchronize();
  cudaGraph_t graph = nullptr;
  COLTRAIN_CHECK_CUDA(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeGlobal));
  pass();
  COLTRAIN_CHECK_CUDA(cudaStreamEndCapture(ctx.stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  COLTRAIN_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  COLTRAIN_CHECK_CUDA(cudaGraphLaunch(exec, ctx.stream()));
  CHECK(download(y.data(), n, ctx) == y_first);
  CHECK(download(dx.data(), n, ctx) == dx_first);
  COLTRAIN_CHECK_CUDA(cudaGraphExecDestroy(exec));
  COLTRAIN_CHECK_CUDA(cudaGraphDestroy(graph));

  std::int64_t tracked = 0;
  layer.visit_buffers(
      [&](const std::string& name, auto& t) {
        if (name == "num_batches_tracked")
          tracked = static_cast<std::int64_t>(download(t.data(), 1, ctx)[0]);
      },
      "");
  CHECK(tracked == 3);
}
