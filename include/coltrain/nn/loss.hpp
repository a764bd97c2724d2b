#pragma once
// Softmax cross-entropy on logits [batch, classes] with integer labels, computed stably (log-sum-exp
// after subtracting the row maximum), with optional label smoothing as torch.nn.CrossEntropyLoss
// (label_smoothing = e: the target is (1 - e) one-hot + e / classes). The loss is the batch mean.
// Also top-k accuracy, counted the way torch.topk ranks ties (the lower index wins).

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/nn/compute_precision.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>

namespace coltrain::nn {

class SoftmaxCrossEntropy {
 public:
  explicit SoftmaxCrossEntropy(double label_smoothing = 0.0) : smoothing_(label_smoothing) {
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
      throw InvalidArgument("label smoothing must lie in [0, 1], got " + std::to_string(label_smoothing));
  }

  double label_smoothing() const { return smoothing_; }

  // The mean loss over the batch.
  template <class T>
  double loss(tensor::TensorView<const T> logits, std::span<const std::int32_t> labels) const {
    return evaluate(logits, labels, tensor::TensorView<T>{}, 1.0);
  }

  // The mean loss, and grad_logits = scale * d(mean loss)/d(logits); `scale` is the loss scale of
  // mixed-precision training (1 otherwise).
  template <class T>
  double loss_and_grad(tensor::TensorView<const T> logits, std::span<const std::int32_t> labels,
                       tensor::TensorView<T> grad_logits, double scale = 1.0) const {
    if (!(grad_logits.shape() == logits.shape()))
      throw InvalidArgument("cross-entropy: gradient shape " + grad_logits.shape().to_string() +
                            " differs from the logits' " + logits.shape().to_string());
    return evaluate(logits, labels, grad_logits, scale);
  }

 private:
  template <class T>
  double evaluate(tensor::TensorView<const T> logits, std::span<const std::int32_t> labels,
                  tensor::TensorView<T> grad, double scale) const {
    using S = compute_t<T>;
    if (logits.shape().rank() != 2)
      throw InvalidArgument("cross-entropy: logits must be [batch, classes], got " +
                            logits.shape().to_string());
    const std::int64_t batch = logits.extent(0);
    const std::int64_t classes = logits.extent(1);
    if (static_cast<std::int64_t>(labels.size()) != batch)
      throw InvalidArgument("cross-entropy: " + std::to_string(labels.size()) + " labels for a batch of " +
                            std::to_string(batch));
    if (batch == 0) return 0.0;
    const T* z = logits.data();
    const double off = smoothing_ / static_cast<double>(classes);
    const double on = 1.0 - smoothing_ + off;
    double total = 0.0;
    for (std::int64_t r = 0; r < batch; ++r) {
      const std::int32_t label = labels[static_cast<std::size_t>(r)];
      if (label < 0 || label >= classes)
        throw InvalidArgument("cross-entropy: label " + std::to_string(label) + " of sample " +
                              std::to_string(r) + " is outside [0, " + std::to_string(classes) + ")");
      const T* row = z + r * classes;
      double max = -INFINITY;
      for (std::int64_t j = 0; j < classes; ++j)
        max = std::fmax(max, static_cast<double>(detail::to_compute_value<S>(row[j])));
      double sum = 0.0, sum_logits = 0.0;
      for (std::int64_t j = 0; j < classes; ++j) {
        const double v = static_cast<double>(detail::to_compute_value<S>(row[j])) - max;
        sum += std::exp(v);
        sum_logits += v;
      }
      const double log_sum = std::log(sum);
      const double label_logit = static_cast<double>(detail::to_compute_value<S>(row[label])) - max;
      // -sum_j q_j log p_j with log p_j = v_j - log_sum.
      total += (1.0 - smoothing_) * (log_sum - label_logit) +
               off * (static_cast<double>(classes) * log_sum - sum_logits);
      if (!grad.empty()) {
        T* g = grad.data() + r * classes;
        const double factor = scale / static_cast<double>(batch);
        for (std::int64_t j = 0; j < classes; ++j) {
          const double p =
              std::exp(static_cast<double>(detail::to_compute_value<S>(row[j])) - max - log_sum);
          const double q = j == label ? on : off;
          g[j] = detail::to_storage_value<T>(static_cast<S>((p - q) * factor));
        }
      }
    }
    return total / static_cast<double>(batch);
  }

  double smoothing_;
};

// Whether logit a comes before logit b in torch.topk's order: NaN above every number, equal values
// tied (ties then go to the lower index). One rule for topk_correct, its GPU kernel and
// train::ClassificationMetrics, so that every accuracy coltrain reports agrees with PyTorch's.
template <class S>
COLTRAIN_HOST_DEVICE constexpr bool ranks_above(S a, S b) {
  return a != a ? b == b : a > b;  // x != x: x is NaN (std::isnan is not usable on the device)
}

// How many samples have their label among the k largest logits (torch.topk's order, ranks_above).
template <class T>
std::int64_t topk_correct(tensor::TensorView<const T> logits, std::span<const std::int32_t> labels,
                          int k) {
  using S = compute_t<T>;
  if (logits.shape().rank() != 2 || static_cast<std::int64_t>(labels.size()) != logits.extent(0))
    throw InvalidArgument("top-k accuracy: logits " + logits.shape().to_string() + " do not match " +
                          std::to_string(labels.size()) + " labels");
  const std::int64_t classes = logits.extent(1);
  std::int64_t correct = 0;
  for (std::int64_t r = 0; r < logits.extent(0); ++r) {
    const T* row = logits.data() + r * classes;
    const std::int32_t label = labels[static_cast<std::size_t>(r)];
    if (label < 0 || label >= classes) continue;  // cannot be among the top k
    const S target = detail::to_compute_value<S>(row[label]);
    // The label's rank: how many classes beat it (ties go to the lower index).
    std::int64_t ahead = 0;
    for (std::int64_t j = 0; j < classes; ++j) {
      const S v = detail::to_compute_value<S>(row[j]);
      ahead += (ranks_above(v, target) || (!ranks_above(target, v) && j < label)) ? 1 : 0;
    }
    correct += ahead < k ? 1 : 0;
  }
  return correct;
}

}  // namespace coltrain::nn
