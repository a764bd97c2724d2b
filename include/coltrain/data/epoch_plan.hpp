#pragma once
// EpochPlan: the samples of one epoch and how ranks share them, so that when the ranks change in
// the middle of an epoch (elastic training, train/elastic.hpp) the rest of it can be shared among
// the ranks left with no sample lost and none taken twice, except the few that pad uneven shares
// to equal length (as below).
//
// The share is DistributedSampler's rule over `samples`: with R ranks, rank r takes samples[r],
// samples[r + R], ...; ceil(n / R) each, the last ones padded by repeating the list from its start,
// or floor(n / R) each with drop_last. After every rank took the first t of its share, exactly the
// samples at positions [t * R, n) are untaken (the positions before are taken, and the padding
// repeats what is taken or untaken already), so the remainder is that slice, shared anew.
//
// With a global batch G (deterministic training, DataParallelOptions::micro_shards) the share
// is by blocks instead: the samples in global batches of G, rank r taking the r-th G/R of each,
// whole global batches only (a tail shorter than G is left out). A global batch then holds the
// same samples, in the same order, on every world size.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::data {

struct EpochPlan {
  std::vector<std::int64_t> samples;  // the epoch's dataset indices, in order, each once
  int replicas = 1;                   // the ranks sharing them
  bool drop_last = false;             // cut the tail instead of padding it
  std::int64_t global_batch = 0;      // > 0: the block share above, with global batches of this

  // Samples each rank takes.
  std::int64_t per_rank() const {
    const auto n = static_cast<std::int64_t>(samples.size());
    if (global_batch > 0) return n / global_batch * block();
    return drop_last ? n / replicas : (n + replicas - 1) / replicas;
  }

  // Under a global batch: each rank's consecutive samples of one global batch.
  std::int64_t block() const {
    if (global_batch % replicas != 0) {
      throw InvalidArgument("EpochPlan: a global batch of " + std::to_string(global_batch) +
                            " samples does not divide among " + std::to_string(replicas) +
                            " ranks");
    }
    return global_batch / replicas;
  }

  // Rank `rank`'s samples, in order.
  std::vector<std::int64_t> share(int rank) const {
    if (rank < 0 || rank >= replicas) {
      throw InvalidArgument("EpochPlan: rank " + std::to_string(rank) +
                            " is outside [0, replicas = " + std::to_string(replicas) + ")");
    }
    std::vector<std::int64_t> mine;
    const std::int64_t count = per_rank();
    mine.reserve(static_cast<std::size_t>(count));
    const auto n = static_cast<std::int64_t>(samples.size());
    if (global_batch > 0) {
      const std::int64_t size = block();
      for (std::int64_t k = 0; k < count; ++k) {
        const std::int64_t batch = k / size;
        mine.push_back(
            samples[static_cast<std::size_t>(batch * global_batch + rank * size + k % size)]);
      }
      return mine;
    }
    for (std::int64_t k = 0; k < count; ++k)
      mine.push_back(samples[static_cast<std::size_t>((rank + k * replicas) % n)]);
    return mine;
  }

  // The rest of the epoch once every rank has taken the first `taken` samples of its share,
  // shared among `new_replicas` ranks.
  EpochPlan remainder(std::int64_t taken, int new_replicas) const {
    if (taken < 0 || new_replicas < 1) {
      throw InvalidArgument("EpochPlan::remainder: taken " + std::to_string(taken) +
                            " and replicas " + std::to_string(new_replicas) +
                            " must be >= 0 and >= 1");
    }
    const auto n = static_cast<std::int64_t>(samples.size());
    if (global_batch > 0) {
      // Whole global batches taken, so that the next one starts where it would have.
      const std::int64_t size = block();
      if (taken % size != 0) {
        throw InvalidArgument("EpochPlan::remainder: " + std::to_string(taken) +
                              " samples taken is not a whole number of global batches of " +
                              std::to_string(global_batch) + " (" + std::to_string(size) +
                              " a rank)");
      }
      const std::int64_t end = n / global_batch * global_batch;
      const std::int64_t begin = std::min(end, taken / size * global_batch);
      return {std::vector<std::int64_t>(samples.begin() + begin, samples.begin() + end),
              new_replicas, drop_last, global_batch};
    }
    const std::int64_t end = drop_last ? per_rank() * replicas : n;
    const std::int64_t begin = std::min(end, taken * replicas);
    return {std::vector<std::int64_t>(samples.begin() + begin, samples.begin() + end), new_replicas,
            drop_last};
  }
};

}  // namespace coltrain::data
