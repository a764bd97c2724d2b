#pragma once
// DistributedSampler: which samples each rank takes in an epoch, with the semantics of PyTorch's
// torch.utils.data.DistributedSampler, so that a coltrain run and a PyTorch run split a dataset the
// same way:
//
//   num_samples = ceil(N / R), or floor(N / R) with drop_last (PyTorch's ceil((N - R) / R) when
//                 N % R != 0); total = num_samples * R
//   indices     = 0..N-1, shuffled if `shuffle`; without drop_last padded by repeating the list
//                 from its start up to `total`, with drop_last cut to `total`
//   rank r      takes indices[r], indices[r + R], indices[r + 2R], ...
//
// The shuffle is a deterministic function of (seed, epoch) through coltrain's own generator
// (SplitMix64 + Fisher-Yates), so the same on every rank and every run; it is not PyTorch's
// randperm, whose permutations come from torch's Mersenne Twister and cannot be reproduced here.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/epoch_plan.hpp>
#include <coltrain/data/random.hpp>

#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::data {

struct DistributedSamplerOptions {
  int num_replicas = 1;  // ranks sharing the dataset (the world size)
  int rank = 0;          // this rank, in [0, num_replicas)
  bool shuffle = true;
  std::uint64_t seed = 0;  // must be the same on every rank
  bool drop_last = false;  // drop the tail instead of padding it with repeated samples
  // > 0: deterministic training's share (data/epoch_plan.hpp): global batches of this many
  // samples, rank r taking the r-th global_batch / num_replicas of each, the same samples in each
  // global batch on every world size; a tail shorter than a global batch is left out. It must be
  // a multiple of num_replicas.
  std::int64_t global_batch = 0;
};

class DistributedSampler {
 public:
  DistributedSampler(std::int64_t dataset_size, DistributedSamplerOptions options = {})
      : dataset_size_(dataset_size), options_(options) {
    auto invalid = [&](const std::string& message) {
      ErrorContext c;
      c.operation = "DistributedSampler";
      c.rank = options_.rank;
      throw InvalidArgument(message, c);
    };
    if (dataset_size < 0) invalid("dataset size " + std::to_string(dataset_size) + " is negative");
    if (options_.num_replicas < 1) {
      invalid("num_replicas is " + std::to_string(options_.num_replicas) + ", expected at least 1");
    }
    if (options_.rank < 0 || options_.rank >= options_.num_replicas) {
      invalid("rank " + std::to_string(options_.rank) +
              " is outside [0, num_replicas = " + std::to_string(options_.num_replicas) + ")");
    }
    const std::int64_t replicas = options_.num_replicas;
    if (options_.global_batch < 0 || options_.global_batch % replicas != 0) {
      invalid("a global batch of " + std::to_string(options_.global_batch) +
              " samples does not divide among " + std::to_string(replicas) + " ranks");
    }
    if (options_.global_batch > 0) {
      num_samples_ = dataset_size / options_.global_batch * (options_.global_batch / replicas);
    } else {
      num_samples_ =
          options_.drop_last ? dataset_size / replicas : (dataset_size + replicas - 1) / replicas;
    }
  }

  // Selects the epoch's shuffle; call it at the start of every epoch, as with PyTorch.
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }

  // Samples per rank and epoch (PyTorch's len(sampler)).
  std::int64_t num_samples() const { return num_samples_; }
  // Samples over all ranks: num_samples() * num_replicas.
  std::int64_t total_size() const { return num_samples_ * options_.num_replicas; }
  std::int64_t dataset_size() const { return dataset_size_; }
  const DistributedSamplerOptions& options() const { return options_; }

  // The current epoch's samples (shuffled if `shuffle`) and how the ranks share them.
  EpochPlan plan() const {
    std::vector<std::int64_t> all(static_cast<std::size_t>(dataset_size_));
    std::iota(all.begin(), all.end(), std::int64_t{0});
    if (options_.shuffle) SplitMix64::keyed(options_.seed, epoch_).shuffle(std::span(all));
    return {std::move(all), options_.num_replicas, options_.drop_last, options_.global_batch};
  }

  // This rank's dataset indices for the current epoch, in order.
  std::vector<std::int64_t> indices() const { return plan().share(options_.rank); }

 private:
  std::int64_t dataset_size_;
  DistributedSamplerOptions options_;
  std::int64_t num_samples_ = 0;
  std::uint64_t epoch_ = 0;
};

}  // namespace coltrain::data
