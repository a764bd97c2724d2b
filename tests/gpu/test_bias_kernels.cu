// The bias kernels of cuda/bias.cuh against host references, in float, half and bfloat16, on
// [count, channels, inner] shapes of NCHW activations (inner = H*W), of rows (inner = 1) and of
// one channel with a long sum (many slices):
// - add_bias (with and without ReLU, ReLU alone) is exact: the same float additions as the host;
// - the bias gradient (alone, and fused with the ReLU backward pass) accumulates into an existing
//   gradient, is within float rounding of a double reference (plus the rounding of the stored T),
//   and gives the same bits when run twice; the masked gradient is exact.
// Outputs are poisoned with NaN first, so an element left unwritten fails.

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/bias.cuh>
#include <coltrain/nn/init.hpp>

#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using coltrain::bfloat16;
using coltrain::half;
using coltrain::cuda::ChannelShape;

const std::vector<ChannelShape> kShapes = {
    {3, 5, 63},      // NCHW, 7x9 maps
    {2, 64, 1024},   // ResNet's first stage at batch 2
    {513, 10, 1},    // rows of a Linear layer
    {8, 1, 4096},    // one channel, a long sum over several slices
    {64, 128, 64},   // 8x8 maps, many channels
    {1, 3, 1},       // tiny
};

template <class T>
std::string type_name() {
  return std::string(coltrain::name_of(coltrain::data_type_v<T>));
}

// Bytes equal, or both NaN (the NaN a float addition returns differs between host and device).
template <class T>
bool same(T a, T b) {
  const auto fa = static_cast<float>(a), fb = static_cast<float>(b);
  if (std::isnan(fa) || std::isnan(fb)) return std::isnan(fa) && std::isnan(fb);
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
std::vector<T> random_values(std::int64_t n, coltrain::nn::Rng& rng, double bound = 2.0) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (T& x : v) x = T(static_cast<float>(rng.uniform(-bound, bound)));
  return v;
}

// A device copy of a host vector, freed at scope exit.
template <class T>
class DeviceVector {
 public:
  explicit DeviceVector(std::size_t n) : size_(n) {
    if (n) COLTRAIN_CHECK_CUDA(cudaMalloc(&data_, n * sizeof(T)));
  }
  explicit DeviceVector(const std::vector<T>& host) : DeviceVector(host.size()) { upload(host); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() { cudaFree(data_); }

  T* data() { return data_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == size_);
    const std::size_t bytes = size_ * sizeof(T);
    if (size_) COLTRAIN_CHECK_CUDA(cudaMemcpy(data_, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    COLTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
    const std::size_t bytes = size_ * sizeof(T);
    if (size_) COLTRAIN_CHECK_CUDA(cudaMemcpy(host.data(), data_, bytes, cudaMemcpyDeviceToHost));
    return host;
  }
  void poison() {
    if (size_) COLTRAIN_CHECK_CUDA(cudaMemset(data_, 0xFF, size_ * sizeof(T)));
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

std::int64_t channel_of(const ChannelShape& s, std::int64_t i) { return i / s.inner % s.channels; }

template <class T>
void check_add_bias(const ChannelShape& shape, bool with_bias, bool relu) {
  coltrain::nn::Rng rng(static_cast<std::uint64_t>(shape.numel() * 7 + shape.channels));
  std::vector<T> out = random_values<T>(shape.numel(), rng);
  if (!out.empty()) out[0] = T(std::nanf(""));  // NaN passes the ReLU, as torch.relu
  const std::vector<T> bias = random_values<T>(shape.channels, rng);
  DeviceVector<T> device_out(out), device_bias(bias);
  coltrain::cuda::add_bias(device_out.data(), with_bias ? device_bias.data() : nullptr, shape, relu,
                           nullptr);
  COLTRAIN_CHECK_CUDA(cudaGetLastError());
  const std::vector<T> got = device_out.download();
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < shape.numel(); ++i) {
    float v = static_cast<float>(out[i]);
    if (with_bias) v += static_cast<float>(bias[channel_of(shape, i)]);
    if (relu && v < 0.0f) v = 0.0f;
    if (!same(got[i], T(v))) ++wrong;
  }
  INFO(type_name<T>() << " [" << shape.count << ", " << shape.channels << ", " << shape.inner
                      << "] bias " << with_bias << " relu " << relu);
  CHECK(wrong == 0);
}

// grad_bias (starting from `initial`) + the per-channel sums of the (masked) gradient, in double,
// with the sum of magnitudes that bounds the float rounding.
struct Reference {
  std::vector<double> sum, magnitude;
};

template <class T>
Reference bias_reference(const ChannelShape& shape, const std::vector<T>& initial,
                         const std::vector<T>& grad, const std::vector<T>* out) {
  Reference r{std::vector<double>(initial.size()), std::vector<double>(initial.size())};
  for (std::size_t c = 0; c < initial.size(); ++c) {
    r.sum[c] = static_cast<float>(initial[c]);
    r.magnitude[c] = std::fabs(r.sum[c]);
  }
  for (std::int64_t i = 0; i < shape.numel(); ++i) {
    if (out && !(static_cast<float>((*out)[i]) > 0.0f)) continue;
    const double g = static_cast<float>(grad[i]);
    r.sum[channel_of(shape, i)] += g;
    r.magnitude[channel_of(shape, i)] += std::fabs(g);
  }
  return r;
}

template <class T>
double storage_tolerance() {
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  if constexpr (std::is_same_v<T, half>) return 1e-3;
  return 8e-3;
}

template <class T>
void check_bias_sums(const std::vector<T>& got, const Reference& expected, const char* what) {
  std::int64_t wrong = 0;
  for (std::size_t c = 0; c < got.size(); ++c) {
    const double value = static_cast<float>(got[c]);
    const double allowed = storage_tolerance<T>() * (expected.magnitude[c] + 1e-30);
    if (!(std::fabs(value - expected.sum[c]) <= allowed)) ++wrong;
  }
  INFO(what);
  CHECK(wrong == 0);
}

// With `masked` the fused ReLU backward pass (out drawn in (-2, 2): about half masked).
template <class T>
void check_bias_grad(const ChannelShape& shape, bool masked, bool with_bias) {
  coltrain::nn::Rng rng(static_cast<std::uint64_t>(shape.numel() * 3 + shape.channels));
  const std::vector<T> grad = random_values<T>(shape.numel(), rng, 1.0);
  const std::vector<T> out = random_values<T>(shape.numel(), rng);
  const std::vector<T> initial = random_values<T>(shape.channels, rng, 0.5);
  DeviceVector<T> device_grad(grad), device_out(out), device_bias_grad(initial);
  DeviceVector<T> device_masked(static_cast<std::size_t>(shape.numel()));
  DeviceVector<float> partials(
      static_cast<std::size_t>(coltrain::cuda::bias_grad_scratch_floats(shape.channels)));
  T* bias_grad = with_bias ? device_bias_grad.data() : nullptr;
  const auto run = [&] {
    device_masked.poison();
    if (masked)
      coltrain::cuda::relu_backward_add_bias_grad(device_out.data(), device_grad.data(), shape,
                                                  device_masked.data(), bias_grad,
                                                  partials.data(), nullptr);
    else
      coltrain::cuda::add_bias_grad(device_grad.data(), shape, bias_grad, partials.data(), nullptr);
    COLTRAIN_CHECK_CUDA(cudaGetLastError());
  };
  INFO(type_name<T>() << " [" << shape.count << ", " << shape.channels << ", " << shape.inner
                      << "] masked " << masked << " bias " << with_bias);
  run();
  const std::vector<T> first = device_bias_grad.download();
  if (masked) {
    const std::vector<T> got = device_masked.download();
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < shape.numel(); ++i) {
      const T expected = static_cast<float>(out[i]) > 0.0f ? grad[i] : T(0.0f);
      if (std::memcmp(&got[i], &expected, sizeof(T)) != 0) ++wrong;
    }
    CHECK(wrong == 0);
  }
  if (!with_bias) {
    CHECK(std::memcmp(first.data(), initial.data(), initial.size() * sizeof(T)) == 0);
    return;
  }
  check_bias_sums(first, bias_reference(shape, initial, grad, masked ? &out : nullptr),
                  "after one call");
  // Same inputs, same starting gradient: the same bits (no atomics).
  device_bias_grad.upload(initial);
  run();
  const std::vector<T> second = device_bias_grad.download();
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(T)) == 0);
}

template <class T>
void check_all_kernels() {
  for (const ChannelShape& shape : kShapes) {
    for (const bool relu : {false, true}) check_add_bias<T>(shape, true, relu);
    check_add_bias<T>(shape, false, true);
    check_bias_grad<T>(shape, false, true);
    check_bias_grad<T>(shape, true, true);
    check_bias_grad<T>(shape, true, false);
  }
}

}  // namespace

TEST_CASE("bias kernels on the GPU match the host in float") { check_all_kernels<float>(); }
TEST_CASE("bias kernels on the GPU match the host in half") {
  check_all_kernels<coltrain::half>();
}
TEST_CASE("bias kernels on the GPU match the host in bfloat16") {
  check_all_kernels<coltrain::bfloat16>();
}

TEST_CASE("bias kernels on the GPU do nothing on empty tensors") {
  const ChannelShape empty{0, 4, 9};
  DeviceVector<float> bias(std::vector<float>{1, 2, 3, 4});
  DeviceVector<float> partials(
      static_cast<std::size_t>(coltrain::cuda::bias_grad_scratch_floats(4)));
  coltrain::cuda::add_bias<float>(nullptr, bias.data(), empty, true, nullptr);
  coltrain::cuda::add_bias_grad<float>(nullptr, empty, bias.data(), partials.data(), nullptr);
  coltrain::cuda::relu_backward_add_bias_grad<float>(nullptr, nullptr, empty, nullptr, bias.data(),
                                                     partials.data(), nullptr);
  CHECK(bias.download() == std::vector<float>{1, 2, 3, 4});
}
