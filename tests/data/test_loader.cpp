// The prefetching Loader (coltrain/data/loader.hpp): its batches equal a straightforward serial
// computation with and without the background thread, and errors and shutdown behave.

#include <catch2/catch.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/loader.hpp>

#include <atomic>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "data_test_helpers.hpp"

namespace {

namespace data = coltrain::data;
using coltrain::testing::synthetic_dataset;
using data::Batch;
using data::DistributedSampler;
using data::ImageShape;
using data::Loader;

constexpr ImageShape kShape{3, 8, 8};

// What the loader must produce for one batch, computed directly.
struct Expected {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  std::vector<std::int64_t> indices;
};

template <class Transform>
std::vector<Expected> serial_batches(const data::ImageDataset& set,
                                     const std::vector<std::int64_t>& order,
                                     std::int64_t batch_size, bool drop_last,
                                     const Transform& transform, std::uint64_t epoch) {
  std::vector<Expected> batches;
  const std::size_t sample = static_cast<std::size_t>(transform.output_shape(kShape).size());
  for (std::size_t begin = 0; begin < order.size(); begin += static_cast<std::size_t>(batch_size)) {
    const std::size_t end = std::min(order.size(), begin + static_cast<std::size_t>(batch_size));
    if (drop_last && end - begin < static_cast<std::size_t>(batch_size)) break;
    Expected b;
    for (std::size_t k = begin; k < end; ++k) {
      std::vector<float> out(sample);
      transform.apply(set.image(order[k]), kShape, {epoch, order[k]}, out);
      b.images.insert(b.images.end(), out.begin(), out.end());
      b.labels.push_back(set.label(order[k]));
      b.indices.push_back(order[k]);
    }
    batches.push_back(std::move(b));
  }
  return batches;
}

template <class T, class Transform>
void check_epoch(Loader<T, Transform>& loader, const std::vector<Expected>& expected,
                 std::uint64_t epoch) {
  loader.start_epoch(epoch);
  std::size_t count = 0;
  while (const Batch<T>* batch = loader.next()) {
    REQUIRE(count < expected.size());
    const Expected& e = expected[count];
    const auto n = static_cast<std::int64_t>(e.labels.size());
    CHECK(batch->number == static_cast<std::int64_t>(count));
    CHECK(batch->images.shape() == loader.sample_shape().batch(n));
    CHECK(batch->labels == e.labels);
    CHECK(batch->indices == e.indices);
    std::vector<T> want;
    for (const float v : e.images) want.push_back(static_cast<T>(v));
    const std::span<const T> got = batch->images.span();
    bool equal = got.size() == want.size();
    for (std::size_t i = 0; equal && i < want.size(); ++i) {
      if constexpr (std::is_same_v<T, float>) {
        equal = got[i] == want[i];
      } else {
        equal = got[i].bits() == want[i].bits();
      }
    }
    CHECK(equal);
    ++count;
  }
  CHECK(count == expected.size());
  CHECK(static_cast<std::int64_t>(count) == loader.batches_per_epoch());
  CHECK(loader.next() == nullptr);  // stays at the end
}

TEST_CASE("loader batches equal a serial computation, with and without prefetching", "[loader]") {
  const data::ImageDataset set = synthetic_dataset(37, kShape);
  const int prefetch = GENERATE(0, 1, 3);
  const bool drop_last = GENERATE(false, true);
  INFO("prefetch " << prefetch << ", drop_last " << drop_last);
  const data::ImageTransform transform{.normalization = {{0.5f, 0.4f, 0.3f}, {0.2f, 0.3f, 0.4f}},
                                       .crop = 6,
                                       .padding = 1,
                                       .flip_probability = 0.5,
                                       .seed = 3};

  SECTION("distributed sampler: rank 1 of 2, shuffled, a new order each epoch") {
    const data::DistributedSamplerOptions options{.num_replicas = 2, .rank = 1, .seed = 8};
    Loader<float> loader(set, DistributedSampler(set.size(), options),
                         {.batch_size = 8, .drop_last = drop_last, .prefetch = prefetch},
                         transform);
    CHECK(loader.batches_per_epoch() == (drop_last ? 2 : 3));  // 19 samples: 8, 8 and 3
    for (const std::uint64_t epoch : {0u, 1u, 5u}) {
      DistributedSampler sampler(set.size(), options);
      sampler.set_epoch(epoch);
      check_epoch(loader, serial_batches(set, sampler.indices(), 8, drop_last, transform, epoch),
                  epoch);
    }
  }
  SECTION("fixed order, for evaluation") {
    const std::vector<std::int64_t> order = {36, 0, 5, 5, 12, 1, 30};
    Loader<float> loader(
        set, order, {.batch_size = 3, .drop_last = drop_last, .prefetch = prefetch}, transform);
    check_epoch(loader, serial_batches(set, order, 3, drop_last, transform, 4), 4);
  }
}

TEST_CASE("half and bfloat16 batches are the float batches rounded", "[loader]") {
  const data::ImageDataset set = synthetic_dataset(10, kShape);
  data::ImageTransform transform = data::cifar10_train_transform(4);
  transform.crop = 8;
  transform.padding = 2;
  std::vector<std::int64_t> order(10);
  for (std::int64_t i = 0; i < 10; ++i) order[static_cast<std::size_t>(i)] = 9 - i;
  const auto expected = serial_batches(set, order, 4, false, transform, 2);
  Loader<coltrain::half> half_loader(set, order, {.batch_size = 4}, transform);
  check_epoch(half_loader, expected, 2);
  Loader<coltrain::bfloat16> bf16_loader(set, order, {.batch_size = 4, .prefetch = 0}, transform);
  check_epoch(bf16_loader, expected, 2);
}

// Throws for one sample in epoch 0 only.
struct FailingTransform {
  std::int64_t bad_index;
  data::ImageShape output_shape(data::ImageShape s) const { return s; }
  void apply(std::span<const std::uint8_t> image, data::ImageShape, data::SampleKey key,
             std::span<float> out) const {
    if (key.epoch == 0 && key.index == bad_index)
      throw std::runtime_error("bad sample " + std::to_string(key.index));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = image[i];
  }
};
static_assert(data::SampleTransform<FailingTransform>);

TEST_CASE("an exception while preparing a batch reaches the caller in batch order", "[loader]") {
  const data::ImageDataset set = synthetic_dataset(20, kShape);
  std::vector<std::int64_t> order(20);
  for (std::int64_t i = 0; i < 20; ++i) order[static_cast<std::size_t>(i)] = i;
  const int prefetch = GENERATE(0, 2);
  Loader<float, FailingTransform> loader(set, order, {.batch_size = 4, .prefetch = prefetch},
                                         FailingTransform{13});
  loader.start_epoch(0);
  for (int b = 0; b < 3; ++b) {  // samples 0..11 are fine
    const Batch<float>* batch = loader.next();
    REQUIRE(batch != nullptr);
    CHECK(batch->number == b);
  }
  CHECK_THROWS_WITH(loader.next(), "bad sample 13");
  CHECK_THROWS_WITH(loader.next(), "bad sample 13");  // the epoch stays failed
  // A new epoch starts clean.
  loader.start_epoch(1);
  int batches = 0;
  while (loader.next() != nullptr) ++batches;
  CHECK(batches == 5);
}

TEST_CASE("restarting or destroying a loader in the middle of an epoch", "[loader]") {
  const data::ImageDataset set = synthetic_dataset(64, kShape);
  const data::ImageTransform transform;
  const DistributedSampler sampler(set.size(), {.seed = 1});
  for (int round = 0; round < 20; ++round) {
    Loader<float> loader(set, sampler, {.batch_size = 2, .prefetch = 1 + round % 3}, transform);
    loader.start_epoch(0);
    if (round % 2 == 0) REQUIRE(loader.next() != nullptr);
    // The worker is blocked on a full queue, or still filling: both must stop.
  }
  Loader<float> loader(set, sampler, {.batch_size = 16}, transform);
  loader.start_epoch(3);
  const Batch<float>* first = loader.next();
  REQUIRE(first != nullptr);
  const std::vector<std::int64_t> first_indices = first->indices;
  REQUIRE(loader.next() != nullptr);
  loader.start_epoch(3);  // back to the start of the same epoch
  first = loader.next();
  REQUIRE(first != nullptr);
  CHECK(first->number == 0);
  CHECK(first->indices == first_indices);
}

TEST_CASE("loader misuse is an error", "[loader]") {
  using Catch::Matchers::Contains;
  const data::ImageDataset set = synthetic_dataset(10, kShape);
  Loader<float> loader(set, std::vector<std::int64_t>{0, 1}, {.batch_size = 1});
  CHECK_THROWS_WITH(loader.next(), Contains("before start_epoch()"));
  CHECK_THROWS_WITH(Loader<float>(set, DistributedSampler(11), {}),
                    Contains("the sampler was made for 11 samples but the dataset holds 10"));
  CHECK_THROWS_WITH(Loader<float>(set, std::vector<std::int64_t>{3, 10}, {}),
                    Contains("index 10 in the order is outside the dataset of 10"));
  CHECK_THROWS_WITH(Loader<float>(set, std::vector<std::int64_t>{}, {.batch_size = 0}),
                    Contains("batch_size is 0"));
  CHECK_THROWS_WITH(Loader<float>(set, DistributedSampler(10), {}, data::mnist_transform()),
                    Contains("normalization has 1 means"));
}

TEST_CASE("an empty epoch yields no batches", "[loader]") {
  const data::ImageDataset set = synthetic_dataset(3, kShape);
  Loader<float> loader(set, DistributedSampler(3, {.num_replicas = 4, .drop_last = true}),
                       {.batch_size = 2});
  loader.start_epoch(0);
  CHECK(loader.next() == nullptr);
  CHECK(loader.batches_per_epoch() == 0);
}

}  // namespace

TEST_CASE("an epoch over a given order, and a fixed order replaced", "[loader]") {
  using Catch::Matchers::Contains;
  const data::ImageDataset set = synthetic_dataset(30, kShape);
  const data::ImageTransform transform;
  const int prefetch = GENERATE(0, 2);
  // Elastic training's rest of an epoch: the given order for this epoch, the sampler's after it.
  Loader<float> loader(set, DistributedSampler(set.size(), {.seed = 5}),
                       {.batch_size = 4, .prefetch = prefetch}, transform);
  loader.start_epoch(2, {7, 3, 29, 0, 11});
  CHECK(loader.batches_this_epoch() == 2);
  std::vector<std::int64_t> seen;
  while (const Batch<float>* batch = loader.next())
    seen.insert(seen.end(), batch->indices.begin(), batch->indices.end());
  CHECK(seen == std::vector<std::int64_t>{7, 3, 29, 0, 11});
  loader.start_epoch(3);
  CHECK(loader.batches_this_epoch() == 8);  // the sampler's 30 samples again
  CHECK_THROWS_WITH(loader.start_epoch(4, {30}), Contains("index 30"));
  CHECK_THROWS_WITH(loader.set_order({1}), Contains("its sampler's"));

  // A validation shard replaced after the ranks changed.
  Loader<float> fixed(set, std::vector<std::int64_t>{0, 2, 4}, {.batch_size = 2}, transform);
  fixed.set_order({1, 4, 7, 10});
  CHECK_THROWS_WITH(fixed.next(), Contains("before start_epoch()"));
  fixed.start_epoch(0);
  std::vector<std::int64_t> shard;
  while (const Batch<float>* batch = fixed.next())
    shard.insert(shard.end(), batch->indices.begin(), batch->indices.end());
  CHECK(shard == std::vector<std::int64_t>{1, 4, 7, 10});
}

TEST_CASE("a batch size changed between epochs", "[loader]") {
  using Catch::Matchers::Contains;
  const data::ImageDataset set = synthetic_dataset(30, kShape);
  const data::ImageTransform transform;
  const int prefetch = GENERATE(0, 2);
  // Deterministic elastic training: a rank's block of the global batch doubles when half the
  // ranks leave, in the middle of an epoch started with the old size.
  Loader<float> loader(set, DistributedSampler(set.size(), {.seed = 5}),
                       {.batch_size = 4, .prefetch = prefetch}, transform);
  const std::vector<std::int64_t> order{7, 3, 29, 0, 11, 5, 6, 8, 9, 1, 2};
  loader.start_epoch(2, order);
  REQUIRE(loader.next() != nullptr);  // a batch in flight, the worker filling the next
  loader.set_batch_size(8);
  CHECK(loader.options().batch_size == 8);
  CHECK_THROWS_WITH(loader.next(), Contains("before start_epoch()"));
  loader.start_epoch(2, order);
  CHECK(loader.batches_this_epoch() == 2);
  const std::vector<Expected> expected = serial_batches(set, order, 8, false, transform, 2);
  for (const Expected& e : expected) {
    const Batch<float>* batch = loader.next();
    REQUIRE(batch != nullptr);
    CHECK(batch->indices == e.indices);
    CHECK(std::vector<float>(batch->images.span().begin(), batch->images.span().end()) == e.images);
  }
  CHECK(loader.next() == nullptr);
  CHECK_THROWS_WITH(loader.set_batch_size(0), Contains("batch_size is 0"));
}
