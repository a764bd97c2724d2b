#pragma once
// Classification metrics accumulated batch by batch: mean loss, top-1 and top-5 accuracy, the
// K x K confusion matrix and, from it, per-class and macro-averaged precision, recall and F1.
//
// Every counter is a double in one contiguous array (exact for counts below 2^53), so that a
// data-parallel evaluation combines the ranks' shares with a single sum-allreduce:
//
//   ClassificationMetrics metrics(10);
//   for (batch : my_shard) metrics.add_batch(logits, labels, loss);
//   metrics.allreduce(comm);              // every rank now holds the whole validation set's counts
//
// Predictions are the arg-max of each row with ties going to the lower index, and NaN ranking
// above every number, as torch.argmax and torch.topk rank them.
//
// Precision, recall and F1 follow scikit-learn's definitions with zero_division=0: a class with no
// predictions has precision 0, one with no samples has recall 0, and F1 = 2 tp / (2 tp + fp + fn),
// 0 when a class has neither. The macro averages are taken over the classes that occur among the
// labels or the predictions, so they equal sklearn.metrics.precision_recall_fscore_support(y_true,
// y_pred, average="macro", zero_division=0) on the same samples.

#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/nn/loss.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace coltrain::train {

// Anything that sums a span of doubles across ranks in place (comm::Communicator does).
template <class C>
concept SumAllreducer = requires(C& comm, std::span<double> values) {
  comm.allreduce(values, comm::ReduceOp::kSum);
};

class ClassificationMetrics {
 public:
  // Top-5 accuracy is counted only with at least this many classes.
  static constexpr int kTopK = 5;
  // Where each count sits in counters() (the device accumulator fills the same layout).
  static constexpr std::size_t kLossSum = 0, kSamples = 1, kTop1 = 2, kTop5 = 3, kConfusion = 4;

  // Throws InvalidArgument unless classes >= 1.
  explicit ClassificationMetrics(int classes) : classes_(classes) {
    if (classes < 1) {
      throw InvalidArgument("ClassificationMetrics: the number of classes must be >= 1, not " +
                            std::to_string(classes));
    }
    const auto k = static_cast<std::size_t>(classes);
    counters_.assign(kConfusion + k * k, 0.0);
  }

  int classes() const { return classes_; }
  bool has_top5() const { return classes_ >= kTopK; }

  // Adds a batch: logits [B, K] (any floating storage type), B labels in [0, K), and the batch's
  // mean loss as the caller computed it (weighted by B, so batches of different sizes average
  // correctly). Throws InvalidArgument for a shape mismatch or a label out of range, before
  // anything is counted.
  template <class T>
  void add_batch(tensor::TensorView<const T> logits, std::span<const std::int32_t> labels,
                 double mean_loss) {
    if (logits.shape().rank() != 2 || logits.extent(1) != classes_ ||
        logits.extent(0) != static_cast<std::int64_t>(labels.size())) {
      throw InvalidArgument("ClassificationMetrics: logits " + logits.shape().to_string() +
                            " and " + std::to_string(labels.size()) + " labels do not match [" +
                            std::to_string(labels.size()) + ", " + std::to_string(classes_) + "]");
    }
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (labels[i] < 0 || labels[i] >= classes_) {
        throw InvalidArgument("ClassificationMetrics: label " + std::to_string(labels[i]) +
                              " of sample " + std::to_string(i) + " is outside [0, " +
                              std::to_string(classes_) + ")");
      }
    }
    const std::int64_t batch = logits.extent(0);
    const auto k = static_cast<std::size_t>(classes_);
    for (std::int64_t r = 0; r < batch; ++r) {
      const T* row = logits.data() + r * classes_;
      const auto label = static_cast<std::size_t>(labels[static_cast<std::size_t>(r)]);
      const double target = as_double(row[label]);
      std::size_t predicted = 0;
      double best = as_double(row[0]);
      // The label's rank: how many classes come before it in torch.topk's order.
      std::size_t ahead = 0;
      for (std::size_t j = 0; j < k; ++j) {
        const double v = as_double(row[j]);
        if (nn::ranks_above(v, best)) {
          best = v;
          predicted = j;
        }
        ahead += (nn::ranks_above(v, target) || (!nn::ranks_above(target, v) && j < label)) ? 1 : 0;
      }
      counters_[kTop1] += ahead == 0 ? 1.0 : 0.0;
      if (has_top5()) counters_[kTop5] += ahead < kTopK ? 1.0 : 0.0;
      counters_[kConfusion + label * k + predicted] += 1.0;
    }
    counters_[kLossSum] += mean_loss * static_cast<double>(batch);
    counters_[kSamples] += static_cast<double>(batch);
  }

  void reset() { std::ranges::fill(counters_, 0.0); }

  // All counters, contiguous: [loss sum, samples, top-1 hits, top-5 hits, confusion matrix
  // (row-major, rows = true class)]. Summing it element-wise across ranks gives the metrics of
  // all their samples together.
  std::span<double> counters() { return counters_; }
  std::span<const double> counters() const { return counters_; }

  // Sums the counters across ranks in place with comm.allreduce(std::span<double>, kSum).
  template <SumAllreducer C>
  void allreduce(C& comm) {
    comm.allreduce(std::span<double>(counters_), comm::ReduceOp::kSum);
  }

  // Adds another accumulator's counts (a rank's share combined by hand, or a second pass).
  // Throws InvalidArgument if the class counts differ.
  void merge(const ClassificationMetrics& other) {
    if (other.classes_ != classes_) {
      throw InvalidArgument("ClassificationMetrics: cannot merge metrics of " +
                            std::to_string(other.classes_) + " classes into " +
                            std::to_string(classes_));
    }
    for (std::size_t i = 0; i < counters_.size(); ++i) counters_[i] += other.counters_[i];
  }

  std::int64_t samples() const { return count(counters_[kSamples]); }

  // The sample-weighted mean of the batches' losses; 0 before any sample.
  double mean_loss() const { return ratio(counters_[kLossSum], counters_[kSamples]); }
  // Fractions in [0, 1]; 0 before any sample.
  double top1() const { return ratio(counters_[kTop1], counters_[kSamples]); }
  // nullopt with fewer than five classes.
  std::optional<double> top5() const {
    if (!has_top5()) return std::nullopt;
    return ratio(counters_[kTop5], counters_[kSamples]);
  }

  // Samples of class `actual` predicted as `predicted`. Throws InvalidArgument out of range.
  std::int64_t confusion(int actual, int predicted) const {
    check_class(actual, "actual");
    check_class(predicted, "predicted");
    return count(cell(static_cast<std::size_t>(actual), static_cast<std::size_t>(predicted)));
  }

  // Samples whose label is `c` (the row sum), and samples predicted as `c` (the column sum).
  std::int64_t support(int c) const {
    check_class(c, "class");
    return count(row_sum(static_cast<std::size_t>(c)));
  }
  std::int64_t predicted(int c) const {
    check_class(c, "class");
    return count(column_sum(static_cast<std::size_t>(c)));
  }

  // Per class, with zero_division = 0 (see the top of this header).
  double precision(int c) const {
    check_class(c, "class");
    const auto i = static_cast<std::size_t>(c);
    return ratio(cell(i, i), column_sum(i));
  }
  double recall(int c) const {
    check_class(c, "class");
    const auto i = static_cast<std::size_t>(c);
    return ratio(cell(i, i), row_sum(i));
  }
  double f1(int c) const {
    check_class(c, "class");
    const auto i = static_cast<std::size_t>(c);
    return ratio(2.0 * cell(i, i), row_sum(i) + column_sum(i));
  }

  // Means over the classes present among labels or predictions; 0 before any sample.
  double macro_precision() const {
    return macro([&](int c) { return precision(c); });
  }
  double macro_recall() const {
    return macro([&](int c) { return recall(c); });
  }
  double macro_f1() const {
    return macro([&](int c) { return f1(c); });
  }

  // The matrix as text, rows = true class, columns = predicted class, right-aligned. Class names
  // label rows and columns when given (one per class), else the class indices. Throws
  // InvalidArgument for a wrong number of names.
  std::string format_confusion_matrix(std::span<const std::string> class_names = {}) const {
    const auto k = static_cast<std::size_t>(classes_);
    if (!class_names.empty() && class_names.size() != k) {
      throw InvalidArgument("ClassificationMetrics: " + std::to_string(class_names.size()) +
                            " class names for " + std::to_string(classes_) + " classes");
    }
    std::vector<std::string> names(k);
    for (std::size_t c = 0; c < k; ++c) {
      names[c] = class_names.empty() ? std::to_string(c) : class_names[c];
    }
    std::size_t label_width = std::string_view("true \\ predicted").size();
    std::size_t width = 1;
    for (std::size_t c = 0; c < k; ++c) {
      label_width = std::max(label_width, names[c].size());
      width = std::max(width, names[c].size());
      for (std::size_t p = 0; p < k; ++p) {
        width = std::max(width, std::to_string(count(cell(c, p))).size());
      }
    }
    auto pad_left = [](const std::string& text, std::size_t w) {
      return std::string(w > text.size() ? w - text.size() : 0, ' ') + text;
    };
    auto pad_right = [](const std::string& text, std::size_t w) {
      return text + std::string(w > text.size() ? w - text.size() : 0, ' ');
    };
    std::string out = pad_right("true \\ predicted", label_width);
    for (std::size_t p = 0; p < k; ++p) out += "  " + pad_left(names[p], width);
    out += '\n';
    for (std::size_t c = 0; c < k; ++c) {
      out += pad_right(names[c], label_width);
      for (std::size_t p = 0; p < k; ++p) {
        out += "  " + pad_left(std::to_string(count(cell(c, p))), width);
      }
      out += '\n';
    }
    return out;
  }

  // The summary a run log records: samples, loss, top1, top5 (null below five classes), macro
  // precision, recall and f1, and, with `with_details`, per-class lists and the confusion matrix
  // (rows = true class).
  Json to_json(bool with_details = false) const {
    Json out;
    out["samples"] = samples();
    out["loss"] = mean_loss();
    out["top1"] = top1();
    out["top5"] = top5();  // null below five classes
    out["precision"] = macro_precision();
    out["recall"] = macro_recall();
    out["f1"] = macro_f1();
    if (!with_details) return out;
    Json per_class;
    std::vector<double> precisions, recalls, f1s;
    std::vector<std::int64_t> supports;
    std::vector<std::vector<std::int64_t>> matrix;
    for (int c = 0; c < classes_; ++c) {
      precisions.push_back(precision(c));
      recalls.push_back(recall(c));
      f1s.push_back(f1(c));
      supports.push_back(support(c));
      std::vector<std::int64_t> row;
      for (int p = 0; p < classes_; ++p) row.push_back(confusion(c, p));
      matrix.push_back(std::move(row));
    }
    per_class["precision"] = precisions;
    per_class["recall"] = recalls;
    per_class["f1"] = f1s;
    per_class["support"] = supports;
    out["per_class"] = std::move(per_class);
    out["confusion_matrix"] = std::move(matrix);
    return out;
  }

 private:

  template <class T>
  static double as_double(T value) {
    if constexpr (std::is_floating_point_v<T>) {
      return static_cast<double>(value);
    } else {
      return static_cast<double>(static_cast<float>(value));  // half, bfloat16
    }
  }

  static double ratio(double numerator, double denominator) {
    return denominator == 0.0 ? 0.0 : numerator / denominator;
  }
  static std::int64_t count(double value) { return static_cast<std::int64_t>(value); }

  void check_class(int c, const char* what) const {
    if (c < 0 || c >= classes_) {
      throw InvalidArgument("ClassificationMetrics: " + std::string(what) + " " +
                            std::to_string(c) + " is outside [0, " + std::to_string(classes_) +
                            ")");
    }
  }

  double cell(std::size_t actual, std::size_t predicted) const {
    return counters_[kConfusion + actual * static_cast<std::size_t>(classes_) + predicted];
  }
  double row_sum(std::size_t c) const {
    double sum = 0;
    for (std::size_t p = 0; p < static_cast<std::size_t>(classes_); ++p) sum += cell(c, p);
    return sum;
  }
  double column_sum(std::size_t c) const {
    double sum = 0;
    for (std::size_t a = 0; a < static_cast<std::size_t>(classes_); ++a) sum += cell(a, c);
    return sum;
  }

  template <class PerClass>
  double macro(PerClass&& per_class) const {
    double sum = 0;
    int present = 0;
    for (int c = 0; c < classes_; ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (row_sum(i) == 0.0 && column_sum(i) == 0.0) continue;
      sum += per_class(c);
      ++present;
    }
    return present == 0 ? 0.0 : sum / present;
  }

  int classes_;
  std::vector<double> counters_;
};

}  // namespace coltrain::train
