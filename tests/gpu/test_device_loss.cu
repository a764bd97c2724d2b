// The device cross-entropy against nn::SoftmaxCrossEntropy (the CPU loss, in double) for float,
// half and bfloat16 logits, with and without label smoothing, a device loss scale, bad labels, and
// top-k counting against nn::topk_correct.

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/nn/loss.cuh>
#include <coltrain/nn/loss.hpp>
#include <coltrain/tensor/device_copy.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using coltrain::bfloat16;
using coltrain::half;
namespace cuda = coltrain::cuda;
namespace nn = coltrain::nn;
namespace tensor = coltrain::tensor;

template <class T>
T from_float(float value) {
  if constexpr (std::is_same_v<T, float>) {
    return value;
  } else {
    return T(value);
  }
}

template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

// Logits rounded to T, and the same values in float for the reference (so the reference sees
// exactly what the device sees). `quantum` > 0 rounds them to multiples of it, making ties.
template <class T>
tensor::Tensor<T, tensor::Cpu> random_logits(std::int64_t batch, std::int64_t classes,
                                             std::uint64_t seed, float quantum = 0.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-6.0f, 6.0f);
  tensor::Tensor<T, tensor::Cpu> logits(tensor::Shape{batch, classes});
  for (std::int64_t i = 0; i < logits.numel(); ++i) {
    float v = dist(rng);
    if (quantum > 0.0f) v = std::round(v / quantum) * quantum;
    logits.data()[i] = from_float<T>(v);
  }
  return logits;
}

template <class T>
tensor::Tensor<float, tensor::Cpu> widened(const tensor::Tensor<T, tensor::Cpu>& t) {
  tensor::Tensor<float, tensor::Cpu> out(t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) out.data()[i] = static_cast<float>(t.data()[i]);
  return out;
}

std::vector<std::int32_t> random_labels(std::int64_t batch, std::int64_t classes,
                                        std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (auto& label : labels)
    label = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(classes));
  return labels;
}

tensor::Tensor<std::int32_t, tensor::Cuda> device_labels(const std::vector<std::int32_t>& labels) {
  tensor::Tensor<std::int32_t, tensor::Cpu> host(
      tensor::Shape{static_cast<std::int64_t>(labels.size())});
  std::copy(labels.begin(), labels.end(), host.data());
  return tensor::to_device(host);
}

template <class T>
double relative_error(const tensor::Tensor<T, tensor::Cpu>& out,
                      const tensor::Tensor<float, tensor::Cpu>& ref) {
  double diff = 0.0, norm = 0.0;
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const double o = static_cast<double>(static_cast<float>(out.data()[i]));
    const double r = ref.data()[i];
    if (!std::isfinite(o)) return INFINITY;
    diff += (o - r) * (o - r);
    norm += r * r;
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

class Stream {
 public:
  Stream() { COLTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

template <class T>
void compare_with_cpu(std::int64_t batch, std::int64_t classes, double smoothing) {
  INFO("batch " << batch << ", classes " << classes << ", smoothing " << smoothing);
  const Stream stream;
  const auto logits = random_logits<T>(batch, classes, 17 + batch * 31 + classes);
  const auto reference_logits = widened(logits);
  const auto labels = random_labels(batch, classes, 5 + batch);
  const nn::SoftmaxCrossEntropy cpu(smoothing);
  const float scale = 1024.0f;
  tensor::Tensor<float, tensor::Cpu> reference_grad(logits.shape());
  const double reference_loss = cpu.loss_and_grad<float>(
      reference_logits.view(), std::span<const std::int32_t>(labels), reference_grad.view(), scale);

  const auto d_logits = tensor::to_device(logits);
  const auto d_labels = device_labels(labels);
  tensor::Tensor<float, tensor::Cpu> host_scale(tensor::Shape{1});
  host_scale.data()[0] = scale;
  const auto d_scale = tensor::to_device(host_scale);
  tensor::Tensor<T, tensor::Cuda> d_grad(logits.shape());
  nn::DeviceSoftmaxCrossEntropy loss(smoothing);

  // forward alone, then forward_backward, then backward alone: each twice, to see the block
  // counter reset between launches.
  for (int round = 0; round < 2; ++round) {
    loss.forward<T>(d_logits.view(), d_labels.view(), stream.get());
    CHECK(std::fabs(loss.read_loss(stream.get()) - reference_loss) <=
          1e-5 * std::max(1.0, std::fabs(reference_loss)));

    COLTRAIN_CHECK_CUDA(cudaMemset(d_grad.data(), 0xff, d_grad.numel() * sizeof(T)));
    loss.forward_backward<T>(d_logits.view(), d_labels.view(), d_grad.view(), d_scale.data(),
                             stream.get());
    CHECK(std::fabs(loss.read_loss(stream.get()) - reference_loss) <=
          1e-5 * std::max(1.0, std::fabs(reference_loss)));
    CHECK(relative_error(tensor::to_host<T>(d_grad.view(), stream.get()), reference_grad) <=
          tolerance<T>());

    COLTRAIN_CHECK_CUDA(cudaMemset(d_grad.data(), 0xff, d_grad.numel() * sizeof(T)));
    loss.backward<T>(d_logits.view(), d_labels.view(), d_grad.view(), d_scale.data(), stream.get());
    loss.check_labels(stream.get());
    CHECK(relative_error(tensor::to_host<T>(d_grad.view(), stream.get()), reference_grad) <=
          tolerance<T>());
  }

  // Without a device scale the gradient is the unscaled one.
  tensor::Tensor<float, tensor::Cpu> unscaled(logits.shape());
  cpu.loss_and_grad<float>(reference_logits.view(), std::span<const std::int32_t>(labels),
                           unscaled.view(), 1.0);
  loss.backward<T>(d_logits.view(), d_labels.view(), d_grad.view(), nullptr, stream.get());
  CHECK(relative_error(tensor::to_host<T>(d_grad.view(), stream.get()), unscaled) <=
        tolerance<T>());
}

TEMPLATE_TEST_CASE("device cross-entropy matches the CPU loss", "[gpu][loss]", float, half,
                   bfloat16) {
  for (const auto& [batch, classes] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {1, 10}, {7, 10}, {33, 3}, {64, 1000}, {129, 37}, {1000, 10}}) {
    for (double smoothing : {0.0, 0.1, 1.0}) compare_with_cpu<TestType>(batch, classes, smoothing);
  }
}

TEST_CASE("device cross-entropy of an empty batch is 0", "[gpu][loss]") {
  const Stream stream;
  tensor::Tensor<float, tensor::Cuda> logits(tensor::Shape{0, 10});
  tensor::Tensor<std::int32_t, tensor::Cuda> labels(tensor::Shape{0});
  nn::DeviceSoftmaxCrossEntropy loss;
  loss.forward<float>(logits.view(), labels.view(), stream.get());
  CHECK(loss.read_loss(stream.get()) == 0.0f);
}

TEST_CASE("a bad label is reported with its sample, and nothing outside the batch is written",
          "[gpu][loss]") {
  const Stream stream;
  const std::int64_t batch = 9, classes = 10;
  const auto logits = random_logits<float>(batch, classes, 3);
  auto labels = random_labels(batch, classes, 4);
  labels[5] = 10;
  labels[7] = -1;
  const auto d_logits = tensor::to_device(logits);
  const auto d_labels = device_labels(labels);
  // One guard row past the gradient, which must stay poisoned.
  tensor::Tensor<float, tensor::Cuda> d_grad_storage(tensor::Shape{batch + 1, classes});
  COLTRAIN_CHECK_CUDA(
      cudaMemset(d_grad_storage.data(), 0xff, d_grad_storage.numel() * sizeof(float)));
  const tensor::TensorView<float, tensor::Cuda> d_grad(d_grad_storage.data(),
                                                       tensor::Shape{batch, classes});
  nn::DeviceSoftmaxCrossEntropy loss;
  loss.forward_backward<float>(d_logits.view(), d_labels.view(), d_grad, nullptr, stream.get());
  CHECK_THROWS_WITH(loss.read_loss(stream.get()),
                    Catch::Contains("label 10 of sample 5 is outside [0, 10)"));
  const auto grad = tensor::to_host<float>(d_grad_storage.view(), stream.get());
  for (std::int64_t j = 0; j < classes; ++j) {
    CHECK(grad.data()[5 * classes + j] == 0.0f);
    CHECK(grad.data()[7 * classes + j] == 0.0f);
    CHECK(std::isnan(grad.data()[batch * classes + j]));
  }
  for (std::int64_t j = 0; j < classes; ++j) CHECK(std::isfinite(grad.data()[j]));
  // The record is cleared by the read: good labels read cleanly afterwards.
  const auto good = device_labels(random_labels(batch, classes, 8));
  loss.forward<float>(d_logits.view(), good.view(), stream.get());
  CHECK(std::isfinite(loss.read_loss(stream.get())));
  // backward alone records too.
  loss.backward<float>(d_logits.view(), d_labels.view(), d_grad, nullptr, stream.get());
  CHECK_THROWS_WITH(loss.check_labels(stream.get()), Catch::Contains("sample 5"));
}

TEST_CASE("the device loss checks shapes and options", "[gpu][loss]") {
  CHECK_THROWS_AS(nn::DeviceSoftmaxCrossEntropy(1.5), coltrain::InvalidArgument);
  const Stream stream;
  tensor::Tensor<float, tensor::Cuda> logits(tensor::Shape{4, 10});
  tensor::Tensor<std::int32_t, tensor::Cuda> labels(tensor::Shape{3});
  nn::DeviceSoftmaxCrossEntropy loss;
  CHECK_THROWS_AS(loss.forward<float>(logits.view(), labels.view(), stream.get()),
                  coltrain::InvalidArgument);
}

template <class T>
void compare_topk(std::int64_t batch, std::int64_t classes, float quantum) {
  INFO("batch " << batch << ", classes " << classes << ", quantum " << quantum);
  const Stream stream;
  const auto logits = random_logits<T>(batch, classes, 99 + batch, quantum);
  auto labels = random_labels(batch, classes, 98 + batch);
  if (batch > 2) labels[1] = static_cast<std::int32_t>(classes);  // never counted
  const auto d_logits = tensor::to_device(logits);
  const auto d_labels = device_labels(labels);
  tensor::Tensor<unsigned long long, tensor::Cuda> counter(tensor::Shape{1});
  for (int k : {1, 2, 5}) {
    COLTRAIN_CHECK_CUDA(cudaMemset(counter.data(), 0, sizeof(unsigned long long)));
    cuda::topk_correct<T>(d_logits.view(), d_labels.view(), k, counter.data(), stream.get());
    // Twice: the counter accumulates.
    cuda::topk_correct<T>(d_logits.view(), d_labels.view(), k, counter.data(), stream.get());
    const auto got = tensor::to_host<unsigned long long>(counter.view(), stream.get()).data()[0];
    const std::int64_t expected =
        nn::topk_correct<T>(logits.view(), std::span<const std::int32_t>(labels), k);
    CHECK(got == static_cast<unsigned long long>(2 * expected));
  }
}

TEMPLATE_TEST_CASE("device top-k counts as nn::topk_correct, ties included", "[gpu][loss]", float,
                   half, bfloat16) {
  compare_topk<TestType>(1, 10, 0.0f);
  compare_topk<TestType>(77, 10, 0.0f);
  compare_topk<TestType>(77, 10, 2.0f);  // many ties: the lower index wins
  compare_topk<TestType>(300, 1000, 0.5f);
}

}  // namespace
