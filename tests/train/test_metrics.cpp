// ClassificationMetrics against values worked out by hand from scikit-learn's definitions
// (precision_recall_fscore_support with zero_division=0, macro average over the labels that occur),
// torch's ranking for top-k (ties to the lower index, NaN above everything), and the combination of
// ranks' counters by a sum-allreduce.

#include <catch2/catch.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/tensor/tensor.hpp>
#include <coltrain/train/metrics.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::Contains;
using coltrain::InvalidArgument;
using coltrain::train::ClassificationMetrics;

// Logits and labels, row by row.
struct Batch {
  std::vector<float> logits;
  std::vector<std::int32_t> labels;
  std::int64_t classes;

  coltrain::tensor::TensorView<const float> view() const {
    return {logits.data(), {static_cast<std::int64_t>(labels.size()), classes}};
  }
};

// Six samples of three classes. Predictions (arg-max, ties to the lower index):
//   label 0: [2, 1, 0] -> 0     [0, 3, 1] -> 1
//   label 1: [1, 2, 0] -> 1     [5, 5, 1] -> 0 (tie)
//   label 2: [0, 0, 4] -> 2     [1, 0, .5] -> 0
// Confusion (rows true): [1 1 0; 1 1 0; 1 0 1]. Predicted per class 3, 2, 1; support 2, 2, 2.
// precision 1/3, 1/2, 1; recall 1/2, 1/2, 1/2; F1 = 2tp/(support + predicted) = 2/5, 1/2, 2/3.
Batch first_part(std::int64_t classes = 3) {
  Batch b{{}, {0, 0}, classes};
  const std::vector<std::vector<float>> rows = {{2, 1, 0}, {0, 3, 1}};
  for (const auto& row : rows) {
    for (std::int64_t c = 0; c < classes; ++c) b.logits.push_back(c < 3 ? row[c] : -10.0f);
  }
  return b;
}

Batch second_part(std::int64_t classes = 3) {
  Batch b{{}, {1, 1, 2, 2}, classes};
  const std::vector<std::vector<float>> rows = {{1, 2, 0}, {5, 5, 1}, {0, 0, 4}, {1, 0, 0.5f}};
  for (const auto& row : rows) {
    for (std::int64_t c = 0; c < classes; ++c) b.logits.push_back(c < 3 ? row[c] : -10.0f);
  }
  return b;
}

void add(ClassificationMetrics& m, const Batch& b, double loss) {
  m.add_batch(b.view(), b.labels, loss);
}

void check_hand_example(const ClassificationMetrics& m) {
  CHECK(m.samples() == 6);
  // Batch losses 1.0 (2 samples) and 0.25 (4 samples): (2 + 1) / 6.
  CHECK(m.mean_loss() == Approx(0.5).epsilon(1e-15));
  CHECK(m.top1() == 0.5);
  const std::vector<std::vector<std::int64_t>> confusion = {{1, 1, 0}, {1, 1, 0}, {1, 0, 1}};
  for (int a = 0; a < 3; ++a) {
    for (int p = 0; p < 3; ++p) CHECK(m.confusion(a, p) == confusion[a][p]);
  }
  CHECK(m.precision(0) == Approx(1.0 / 3));
  CHECK(m.precision(1) == 0.5);
  CHECK(m.precision(2) == 1.0);
  for (int c = 0; c < 3; ++c) CHECK(m.recall(c) == 0.5);
  CHECK(m.f1(0) == Approx(0.4));
  CHECK(m.f1(1) == 0.5);
  CHECK(m.f1(2) == Approx(2.0 / 3));
  CHECK(m.macro_precision() == Approx(11.0 / 18).epsilon(1e-14));
  CHECK(m.macro_recall() == 0.5);
  CHECK(m.macro_f1() == Approx(47.0 / 90).epsilon(1e-14));
}

// Adds `other`'s counters, as a sum-allreduce over two ranks would.
struct TwoRankSum {
  std::vector<double> other;
  int calls = 0;
  void allreduce(std::span<double> values, coltrain::comm::ReduceOp op) {
    REQUIRE(op == coltrain::comm::ReduceOp::kSum);
    REQUIRE(values.size() == other.size());
    for (std::size_t i = 0; i < values.size(); ++i) values[i] += other[i];
    ++calls;
  }
};

}  // namespace

TEST_CASE("Metrics match hand-computed accuracy, confusion, precision, recall and F1",
          "[train][metrics]") {
  ClassificationMetrics m(3);
  add(m, first_part(), 1.0);
  add(m, second_part(), 0.25);
  check_hand_example(m);
  CHECK_FALSE(m.has_top5());
  CHECK_FALSE(m.top5().has_value());
  CHECK(m.support(2) == 2);
  CHECK(m.predicted(0) == 3);
}

TEST_CASE("Metrics average only over classes that occur, as scikit-learn's macro average",
          "[train][metrics]") {
  // Class 3 of 4 has neither samples nor predictions: excluded, so the averages are the 3-class
  // ones; its own scores are 0 (zero_division=0).
  ClassificationMetrics m(4);
  add(m, first_part(4), 1.0);
  add(m, second_part(4), 0.25);
  CHECK(m.macro_precision() == Approx(11.0 / 18).epsilon(1e-14));
  CHECK(m.macro_f1() == Approx(47.0 / 90).epsilon(1e-14));
  CHECK(m.precision(3) == 0.0);
  CHECK(m.recall(3) == 0.0);
  CHECK(m.f1(3) == 0.0);

  // A class with samples but no predictions counts, with precision 0: labels {0, 1}, both
  // predicted 0. Class 0: P 1/2, R 1, F1 2/3; class 1: P 0, R 0, F1 0.
  ClassificationMetrics never_predicted(2);
  const Batch b{{1, 0, 1, 0}, {0, 1}, 2};
  add(never_predicted, b, 0.0);
  CHECK(never_predicted.macro_precision() == 0.25);
  CHECK(never_predicted.macro_recall() == 0.5);
  CHECK(never_predicted.macro_f1() == Approx(1.0 / 3));
}

TEST_CASE("Top-5 ranks ties to the lower index and NaN above every number", "[train][metrics]") {
  ClassificationMetrics m(6);
  REQUIRE(m.has_top5());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Batch b{{0,   1,   2, 3, 4, 5,   //  label 0: five classes above it -> not top-5
                 0,   1,   2, 3, 4, 5,   //  label 1: four above -> top-5
                 1,   1,   1, 1, 1, 1,   //  label 5: five lower indices tie -> not top-5
                 1,   1,   1, 1, 1, 1,   //  label 4: four lower indices tie -> top-5
                 nan, 0,   9, 0, 0, 0,   // label 0: NaN is the arg-max -> top-1
                 0,   nan, 9, 0, 0, 0},  // label 2: the NaN ranks above 9 -> top-5, not top-1
                {0, 1, 5, 4, 0, 2},
                6};
  add(m, b, 0.0);
  CHECK(m.top1() == Approx(1.0 / 6));
  REQUIRE(m.top5().has_value());
  CHECK(*m.top5() == Approx(4.0 / 6));
  CHECK(m.confusion(0, 5) == 1);  // arg-max of 0..5
  CHECK(m.confusion(5, 0) == 1);  // all equal: the first
  CHECK(m.confusion(0, 0) == 1);  // NaN first
  CHECK(m.confusion(2, 1) == 1);  // NaN before the 9
}

TEST_CASE("Metrics accept 16-bit logits", "[train][metrics]") {
  std::vector<coltrain::half> logits;
  for (const float v : {0.5f, 2.0f, -1.0f, 3.0f, 0.0f, 1.0f}) logits.emplace_back(v);
  const std::vector<std::int32_t> labels = {1, 2};
  ClassificationMetrics m(3);
  m.add_batch(coltrain::tensor::TensorView<const coltrain::half>(logits.data(), {2, 3}), labels,
              1.0);
  CHECK(m.top1() == 0.5);
  CHECK(m.confusion(2, 0) == 1);
}

TEST_CASE("Counters from two ranks combine by a sum-allreduce", "[train][metrics]") {
  ClassificationMetrics rank0(3), rank1(3);
  add(rank0, first_part(), 1.0);
  add(rank1, second_part(), 0.25);
  TwoRankSum comm{std::vector<double>(rank1.counters().begin(), rank1.counters().end())};
  rank0.allreduce(comm);
  CHECK(comm.calls == 1);
  check_hand_example(rank0);

  // The same by merge(), and the layout of the contiguous counters.
  ClassificationMetrics merged(3);
  add(merged, first_part(), 1.0);
  merged.merge(rank1);
  check_hand_example(merged);
  CHECK(merged.counters().size() == 4 + 9);
  CHECK(merged.counters()[1] == 6);  // samples
  CHECK_THROWS_AS(merged.merge(ClassificationMetrics(4)), InvalidArgument);

  merged.reset();
  CHECK(merged.samples() == 0);
  CHECK(merged.top1() == 0.0);
  CHECK(merged.macro_f1() == 0.0);
}

TEST_CASE("Bad batches are rejected before anything is counted", "[train][metrics]") {
  ClassificationMetrics m(3);
  Batch b = first_part();
  b.labels[1] = 3;
  CHECK_THROWS_WITH(add(m, b, 1.0), Contains("label 3 of sample 1 is outside [0, 3)"));
  CHECK(m.samples() == 0);
  CHECK(m.confusion(0, 0) == 0);

  const Batch four_classes = first_part(4);
  CHECK_THROWS_WITH(add(m, four_classes, 1.0), Contains("[2, 4]"));
  CHECK_THROWS_AS(ClassificationMetrics(0), InvalidArgument);
  CHECK_THROWS_AS(m.precision(3), InvalidArgument);
}

TEST_CASE("The confusion matrix prints with rows as true classes", "[train][metrics]") {
  ClassificationMetrics m(3);
  add(m, first_part(), 1.0);
  add(m, second_part(), 0.25);
  for (int i = 0; i < 10; ++i) add(m, first_part(), 1.0);  // a two-digit cell: 11
  CHECK(m.format_confusion_matrix() ==
        "true \\ predicted   0   1   2\n"
        "0                 11  11   0\n"
        "1                  1   1   0\n"
        "2                  1   0   1\n");
  const std::vector<std::string> names = {"cat", "dog", "bird"};
  CHECK(m.format_confusion_matrix(names) ==
        "true \\ predicted   cat   dog  bird\n"
        "cat                 11    11     0\n"
        "dog                  1     1     0\n"
        "bird                 1     0     1\n");
  CHECK_THROWS_AS(m.format_confusion_matrix(std::span(names).first(2)), InvalidArgument);
}

TEST_CASE("The JSON summary holds the macro scores and, on request, the details",
          "[train][metrics]") {
  ClassificationMetrics m(3);
  add(m, first_part(), 1.0);
  add(m, second_part(), 0.25);
  const auto brief = m.to_json();
  CHECK(brief["samples"] == 6);
  CHECK(brief["top1"] == 0.5);
  CHECK(brief["top5"].is_null());
  CHECK(brief["recall"] == 0.5);
  CHECK_FALSE(brief.contains("confusion_matrix"));
  const auto full = m.to_json(true);
  CHECK(full["confusion_matrix"] == coltrain::Json::parse("[[1,1,0],[1,1,0],[1,0,1]]"));
  CHECK(full["per_class"]["support"] == coltrain::Json::parse("[2,2,2]"));
  CHECK(full["per_class"]["precision"][2] == 1.0);
}
