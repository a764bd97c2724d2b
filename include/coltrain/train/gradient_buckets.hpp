#pragma once
// Gradient buckets: which parameters are reduced together, and when a bucket may go. Shared by
// DataParallel (CPU) and DeviceDataParallel (GPU), and host code only, so the schedule is tested
// in CI without a GPU.
//
// Buckets hold whole parameters in reverse state_dict order (the order in which a backward pass
// finishes them), the first bucket small so that communication starts early (DDP's 1 MiB / 25 MiB).
// The network reports each parameter whose gradient is final; BucketLaunchTracker answers how many
// buckets, counted from the first, are complete. Buckets go strictly in order, the same on every
// rank, so that every rank's k-th collective is the same bucket. The last bucket is never launched
// from a report: it is complete only when the backward pass ends, when the caller reduces it itself.

#include <coltrain/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::train {

// One bucket: whole parameters, by index in state_dict order, in the order they are packed.
struct GradientBucket {
  std::vector<std::size_t> parameters;
  std::size_t bytes = 0;  // its gradients, as one allreduce carries them (f32 for 16-bit ones)
};

// Packs parameters (given by their allreduce bytes, in state_dict order) into buckets in reverse
// state_dict order: the first bucket closes once it holds first_bucket_bytes, each later one once
// it holds bucket_bytes, as DDP's compute_bucket_assignment_by_size. A parameter larger than the
// cap gets a bucket of its own.
inline std::vector<GradientBucket> assign_gradient_buckets(std::span<const std::size_t> bytes,
                                                           std::size_t first_bucket_bytes,
                                                           std::size_t bucket_bytes) {
  std::vector<GradientBucket> buckets;
  GradientBucket open;
  for (std::size_t i = bytes.size(); i-- > 0;) {
    open.parameters.push_back(i);
    open.bytes += bytes[i];
    if (open.bytes >= (buckets.empty() ? first_bucket_bytes : bucket_bytes)) {
      buckets.push_back(std::move(open));
      open = {};
    }
  }
  if (!open.parameters.empty()) buckets.push_back(std::move(open));
  return buckets;
}

// Count, total bytes and a fingerprint of the bucket sizes, each as (x, -x): one kMin allreduce of
// these six values gives every rank both the smallest and the largest of each across ranks, so a
// rank with different buckets is found without a second collective.
inline std::vector<std::int64_t> bucket_agreement_values(std::span<const GradientBucket> buckets) {
  // Unsigned, so that the product wraps (a signed one overflows after a few buckets); the mask
  // then keeps 61 bits, which fit an int64 with room for the negation.
  std::uint64_t fingerprint = 0;
  std::int64_t total = 0;
  for (const GradientBucket& bucket : buckets) {
    total += static_cast<std::int64_t>(bucket.bytes);
    fingerprint = (fingerprint * 1000003 + bucket.bytes) & ((std::uint64_t{1} << 61) - 1);
  }
  const auto count = static_cast<std::int64_t>(buckets.size());
  const auto print = static_cast<std::int64_t>(fingerprint);
  return {count, -count, total, -total, print, -print};
}

// After the kMin allreduce of bucket_agreement_values(): empty when every rank built the same
// buckets, else the message of the MismatchError to throw.
inline std::string bucket_disagreement(std::span<const GradientBucket> buckets,
                                       std::span<const std::int64_t> reduced) {
  if (reduced[0] == -reduced[1] && reduced[2] == -reduced[3] && reduced[4] == -reduced[5])
    return {};
  std::size_t total = 0;
  for (const GradientBucket& bucket : buckets) total += bucket.bytes;
  return "ranks built different gradient buckets (this rank: " + std::to_string(buckets.size()) +
         " buckets, " + std::to_string(total) + " bytes; across ranks: " +
         std::to_string(reduced[0]) + " to " + std::to_string(-reduced[1]) + " buckets, " +
         std::to_string(reduced[2]) + " to " + std::to_string(-reduced[3]) +
         " bytes); every rank needs the same model and the same bucket options";
}

// The launch order of one step's buckets from the backward pass's reports. Host-only state; the
// caller does the launching.
class BucketLaunchTracker {
 public:
  BucketLaunchTracker() = default;
  BucketLaunchTracker(std::span<const GradientBucket> buckets, std::size_t parameters)
      : sizes_(buckets.size()), bucket_of_(parameters), reported_(parameters, 0) {
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      sizes_[b] = buckets[b].parameters.size();
      for (std::size_t p : buckets[b].parameters) {
        if (p >= parameters)
          throw InvalidArgument("BucketLaunchTracker: bucket " + std::to_string(b) +
                                " names parameter " + std::to_string(p) + " of " +
                                std::to_string(parameters));
        bucket_of_[p] = b;
      }
    }
    reset();
  }

  // Parameter p's gradient is final. Returns the number of buckets that may have been launched
  // from the first on (never the last one); it grows only when the report completes the first
  // bucket not yet launched. Throws InvalidArgument for a parameter reported twice in one step.
  std::size_t report(std::size_t p) {
    if (p >= reported_.size())
      throw InvalidArgument("BucketLaunchTracker: parameter " + std::to_string(p) + " of " +
                            std::to_string(reported_.size()));
    if (reported_[p])
      throw InvalidArgument("parameter " + std::to_string(p) + " was reported twice in one step");
    reported_[p] = 1;
    started_ = true;
    if (--pending_[bucket_of_[p]] == 0) {
      std::size_t end = launchable_;
      while (end < pending_.size() && pending_[end] == 0) ++end;
      launchable_ = std::min(end, pending_.empty() ? 0 : pending_.size() - 1);
    }
    return launchable_;
  }

  std::size_t launchable() const { return launchable_; }  // buckets [0, launchable()) may go
  bool started() const { return started_; }               // a report came this step
  bool reported(std::size_t p) const { return reported_.at(p) != 0; }
  std::size_t buckets() const { return sizes_.size(); }

  // A new step: nothing reported, nothing launched.
  void reset() {
    pending_ = sizes_;
    std::fill(reported_.begin(), reported_.end(), char{0});
    launchable_ = 0;
    started_ = false;
  }

 private:
  std::vector<std::size_t> sizes_;      // parameters per bucket
  std::vector<std::size_t> bucket_of_;  // by parameter
  std::vector<std::size_t> pending_;    // per bucket: parameters not yet reported this step
  std::vector<char> reported_;          // per parameter
  std::size_t launchable_ = 0;
  bool started_ = false;
};

}  // namespace coltrain::train
