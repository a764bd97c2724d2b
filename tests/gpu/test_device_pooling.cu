// MaxPool2d, AvgPool2d and GlobalAvgPool on the GPU against the CPU layers in fp32 on the same
// inputs (16-bit inputs are rounded first and the CPU sees the rounded values). Max pooling picks
// values, so its outputs must be equal bit for bit, ties (the first maximum wins) and NaNs (which
// win) included, and so must its input gradient wherever a sum of one term or the CPU's order of
// summation makes it exact. Outputs are poisoned with NaN bytes first, so an unwritten element
// (such as an input no window covers) fails. Shapes: MnistConvNet's max pooling (64x24x24),
// overlapping and padded windows, odd sizes, ResNet's global pooling (64x8x8, 512x4x4), planes no
// vector divides and a view that starts inside a vector.

#include <coltrain/cuda/nn/pooling.cuh>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/pooling.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using namespace coltrain;
using tensor::Cpu;
using tensor::Cuda;

template <class T>
constexpr bool kIsFloat = std::is_same_v<T, float>;

template <class U>
float widen(U value) {
  return static_cast<float>(value);
}

double relative_error(const std::vector<float>& got, const std::vector<float>& expected) {
  REQUIRE(got.size() == expected.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double(got[i]) - expected[i]) * (double(got[i]) - expected[i]);
    norm += double(expected[i]) * expected[i];
  }
  return std::sqrt(diff / (norm > 0 ? norm : 1));
}

// Equal values, or NaN on both sides; reports the first difference.
void check_same(const std::vector<float>& got, const std::vector<float>& expected) {
  REQUIRE(got.size() == expected.size());
  std::size_t differences = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool same =
        (std::isnan(got[i]) && std::isnan(expected[i])) ||
        std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(expected[i]);
    if (!same && differences++ == 0) first = i;
  }
  INFO(differences << " of " << got.size() << " differ; first at " << first << ": got "
                   << got[first] << ", expected " << expected[first]);
  CHECK(differences == 0);
}

template <class T>
std::vector<float> download(const T* device, std::int64_t n, nn::Context<Cuda>& ctx) {
  ctx.synchronize();
  std::vector<T> host(static_cast<std::size_t>(n));
  COLTRAIN_CHECK_CUDA(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> out;
  for (const T& v : host) out.push_back(widen(v));
  return out;
}

template <class T>
void upload(T* device, const std::vector<T>& host, nn::Context<Cuda>& ctx) {
  COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T),
                                      cudaMemcpyHostToDevice, ctx.stream()));
  ctx.synchronize();
}

// All bytes 0xff: a NaN in float, half and bfloat16.
template <class T>
void poison(T* device, std::int64_t n, nn::Context<Cuda>& ctx) {
  COLTRAIN_CHECK_CUDA(cudaMemsetAsync(device, 0xff, n * sizeof(T), ctx.stream()));
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

enum class Inputs {
  kUniform,     // uniform in (-2, 2)
  kTies,        // integers in [-2, 2]: many equal maxima in a window
  kTiesAndNaN,  // as kTies, with a NaN every 37 elements
};

// Values stored as T and, rounded alike, as float for the CPU reference.
template <class T>
struct Values {
  std::vector<T> stored;
  std::vector<float> exact;
};

template <class T>
Values<T> draw(std::int64_t n, Inputs kind, nn::Rng& rng) {
  Values<T> v;
  for (std::int64_t i = 0; i < n; ++i) {
    double value = rng.uniform(-2, 2);
    if (kind != Inputs::kUniform) value = std::floor(rng.uniform(-2, 3));
    if (kind == Inputs::kTiesAndNaN && i % 37 == 5)
      value = std::numeric_limits<double>::quiet_NaN();
    v.stored.emplace_back(static_cast<float>(value));
    v.exact.push_back(widen(v.stored.back()));
  }
  return v;
}

// Which comparisons must be exact (else relative error below the type's tolerance).
struct Exact {
  bool output;
  bool input_gradient;
};

template <class Spec, class In, class T>
void check_against_cpu(std::int64_t batch, Inputs kind, Exact exact, double float_tolerance,
                       std::int64_t offset = 0) {
  using GpuLayer = nn::bind_t<Spec, In, T, Cuda>;
  using CpuLayer = nn::bind_t<Spec, In, float, Cpu>;
  using Out = typename CpuLayer::Output;
  static_assert(std::is_same_v<Out, typename GpuLayer::Output>);
  INFO("batch " << batch << ", input " << In::kDims[0] << "x" << In::kDims[1] << "x" << In::kDims[2]
                << ", offset " << offset);
  const double tolerance = kIsFloat<T> ? float_tolerance : 1e-2;
  const tensor::Shape in_shape = In::batch(batch), out_shape = Out::batch(batch);
  const std::int64_t n_in = in_shape.numel(), n_out = out_shape.numel();
  nn::Rng rng(static_cast<std::uint64_t>(31 + batch));
  const Values<T> x = draw<T>(n_in, kind, rng);
  const Values<T> dy = draw<T>(n_out, Inputs::kUniform, rng);

  nn::Context<Cuda> gctx;
  nn::Context<Cpu> cctx;
  GpuLayer gpu;
  CpuLayer cpu;
  nn::Rng init_gpu(1), init_cpu(1);
  gpu.initialize(init_gpu);
  cpu.initialize(init_cpu);

  DeviceArray<T> x_device(n_in, offset), y_device(n_out, offset), dy_device(n_out, offset),
      dx_device(n_in, offset);
  upload(x_device.data(), x.stored, gctx);
  upload(dy_device.data(), dy.stored, gctx);
  poison(y_device.data(), n_out, gctx);
  poison(dx_device.data(), n_in, gctx);
  const tensor::TensorView<const T, Cuda> x_view(x_device.data(), in_shape);
  const tensor::TensorView<T, Cuda> y_view(y_device.data(), out_shape);
  gpu.forward(x_view, y_view, gctx);
  gpu.backward(x_view, y_view, tensor::TensorView<const T, Cuda>(dy_device.data(), out_shape),
               tensor::TensorView<T, Cuda>(dx_device.data(), in_shape), gctx);

  tensor::Tensor<float, Cpu> x_host(in_shape), y_host(out_shape), dy_host(out_shape),
      dx_host(in_shape);
  std::memcpy(x_host.data(), x.exact.data(), n_in * sizeof(float));
  std::memcpy(dy_host.data(), dy.exact.data(), n_out * sizeof(float));
  cpu.forward(x_host.view(), y_host.view(), cctx);
  cpu.backward(x_host.view(), y_host.view(), dy_host.view(), dx_host.view(), cctx);

  const std::vector<float> y_expected(y_host.data(), y_host.data() + n_out);
  const std::vector<float> dx_expected(dx_host.data(), dx_host.data() + n_in);
  {
    INFO("output");
    const auto y = download(y_device.data(), n_out, gctx);
    if (exact.output)
      check_same(y, y_expected);
    else
      CHECK(relative_error(y, y_expected) < tolerance);
  }
  {
    INFO("input gradient");
    const auto dx = download(dx_device.data(), n_in, gctx);
    if (exact.input_gradient)
      check_same(dx, dx_expected);
    else
      CHECK(relative_error(dx, dx_expected) < tolerance);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("MaxPool2d on the GPU matches the CPU layer bit for bit", "[gpu][pooling]",
                   float, coltrain::half, coltrain::bfloat16) {
  // Windows that do not overlap: each input gradient is one output gradient, or zero.
  constexpr Exact kDisjoint{true, true};
  for (const Inputs kind : {Inputs::kUniform, Inputs::kTies, Inputs::kTiesAndNaN}) {
    INFO("inputs " << static_cast<int>(kind));
    check_against_cpu<nn::MaxPool2d<2>, nn::Chw<64, 24, 24>, TestType>(2, kind, kDisjoint, 0);
    check_against_cpu<nn::MaxPool2d<2>, nn::Chw<64, 24, 24>, TestType>(5, kind, kDisjoint, 0);
    check_against_cpu<nn::MaxPool2d<2>, nn::Chw<8, 7, 7>, TestType>(3, kind, kDisjoint, 0);
    check_against_cpu<nn::MaxPool2d<3, 3, 1>, nn::Chw<4, 10, 10>, TestType>(3, kind, kDisjoint, 0);
  }
}

TEMPLATE_TEST_CASE("MaxPool2d on the GPU with overlapping, padded windows", "[gpu][pooling]", float,
                   coltrain::half, coltrain::bfloat16) {
  // Overlapping windows add several output gradients into one input, in the CPU's order: exact
  // in float, rounded once to T otherwise.
  constexpr Exact kOverlapping{true, kIsFloat<TestType>};
  for (const Inputs kind : {Inputs::kUniform, Inputs::kTies, Inputs::kTiesAndNaN}) {
    INFO("inputs " << static_cast<int>(kind));
    check_against_cpu<nn::MaxPool2d<3, 2, 1>, nn::Chw<16, 9, 9>, TestType>(3, kind, kOverlapping,
                                                                           0);
    check_against_cpu<nn::MaxPool2d<3, 1, 1>, nn::Chw<4, 6, 6>, TestType>(2, kind, kOverlapping, 0);
    check_against_cpu<nn::MaxPool2d<3, 2, 1>, nn::Chw<64, 32, 32>, TestType>(2, kind, kOverlapping,
                                                                             0);
  }
}

TEMPLATE_TEST_CASE("AvgPool2d on the GPU matches the CPU layer", "[gpu][pooling]", float,
                   coltrain::half, coltrain::bfloat16) {
  // The same sums in the same order as the CPU: equal in float up to the compiler's freedom.
  constexpr Exact kClose{false, false};
  check_against_cpu<nn::AvgPool2d<2>, nn::Chw<32, 16, 16>, TestType>(4, Inputs::kUniform, kClose,
                                                                     1e-6);
  check_against_cpu<nn::AvgPool2d<3, 2, 1>, nn::Chw<8, 9, 9>, TestType>(3, Inputs::kUniform, kClose,
                                                                        1e-6);
  check_against_cpu<nn::AvgPool2d<3, 1, 1>, nn::Chw<4, 5, 5>, TestType>(2, Inputs::kUniform, kClose,
                                                                        1e-6);
  check_against_cpu<nn::AvgPool2d<2>, nn::Chw<3, 7, 7>, TestType>(5, Inputs::kUniform, kClose,
                                                                  1e-6);
}

TEMPLATE_TEST_CASE("GlobalAvgPool on the GPU matches the CPU layer", "[gpu][pooling]", float,
                   coltrain::half, coltrain::bfloat16) {
  // The forward sums in another order than the CPU's lanes; the backward share is the same float
  // division (then rounded to T).
  constexpr Exact kGradientExact{false, kIsFloat<TestType>};
  check_against_cpu<nn::GlobalAvgPool, nn::Chw<64, 8, 8>, TestType>(7, Inputs::kUniform,
                                                                    kGradientExact, 1e-5);
  check_against_cpu<nn::GlobalAvgPool, nn::Chw<512, 4, 4>, TestType>(2, Inputs::kUniform,
                                                                     kGradientExact, 1e-5);
  check_against_cpu<nn::GlobalAvgPool, nn::Chw<8, 32, 32>, TestType>(3, Inputs::kUniform,
                                                                     kGradientExact, 1e-5);
  check_against_cpu<nn::GlobalAvgPool, nn::Chw<3, 5, 5>, TestType>(5, Inputs::kUniform,
                                                                   kGradientExact, 1e-5);
  check_against_cpu<nn::GlobalAvgPool, nn::Chw<16, 8, 8>, TestType>(3, Inputs::kUniform,
                                                                    kGradientExact, 1e-5, 1);
}

TEST_CASE("pooling on the GPU from views that start inside a vector", "[gpu][pooling]") {
  check_against_cpu<nn::MaxPool2d<2>, nn::Chw<8, 8, 8>, coltrain::half>(3, Inputs::kTies,
                                                                        {true, true}, 0, 1);
  check_against_cpu<nn::AvgPool2d<2>, nn::Chw<8, 8, 8>, float>(3, Inputs::kUniform, {false, false},
                                                               1e-6, 3);
}
