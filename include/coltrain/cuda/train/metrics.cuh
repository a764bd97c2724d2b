#pragma once
// DeviceClassificationCounters: train::ClassificationMetrics' counters (loss sum, samples, top-1
// and top-5 hits, confusion matrix) accumulated on the GPU, so that a training or validation pass
// never waits for the device; read_into() copies them to the host once, at the end of the pass.
//
// One warp per sample finds the predicted class and the label's rank in torch.topk's order
// (nn::ranks_above: NaN above every number, ties to the lower index), the rule of the CPU metrics,
// and adds whole numbers to double counters with atomics: sums of whole numbers below 2^53 are
// exact in any order, so the counts are deterministic. The loss sum adds each batch's mean loss
// times its size in stream order, one thread, as the CPU does.

#if !defined(__CUDACC__)
#error "coltrain/cuda/train/metrics.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/cuda/launch.cuh>
#include <coltrain/nn/loss.hpp>
#include <coltrain/tensor/cuda_storage.hpp>
#include <coltrain/tensor/tensor.hpp>
#include <coltrain/train/metrics.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace coltrain::cuda {
namespace detail {

inline constexpr int kMetricRowsPerBlock = kThreadsPerBlock / 32;

template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    classification_counts_kernel(const T* logits, const std::int32_t* labels, std::int64_t batch,
                                 std::int64_t classes, double* counters) {
  using Metrics = train::ClassificationMetrics;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kMetricRowsPerBlock +
                           static_cast<int>(threadIdx.x) / 32;
  if (row >= batch) return;  // whole warps leave together
  const std::int32_t label = labels[row];
  if (label < 0 || label >= classes) return;  // the loss reports it; nothing is counted
  const T* z = logits + row * classes;
  const float target = widen(z[label]);
  float best = widen(z[0]);
  std::int64_t predicted = 0;
  float ahead = 0.0f;
  for (std::int64_t j = lane; j < classes; j += 32) {
    const float v = widen(z[j]);
    if (nn::ranks_above(v, best) || (j < predicted && !nn::ranks_above(best, v))) {
      best = v;
      predicted = j;
    }
    ahead += (nn::ranks_above(v, target) || (!nn::ranks_above(target, v) && j < label)) ? 1.0f
                                                                                         : 0.0f;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, best, offset);
    const auto other_index = __shfl_xor_sync(0xffffffffu, predicted, offset);
    if (nn::ranks_above(other, best) || (!nn::ranks_above(best, other) && other_index < predicted)) {
      best = other;
      predicted = other_index;
    }
    ahead += __shfl_xor_sync(0xffffffffu, ahead, offset);  // exact: counts below 2^24
  }
  if (lane != 0) return;
  if (ahead == 0.0f) atomicAdd(counters + Metrics::kTop1, 1.0);
  if (classes >= Metrics::kTopK && ahead < static_cast<float>(Metrics::kTopK))
    atomicAdd(counters + Metrics::kTop5, 1.0);
  atomicAdd(counters + Metrics::kConfusion + label * classes + predicted, 1.0);
}

__global__ void add_loss_kernel(const float* mean_loss, std::int64_t batch, double* counters) {
  using Metrics = train::ClassificationMetrics;
  counters[Metrics::kLossSum] += static_cast<double>(*mean_loss) * static_cast<double>(batch);
  counters[Metrics::kSamples] += static_cast<double>(batch);
}

}  // namespace detail
}  // namespace coltrain::cuda

namespace coltrain::train {

class DeviceClassificationCounters {
 public:
  // Throws InvalidArgument unless classes >= 1 (as ClassificationMetrics).
  explicit DeviceClassificationCounters(int classes)
      : size_(ClassificationMetrics(classes).counters().size()), classes_(classes),
        counters_(size_) {}

  int classes() const { return classes_; }

  // Sets every counter to zero, on `stream`.
  void reset(cudaStream_t stream) {
    COLTRAIN_CHECK_CUDA(cudaMemsetAsync(counters_.data(), 0, size_ * sizeof(double), stream));
  }

  // Counts a batch: logits [B, classes] and B labels on the device, and its mean loss (one float
  // in device memory, e.g. DeviceSoftmaxCrossEntropy::mean_loss()), read when the batch runs.
  template <class T>
  void add_batch(tensor::TensorView<const T, tensor::Cuda> logits,
                 tensor::TensorView<const std::int32_t, tensor::Cuda> labels,
                 const float* mean_loss, cudaStream_t stream) {
    if (logits.shape().rank() != 2 || logits.extent(1) != classes_ ||
        logits.extent(0) != labels.numel()) {
      throw InvalidArgument("DeviceClassificationCounters: logits " + logits.shape().to_string() +
                            " and " + std::to_string(labels.numel()) + " labels do not match [" +
                            std::to_string(labels.numel()) + ", " + std::to_string(classes_) +
                            "]");
    }
    const std::int64_t batch = logits.extent(0);
    if (batch > 0) {
      const auto blocks = static_cast<unsigned>((batch + cuda::detail::kMetricRowsPerBlock - 1) /
                                                cuda::detail::kMetricRowsPerBlock);
      cuda::detail::classification_counts_kernel<cuda::kernel_t<T>>
          <<<blocks, cuda::kThreadsPerBlock, 0, stream>>>(logits.data(), labels.data(), batch,
                                                          classes_, counters_.data());
      COLTRAIN_CHECK_CUDA_LAUNCH();
    }
    cuda::detail::add_loss_kernel<<<1, 1, 0, stream>>>(mean_loss, batch, counters_.data());
    COLTRAIN_CHECK_CUDA_LAUNCH();
  }

  // Waits for `stream`, then adds the counts to `metrics` (which must have as many classes).
  void read_into(ClassificationMetrics& metrics, cudaStream_t stream) const {
    if (metrics.classes() != classes_) {
      throw InvalidArgument("DeviceClassificationCounters: metrics of " +
                            std::to_string(metrics.classes()) + " classes, counters of " +
                            std::to_string(classes_));
    }
    std::vector<double> host(size_);
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(host.data(), counters_.data(), size_ * sizeof(double),
                                        cudaMemcpyDeviceToHost, stream));
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
    const std::span<double> into = metrics.counters();
    for (std::size_t i = 0; i < size_; ++i) into[i] += host[i];
  }

 private:
  std::size_t size_;
  int classes_;
  tensor::Storage<double, tensor::Cuda> counters_;
};

}  // namespace coltrain::train
