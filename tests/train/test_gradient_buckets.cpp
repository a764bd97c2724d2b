// The gradient-bucket schedule that DataParallel (CPU) and DeviceDataParallel (GPU) share: which
// buckets a backward pass's reports let go, in which order, and the cross-rank agreement check.
#include <coltrain/core/error.hpp>
#include <coltrain/train/gradient_buckets.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <string>
#include <vector>

using namespace coltrain;
using train::BucketLaunchTracker;
using train::GradientBucket;

namespace {

// Six parameters of 4 bytes each, three per bucket: buckets {5, 4, 3} and {2, 1, 0}, then a last
// one-parameter bucket to show that the last never launches from a report.
std::vector<GradientBucket> three_buckets() {
  const std::vector<std::size_t> bytes = {4, 4, 4, 4, 4, 4, 4};
  return train::assign_gradient_buckets(bytes, 12, 12);
}

}  // namespace

TEST_CASE("assign_gradient_buckets packs reverse state_dict order with a small first bucket") {
  const std::vector<std::size_t> bytes = {100, 8, 8, 8, 8, 300};
  const auto buckets = train::assign_gradient_buckets(bytes, 16, 120);
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0].parameters == std::vector<std::size_t>{5});  // larger than the first cap
  CHECK(buckets[0].bytes == 300);
  CHECK(buckets[1].parameters == std::vector<std::size_t>{4, 3, 2, 1, 0});
  CHECK(buckets[1].bytes == 132);
  // What is left when the parameters run out is a bucket of its own, however small.
  const std::vector<std::size_t> more = {8, 100, 8, 8, 8, 300};
  const auto with_rest = train::assign_gradient_buckets(more, 16, 120);
  REQUIRE(with_rest.size() == 3);
  CHECK(with_rest[1].parameters == std::vector<std::size_t>{4, 3, 2, 1});
  CHECK(with_rest[2].parameters == std::vector<std::size_t>{0});
  CHECK(with_rest[2].bytes == 8);
}

TEST_CASE("BucketLaunchTracker launches buckets in order as the backward pass completes them") {
  const auto buckets = three_buckets();
  REQUIRE(buckets.size() == 3);  // {6,5,4} {3,2,1} {0}
  BucketLaunchTracker tracker(buckets, 7);
  CHECK_FALSE(tracker.started());
  CHECK(tracker.report(6) == 0);
  CHECK(tracker.started());
  CHECK(tracker.report(5) == 0);
  CHECK(tracker.report(4) == 1);  // the first bucket is complete
  CHECK(tracker.report(3) == 1);
  CHECK(tracker.report(2) == 1);
  CHECK(tracker.report(1) == 2);  // the second is complete too
  CHECK(tracker.launchable() == 2);
  CHECK(tracker.report(0) == 2);  // the last bucket never goes from a report: the caller sends it
}

TEST_CASE("BucketLaunchTracker holds a complete bucket until the ones before it are complete") {
  const std::vector<std::size_t> bytes(9, 4);
  const auto buckets = train::assign_gradient_buckets(bytes, 12, 12);  // {8,7,6} {5,4,3} {2,1,0}
  REQUIRE(buckets.size() == 3);
  BucketLaunchTracker tracker(buckets, 9);
  // A layer outside the usual order finishes the second bucket first.
  for (std::size_t p : {5, 4, 3}) CHECK(tracker.report(p) == 0);
  CHECK(tracker.report(8) == 0);
  CHECK(tracker.report(7) == 0);
  CHECK(tracker.report(6) == 2);  // the first completes, and the waiting second goes with it
}

TEST_CASE("BucketLaunchTracker rejects a parameter reported twice or out of range, and resets") {
  const auto buckets = three_buckets();
  BucketLaunchTracker tracker(buckets, 7);
  tracker.report(6);
  CHECK(tracker.reported(6));
  CHECK_THROWS_AS(tracker.report(6), InvalidArgument);
  CHECK_THROWS_AS(tracker.report(7), InvalidArgument);
  tracker.reset();
  CHECK_FALSE(tracker.started());
  CHECK_FALSE(tracker.reported(6));
  CHECK(tracker.launchable() == 0);
  CHECK(tracker.report(6) == 0);  // a fresh step accepts it again
}

TEST_CASE("BucketLaunchTracker with one bucket never launches from a report") {
  const std::vector<std::size_t> bytes = {4, 4};
  const auto buckets = train::assign_gradient_buckets(bytes, 1 << 20, 1 << 20);
  REQUIRE(buckets.size() == 1);
  BucketLaunchTracker tracker(buckets, 2);
  CHECK(tracker.report(1) == 0);
  CHECK(tracker.report(0) == 0);
}

TEST_CASE("bucket agreement finds a rank whose buckets differ from one kMin reduction") {
  const auto mine = three_buckets();
  const std::vector<std::size_t> other_bytes = {4, 4, 4, 4, 4, 4, 8};
  const auto theirs = train::assign_gradient_buckets(other_bytes, 12, 12);
  const auto a = train::bucket_agreement_values(mine);
  const auto b = train::bucket_agreement_values(theirs);
  std::vector<std::int64_t> differ(a.size());  // what the kMin allreduce of both ranks gives
  for (std::size_t i = 0; i < a.size(); ++i) differ[i] = std::min(a[i], b[i]);
  CHECK(train::bucket_disagreement(mine, a).empty());
  const std::string message = train::bucket_disagreement(mine, differ);
  CHECK_THAT(message, Catch::Contains("ranks built different gradient buckets"));
  CHECK_THAT(message, Catch::Contains("28 to 32 bytes"));
}

TEST_CASE("the bucket fingerprint wraps, without overflow, for models with many large buckets") {
  // 25 MiB buckets: the product passes 2^63 at the third (a signed overflow, which
  // UndefinedBehaviorSanitizer reports). The reference wraps at 2^64, which 2^61 divides, so its
  // last 61 bits are exact.
  const std::vector<std::size_t> bytes(40, std::size_t{25} << 20);
  const auto buckets = train::assign_gradient_buckets(bytes, std::size_t{1} << 20, 25u << 20);
  REQUIRE(buckets.size() == 40);
  std::uint64_t expected = 0;
  for (const GradientBucket& bucket : buckets)
    expected = (expected * 1000003 + bucket.bytes) % (std::uint64_t{1} << 61);
  const auto values = train::bucket_agreement_values(buckets);
  CHECK(values[4] == static_cast<std::int64_t>(expected));
  CHECK(values[5] == -values[4]);
}
