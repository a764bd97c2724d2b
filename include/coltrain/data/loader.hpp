#pragma once
// Loader: turns a dataset and an order of samples (a DistributedSampler, or a fixed list for
// evaluation) into batches of transformed images [B, C, H, W] of T (float, double, half, bfloat16)
// and their labels. A background thread prepares the next batches while the caller trains on the
// current one (a bounded queue of `prefetch` batches, whose buffers are reused); a batch is a pure
// function of (epoch, batch number), so the output is the same with and without the thread.
//
//   data::Loader<float> loader(train, sampler, {.batch_size = 128},
//                              data::cifar10_train_transform(1));
//   for (std::uint64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);  // also sets the sampler's epoch
//     while (const data::Batch<float>* batch = loader.next())
//       train_step(batch->images, batch->labels);
//   }
//
// An exception thrown while preparing a batch is rethrown by the next() that would have returned
// it. The destructor stops and joins the thread, also in the middle of an epoch.

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/dataset.hpp>
#include <coltrain/data/sampler.hpp>
#include <coltrain/data/transform.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::data {

template <class T>
struct Batch {
  tensor::Tensor<T> images;           // [B, C, H, W]
  std::vector<std::int32_t> labels;   // B
  std::vector<std::int64_t> indices;  // each sample's index in the dataset
  std::int64_t number = 0;            // of this batch in its epoch, from 0

  std::int64_t size() const { return static_cast<std::int64_t>(labels.size()); }
};

struct LoaderOptions {
  std::int64_t batch_size = 64;
  bool drop_last = false;  // drop the last batch if it is smaller than batch_size
  int prefetch = 2;        // batches prepared ahead by a background thread; 0: prepared in next()
};

template <class T = float, SampleTransform Transform = ImageTransform>
class Loader {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, half> ||
                    std::is_same_v<T, bfloat16>,
                "coltrain: a Loader produces float, double, coltrain::half or coltrain::bfloat16");

 public:
  // Batches in the order of `sampler` (copied; the loader sets its epoch). `dataset` must outlive
  // the loader.
  Loader(const ImageDataset& dataset, DistributedSampler sampler, LoaderOptions options,
         Transform transform = {})
      : Loader(dataset, std::optional<DistributedSampler>(std::move(sampler)), {}, options,
               std::move(transform)) {}

  // Batches in a fixed order of dataset indices, the same every epoch (evaluation).
  Loader(const ImageDataset& dataset, std::vector<std::int64_t> order, LoaderOptions options,
         Transform transform = {})
      : Loader(dataset, std::nullopt, std::move(order), options, std::move(transform)) {}

  // The loader keeps a pointer to the dataset: a temporary one would be gone before the batches.
  Loader(ImageDataset&&, DistributedSampler, LoaderOptions, Transform = {}) = delete;
  Loader(ImageDataset&&, std::vector<std::int64_t>, LoaderOptions, Transform = {}) = delete;
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  ~Loader() { stop(); }

  // Starts (or restarts) an epoch; a batch still held from the previous one becomes invalid.
  void start_epoch(std::uint64_t epoch) {
    stop();
    if (sampler_) {
      sampler_->set_epoch(epoch);
      order_ = sampler_->indices();
    }
    begin(epoch);
  }

  // Starts an epoch over `order` instead of the sampler's share: elastic training shares the rest
  // of an epoch among the ranks left (data/epoch_plan.hpp). The sampler, if any, keeps its
  // settings for the epochs after. Throws InvalidArgument for an index outside the dataset.
  void start_epoch(std::uint64_t epoch, std::vector<std::int64_t> order) {
    stop();
    check_order(order);
    order_ = std::move(order);
    begin(epoch);
  }

  // A loader over a fixed order (no sampler) takes `order` from its next epoch on: a validation
  // shard after the ranks changed. Throws InvalidArgument for a loader with a sampler, or an index
  // outside the dataset.
  void set_order(std::vector<std::int64_t> order) {
    if (sampler_) throw InvalidArgument("Loader::set_order: this loader's order is its sampler's");
    stop();
    check_order(order);
    order_ = std::move(order);
    started_ = false;
  }

  // Batches of `batch_size` from the next epoch on: deterministic elastic training gives each rank
  // its block of the global batch, which grows when ranks leave. Throws InvalidArgument below 1.
  void set_batch_size(std::int64_t batch_size) {
    if (batch_size < 1) {
      ErrorContext c;
      c.operation = "Loader::set_batch_size";
      throw InvalidArgument("batch_size is " + std::to_string(batch_size) + ", expected at least 1",
                            c);
    }
    stop();
    options_.batch_size = batch_size;
    started_ = false;
  }

  const std::optional<DistributedSampler>& sampler() const { return sampler_; }
  // Batches in the epoch started last.
  std::int64_t batches_this_epoch() const { return batches_; }

  // The next batch of the epoch, or nullptr at its end. The batch stays valid until the next call
  // to next() or start_epoch().
  const Batch<T>* next() {
    if (!started_) {
      throw InvalidArgument("Loader::next() before start_epoch(): call start_epoch(epoch) first");
    }
    if (options_.prefetch == 0) {
      if (taken_ == batches_) return nullptr;
      fill(taken_, slots_[0]);
      ++taken_;
      return &slots_[0];
    }
    std::unique_lock lock(mutex_);
    if (held_) {
      free_.push_back(*held_);
      held_.reset();
      changed_.notify_all();
    }
    if (taken_ == batches_) return nullptr;
    changed_.wait(lock, [&] { return !ready_.empty() || error_; });
    if (ready_.empty()) std::rethrow_exception(error_);  // batches before the failure come first
    held_ = ready_.front();
    ready_.pop_front();
    ++taken_;
    return &slots_[*held_];
  }

  std::int64_t batches_per_epoch() const {
    const std::int64_t n =
        sampler_ ? sampler_->num_samples() : static_cast<std::int64_t>(order_.size());
    return options_.drop_last ? n / options_.batch_size
                              : (n + options_.batch_size - 1) / options_.batch_size;
  }
  // The shape of one transformed sample.
  ImageShape sample_shape() const { return output_shape_; }
  const LoaderOptions& options() const { return options_; }
  const ImageDataset& dataset() const { return *dataset_; }

 private:
  void begin(std::uint64_t epoch) {
    epoch_ = epoch;
    const auto n = static_cast<std::int64_t>(order_.size());
    batches_ = options_.drop_last ? n / options_.batch_size
                                  : (n + options_.batch_size - 1) / options_.batch_size;
    taken_ = 0;
    held_.reset();
    error_ = nullptr;
    ready_.clear();
    free_.clear();
    for (std::size_t i = 0; i < slots_.size(); ++i) free_.push_back(i);
    started_ = true;
    if (options_.prefetch > 0 && batches_ > 0) {
      stopping_ = false;
      worker_ = std::thread([this] { produce(); });
    }
  }

  void check_order(const std::vector<std::int64_t>& order) const {
    for (const std::int64_t index : order) {
      if (index < 0 || index >= dataset_->size()) {
        ErrorContext c;
        c.operation = "Loader";
        throw InvalidArgument("index " + std::to_string(index) +
                                  " in the order is outside the dataset of " +
                                  std::to_string(dataset_->size()),
                              c);
      }
    }
  }

  Loader(const ImageDataset& dataset, std::optional<DistributedSampler> sampler,
         std::vector<std::int64_t> order, LoaderOptions options, Transform transform)
      : dataset_(&dataset),
        sampler_(std::move(sampler)),
        order_(std::move(order)),
        options_(options),
        transform_(std::move(transform)),
        output_shape_(transform_.output_shape(dataset.image_shape())),
        slots_(static_cast<std::size_t>(options.prefetch > 0 ? options.prefetch + 1 : 1)) {
    auto invalid = [](const std::string& message) {
      ErrorContext c;
      c.operation = "Loader";
      throw InvalidArgument(message, c);
    };
    if (options_.batch_size < 1)
      invalid("batch_size is " + std::to_string(options_.batch_size) + ", expected at least 1");
    if (options_.prefetch < 0)
      invalid("prefetch is " + std::to_string(options_.prefetch) + ", expected 0 or more");
    if (sampler_ && sampler_->dataset_size() != dataset.size()) {
      invalid("the sampler was made for " + std::to_string(sampler_->dataset_size()) +
              " samples but the dataset holds " + std::to_string(dataset.size()));
    }
    check_order(order_);
  }

  // Batch `number` of the current epoch, into `batch`. Reads only what start_epoch() set.
  void fill(std::int64_t number, Batch<T>& batch) {
    const std::int64_t begin = number * options_.batch_size;
    const std::int64_t end =
        std::min(begin + options_.batch_size, static_cast<std::int64_t>(order_.size()));
    const std::int64_t n = end - begin;
    const ImageShape input = dataset_->image_shape();
    const auto sample = static_cast<std::size_t>(output_shape_.size());
    batch.number = number;
    batch.images.resize(output_shape_.batch(n));
    batch.labels.resize(static_cast<std::size_t>(n));
    batch.indices.resize(static_cast<std::size_t>(n));
    if constexpr (!std::is_same_v<T, float>) scratch_.resize(sample);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t index = order_[static_cast<std::size_t>(begin + i)];
      const std::span<const std::uint8_t> image = dataset_->pixels().subspan(
          static_cast<std::size_t>(index * input.size()), static_cast<std::size_t>(input.size()));
      T* target = batch.images.data() + static_cast<std::size_t>(i) * sample;
      if constexpr (std::is_same_v<T, float>) {
        transform_.apply(image, input, SampleKey{epoch_, index}, std::span<float>(target, sample));
      } else {
        transform_.apply(image, input, SampleKey{epoch_, index}, std::span<float>(scratch_));
        for (std::size_t k = 0; k < sample; ++k) target[k] = static_cast<T>(scratch_[k]);
      }
      batch.labels[static_cast<std::size_t>(i)] =
          dataset_->labels()[static_cast<std::size_t>(index)];
      batch.indices[static_cast<std::size_t>(i)] = index;
    }
  }

  // The background thread: fills free slots in batch order until the epoch is done, it is stopped,
  // or a batch fails.
  void produce() {
    for (std::int64_t number = 0; number < batches_; ++number) {
      std::size_t slot = 0;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || !free_.empty(); });
        if (stopping_) return;
        slot = free_.front();
        free_.pop_front();
      }
      try {
        fill(number, slots_[slot]);
      } catch (...) {
        const std::lock_guard lock(mutex_);
        error_ = std::current_exception();
        changed_.notify_all();
        return;
      }
      const std::lock_guard lock(mutex_);
      ready_.push_back(slot);
      changed_.notify_all();
    }
  }

  void stop() {
    if (!worker_.joinable()) return;
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }

  const ImageDataset* dataset_;
  std::optional<DistributedSampler> sampler_;
  std::vector<std::int64_t> order_;  // this epoch's dataset indices
  LoaderOptions options_;
  Transform transform_;
  ImageShape output_shape_;
  std::vector<Batch<T>> slots_;  // batch buffers, reused
  std::vector<float> scratch_;   // one transformed sample, when T is not float

  std::uint64_t epoch_ = 0;
  bool started_ = false;
  std::int64_t batches_ = 0;  // in this epoch
  std::int64_t taken_ = 0;    // batches next() has returned in this epoch

  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::size_t> free_;   // slots the worker may fill
  std::deque<std::size_t> ready_;  // filled slots, in batch order
  std::optional<std::size_t> held_;
  std::exception_ptr error_;
  bool stopping_ = false;
};

}  // namespace coltrain::data
