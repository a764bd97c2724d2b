#pragma once
// Softmax cross-entropy on the device: nn::SoftmaxCrossEntropy's loss, gradient and label
// smoothing for logits [batch, classes] (T) and int32 labels in device memory, and top-k counting.
//
// One warp per row: the row maximum, then sum exp(z - max) and sum (z - max), in float (so exp
// never overflows), then the row's loss and/or d(loss)/d(z) = scale * (softmax - target) / batch,
// with `scale` read from device memory (the loss scale of fp16 training) at run time. The mean loss
// stays on the device (mean_loss()), summed in double in a fixed order by the last block to finish,
// so a step never waits for it; read_loss() synchronises and reads it.
//
// A label outside [0, classes) reads nothing out of bounds: its row's loss is NaN, its gradient
// row zero, and the device records the first such sample. read_loss() (or check_labels()) then
// throws InvalidArgument naming the sample and label, as the CPU loss does at once.

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn/loss.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/cuda/launch.cuh>
#include <coltrain/cuda/reduce.cuh>
#include <coltrain/nn/loss.hpp>
#include <coltrain/tensor/cuda_storage.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace coltrain::cuda {
namespace detail {

inline constexpr int kRowsPerBlock = kThreadsPerBlock / 32;
inline constexpr unsigned long long kNoBadLabel = ~0ull;

// Device-side results and bookkeeping of one loss object.
struct CrossEntropyState {
  float mean_loss;
  unsigned int blocks_done;      // the last block to finish computes the mean and resets this
  unsigned long long bad_label;  // min over bad samples of (row << 32 | label bits); sticky
};

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

struct CrossEntropyArguments {
  std::int64_t batch;
  std::int64_t classes;
  float smoothing;     // e
  float off;           // e / classes: every class's share of the smoothed target
  float on;            // 1 - e + e / classes: the label's
  const float* scale;  // gradient scale in device memory; null for 1
  float* row_loss;     // [batch]
  CrossEntropyState* state;
};

template <class T, bool kLoss, bool kGrad>
__global__ void __launch_bounds__(kThreadsPerBlock)
    cross_entropy_kernel(const T* logits, const std::int32_t* labels, T* grad,
                         CrossEntropyArguments args) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (row < args.batch) {
    const T* z = logits + row * args.classes;
    float max = -INFINITY;
    for (std::int64_t j = lane; j < args.classes; j += 32) max = fmaxf(max, widen(z[j]));
    max = warp_max(max);
    float sum = 0.0f, sum_shifted = 0.0f;
    for (std::int64_t j = lane; j < args.classes; j += 32) {
      const float v = widen(z[j]) - max;
      sum += expf(v);
      sum_shifted += v;
    }
    sum = warp_sum(sum);
    sum_shifted = warp_sum(sum_shifted);
    const float log_sum = logf(sum);
    const std::int32_t label = labels[row];
    const bool valid = label >= 0 && label < args.classes;
    if (!valid && lane == 0) {
      atomicMin(&args.state->bad_label,
                (static_cast<unsigned long long>(row) << 32) | static_cast<std::uint32_t>(label));
    }
    if constexpr (kLoss) {
      if (lane == 0) {
        float loss = nanf("");
        if (valid) {
          const float label_logit = widen(z[label]) - max;
          // -sum_j q_j log p_j with log p_j = (z_j - max) - log_sum.
          loss = (1.0f - args.smoothing) * (log_sum - label_logit) +
                 args.off * (static_cast<float>(args.classes) * log_sum - sum_shifted);
        }
        args.row_loss[row] = loss;
      }
    }
    if constexpr (kGrad) {
      T* g = grad + row * args.classes;
      const float scale = args.scale != nullptr ? *args.scale : 1.0f;
      const float factor = scale / static_cast<float>(args.batch);
      for (std::int64_t j = lane; j < args.classes; j += 32) {
        const float p = expf(widen(z[j]) - max - log_sum);
        const float q = j == label ? args.on : args.off;
        g[j] = narrow<T>(valid ? (p - q) * factor : 0.0f);
      }
    }
  }
  if constexpr (kLoss) {
    // The last block to finish sums the rows: every thread's fence puts its row losses before the
    // block's ticket, and the last block reads them from L2.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      last = atomicAdd(&args.state->blocks_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    double total = 0.0;
    for (std::int64_t r = threadIdx.x; r < args.batch; r += blockDim.x) {
      total += static_cast<double>(__ldcg(args.row_loss + r));
    }
    total = block_reduce<SumOp>(total);
    if (threadIdx.x == 0) {
      args.state->mean_loss =
          args.batch == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(args.batch));
      args.state->blocks_done = 0;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    topk_correct_kernel(const T* logits, const std::int32_t* labels, std::int64_t batch,
                        std::int64_t classes, int k, unsigned long long* correct) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + static_cast<int>(threadIdx.x) / 32;
  double hit = 0.0;
  if (row < batch) {
    const std::int32_t label = labels[row];
    if (label >= 0 && label < classes) {  // a bad label cannot be among the top k (as the CPU)
      const T* z = logits + row * classes;
      const float target = widen(z[label]);
      // The label's rank: how many classes come before it in torch.topk's order (nn::ranks_above).
      float ahead = 0.0f;
      for (std::int64_t j = lane; j < classes; j += 32) {
        const float v = widen(z[j]);
        ahead += (nn::ranks_above(v, target) || (!nn::ranks_above(target, v) && j < label))
                     ? 1.0f
                     : 0.0f;
      }
      ahead = warp_sum(ahead);  // exact: counts below 2^24
      if (lane == 0 && ahead < static_cast<float>(k)) hit = 1.0;
    }
  }
  hit = block_reduce<SumOp>(hit);
  if (threadIdx.x == 0 && hit > 0.0) atomicAdd(correct, static_cast<unsigned long long>(hit));
}

inline void check_logits(const tensor::Shape& logits, std::int64_t labels, const char* what) {
  if (logits.rank() != 2) {
    throw InvalidArgument(std::string(what) + ": logits must be [batch, classes], got " +
                          logits.to_string());
  }
  if (labels != logits[0]) {
    throw InvalidArgument(std::string(what) + ": " + std::to_string(labels) +
                          " labels for a batch of " + std::to_string(logits[0]));
  }
  if (logits[0] > (std::int64_t{1} << 31) || logits[1] >= (std::int64_t{1} << 24)) {
    throw InvalidArgument(std::string(what) + ": logits " + logits.to_string() +
                          " exceed 2^31 samples or 2^24 classes");
  }
}

}  // namespace detail

// Adds to *correct (device memory) the number of samples whose label is among the k largest
// logits. Accumulates across calls without synchronising; the caller zeroes the counter.
template <class T>
void topk_correct(tensor::TensorView<const T, tensor::Cuda> logits,
                  tensor::TensorView<const std::int32_t, tensor::Cuda> labels, int k,
                  unsigned long long* correct, cudaStream_t stream) {
  detail::check_logits(logits.shape(), labels.numel(), "top-k accuracy");
  if (k < 1) throw InvalidArgument("top-k accuracy: k must be >= 1, got " + std::to_string(k));
  const std::int64_t batch = logits.extent(0);
  if (batch == 0) return;
  const auto blocks =
      static_cast<unsigned>((batch + detail::kRowsPerBlock - 1) / detail::kRowsPerBlock);
  detail::topk_correct_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(
      logits.data(), labels.data(), batch, logits.extent(1), k, correct);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

}  // namespace coltrain::cuda

namespace coltrain::nn {

// nn::SoftmaxCrossEntropy on the device. Not thread-safe; one object per stream of use. The first
// call at the largest batch allocates the per-row buffer; later calls allocate nothing, so they can
// be captured into a CUDA graph.
class DeviceSoftmaxCrossEntropy {
 public:
  // Throws InvalidArgument unless 0 <= label_smoothing <= 1 (the CPU loss's check).
  explicit DeviceSoftmaxCrossEntropy(double label_smoothing = 0.0)
      : smoothing_(SoftmaxCrossEntropy(label_smoothing).label_smoothing()), state_(1) {
    reset_bad_label(nullptr);
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(nullptr));
  }

  double label_smoothing() const { return smoothing_; }

  // The mean loss over the batch into mean_loss().
  template <class T>
  void forward(tensor::TensorView<const T, tensor::Cuda> logits,
               tensor::TensorView<const std::int32_t, tensor::Cuda> labels, cudaStream_t stream) {
    launch<T, true, false>(logits, labels, {}, nullptr, stream);
  }

  // grad_logits = scale * d(mean loss)/d(logits), scale read from *loss_scale (device memory) when
  // the step runs, or 1 for null. The mean loss is not computed.
  template <class T>
  void backward(tensor::TensorView<const T, tensor::Cuda> logits,
                tensor::TensorView<const std::int32_t, tensor::Cuda> labels,
                tensor::TensorView<T, tensor::Cuda> grad_logits, const float* loss_scale,
                cudaStream_t stream) {
    launch<T, false, true>(logits, labels, grad_logits, loss_scale, stream);
  }

  // Both in one kernel: what a training step uses.
  template <class T>
  void forward_backward(tensor::TensorView<const T, tensor::Cuda> logits,
                        tensor::TensorView<const std::int32_t, tensor::Cuda> labels,
                        tensor::TensorView<T, tensor::Cuda> grad_logits, const float* loss_scale,
                        cudaStream_t stream) {
    launch<T, true, true>(logits, labels, grad_logits, loss_scale, stream);
  }

  // The last forward's mean loss (one float in device memory), valid once `stream` reaches it:
  // copy it asynchronously to keep a history without waiting.
  const float* mean_loss() const { return &state_.data()->mean_loss; }

  // Waits for `stream`, then returns the mean loss. Throws InvalidArgument naming the first sample
  // with a label outside [0, classes) seen since the last check (and clears the record).
  float read_loss(cudaStream_t stream) {
    cuda::detail::CrossEntropyState host{};
    COLTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(&host, state_.data(), sizeof(host), cudaMemcpyDeviceToHost, stream));
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
    throw_if_bad_label(host.bad_label, stream);
    return host.mean_loss;
  }

  // Waits for `stream` and throws as read_loss() does; for steps that only ran backward().
  void check_labels(cudaStream_t stream) { static_cast<void>(read_loss(stream)); }

 private:
  template <class T, bool kLoss, bool kGrad>
  void launch(tensor::TensorView<const T, tensor::Cuda> logits,
              tensor::TensorView<const std::int32_t, tensor::Cuda> labels,
              tensor::TensorView<T, tensor::Cuda> grad, const float* loss_scale,
              cudaStream_t stream) {
    check_element_type<T>();
    cuda::detail::check_logits(logits.shape(), labels.numel(), "cross-entropy");
    if (kGrad && !(grad.shape() == logits.shape())) {
      throw InvalidArgument("cross-entropy: gradient shape " + grad.shape().to_string() +
                            " differs from the logits' " + logits.shape().to_string());
    }
    const std::int64_t batch = logits.extent(0);
    classes_ = logits.extent(1);
    if (kLoss) row_loss_.resize(tensor::Shape{batch});
    const double off = smoothing_ / static_cast<double>(classes_);
    const cuda::detail::CrossEntropyArguments args{batch,
                                                   classes_,
                                                   static_cast<float>(smoothing_),
                                                   static_cast<float>(off),
                                                   static_cast<float>(1.0 - smoothing_ + off),
                                                   loss_scale,
                                                   row_loss_.data(),
                                                   state_.data()};
    // One block even for an empty batch, so that the mean (0) is written.
    const auto blocks = static_cast<unsigned>(std::max<std::int64_t>(
        1, (batch + cuda::detail::kRowsPerBlock - 1) / cuda::detail::kRowsPerBlock));
    cuda::detail::cross_entropy_kernel<cuda::kernel_t<T>, kLoss, kGrad>
        <<<blocks, cuda::kThreadsPerBlock, 0, stream>>>(logits.data(), labels.data(), grad.data(),
                                                        args);
    COLTRAIN_CHECK_CUDA_LAUNCH();
  }

  template <class T>
  static void check_element_type() {
    static_assert(cuda::detail::kIsKernelElement<T> && !std::is_same_v<T, double>,
                  "coltrain::nn::DeviceSoftmaxCrossEntropy: logits are float, half or bfloat16");
  }

  void reset_bad_label(cudaStream_t stream) {
    COLTRAIN_CHECK_CUDA(
        cudaMemsetAsync(&state_.data()->bad_label, 0xff, sizeof(unsigned long long), stream));
  }

  void throw_if_bad_label(unsigned long long record, cudaStream_t stream) {
    if (record == cuda::detail::kNoBadLabel) return;
    reset_bad_label(stream);
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
    const auto sample = static_cast<std::int64_t>(record >> 32);
    const auto label = static_cast<std::int32_t>(static_cast<std::uint32_t>(record & 0xffffffffu));
    throw InvalidArgument("cross-entropy: label " + std::to_string(label) + " of sample " +
                          std::to_string(sample) + " is outside [0, " + std::to_string(classes_) +
                          ")");
  }

  double smoothing_;
  std::int64_t classes_ = 0;
  tensor::Storage<cuda::detail::CrossEntropyState, tensor::Cuda> state_;
  tensor::Tensor<float, tensor::Cuda> row_loss_;
};

}  // namespace coltrain::nn
