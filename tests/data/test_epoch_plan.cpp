// EpochPlan (coltrain/data/epoch_plan.hpp): its shares are DistributedSampler's, and when the ranks
// change in the middle of an epoch, what the old ranks took plus the new ranks' shares of the
// remainder hold every sample of the epoch exactly once (when the remainder divides evenly;
// otherwise it is padded, as the sampler pads).

#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/epoch_plan.hpp>
#include <coltrain/data/sampler.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

namespace {

namespace data = coltrain::data;
using Indices = std::vector<std::int64_t>;

TEST_CASE("a sampler's plan shares its samples as the sampler does", "[epoch_plan]") {
  for (const bool drop_last : {false, true}) {
    for (const int replicas : {1, 2, 3, 5}) {
      for (int rank = 0; rank < replicas; ++rank) {
        data::DistributedSampler sampler(
            23, {.num_replicas = replicas, .rank = rank, .seed = 9, .drop_last = drop_last});
        sampler.set_epoch(4);
        const data::EpochPlan plan = sampler.plan();
        CHECK(plan.per_rank() == sampler.num_samples());
        CHECK(plan.share(rank) == sampler.indices());
      }
    }
  }
}

TEST_CASE("taken plus the remainder's shares hold every sample once", "[epoch_plan]") {
  for (const int before : {2, 3, 4, 5}) {
    for (const int after : {1, 2, 3, 4}) {
      for (std::int64_t taken = 0; taken <= 12; taken += 3) {
        // n divides among the old ranks; remainders that do not divide among the new are skipped
        const std::int64_t n = 12 * before * after;
        Indices order(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = (i * 7) % n;
        const data::EpochPlan plan{order, before, false};
        if ((n - taken * before) % after != 0) continue;  // would be padded: the next case
        std::map<std::int64_t, int> seen;
        for (int r = 0; r < before; ++r) {
          const Indices share = plan.share(r);
          for (std::int64_t k = 0; k < std::min<std::int64_t>(taken, plan.per_rank()); ++k)
            ++seen[share[static_cast<std::size_t>(k)]];
        }
        const data::EpochPlan rest = plan.remainder(taken, after);
        for (int r = 0; r < after; ++r)
          for (const std::int64_t i : rest.share(r)) ++seen[i];
        INFO("before " << before << ", after " << after << ", taken " << taken);
        CHECK(static_cast<std::int64_t>(seen.size()) == n);
        CHECK(std::all_of(seen.begin(), seen.end(), [](const auto& e) { return e.second == 1; }));
      }
    }
  }
}

TEST_CASE("a remainder that does not divide is padded, with drop_last it is cut", "[epoch_plan]") {
  const data::EpochPlan plan{{10, 11, 12, 13, 14, 15, 16}, 2, false};  // shares of 4, padded
  const data::EpochPlan rest = plan.remainder(1, 3);  // positions 2.. untaken: 12 13 14 15 16
  CHECK(rest.samples == Indices{12, 13, 14, 15, 16});
  CHECK(rest.share(0) == Indices{12, 15});
  CHECK(rest.share(2) == Indices{14, 12});  // padded from the remainder's start
  const data::EpochPlan cut =
      data::EpochPlan{{10, 11, 12, 13, 14, 15, 16}, 2, true}.remainder(1, 2);
  CHECK(cut.samples == Indices{12, 13, 14, 15});  // the sampler's tail (16) stays dropped
  CHECK(cut.share(1) == Indices{13, 15});
  // Everything taken: nothing left.
  CHECK(plan.remainder(plan.per_rank(), 2).samples.empty());
  CHECK(plan.remainder(plan.per_rank(), 2).share(1).empty());
}

TEST_CASE("under a global batch the remainder starts at the next global batch", "[epoch_plan]") {
  // 20 samples in global batches of 4 on 2 ranks: blocks of 2; the tail of 20 % 4 = 0.
  Indices order(20);
  for (std::int64_t i = 0; i < 20; ++i) order[static_cast<std::size_t>(i)] = 100 + i;
  const data::EpochPlan plan{order, 2, false, 4};
  CHECK(plan.per_rank() == 10);
  CHECK(plan.share(1) == Indices{102, 103, 106, 107, 110, 111, 114, 115, 118, 119});
  // Two global batches taken (2 blocks a rank): the rest from sample 8, on 4 ranks in blocks of 1.
  const data::EpochPlan rest = plan.remainder(4, 4);
  CHECK(rest.samples == Indices(order.begin() + 8, order.end()));
  CHECK(rest.share(3) == Indices{111, 115, 119});
  // Half a block taken is not a global batch boundary; 3 ranks do not divide a batch of 4.
  CHECK_THROWS_WITH(plan.remainder(3, 2), Catch::Contains("not a whole number of global batches"));
  CHECK_THROWS_WITH(plan.remainder(4, 3).share(0),
                    Catch::Contains("a global batch of 4 samples does not divide among 3 ranks"));
}

TEST_CASE("bad arguments are refused", "[epoch_plan]") {
  const data::EpochPlan plan{{1, 2, 3}, 2, false};
  CHECK_THROWS_AS(plan.share(2), coltrain::InvalidArgument);
  CHECK_THROWS_AS(plan.remainder(-1, 2), coltrain::InvalidArgument);
  CHECK_THROWS_AS(plan.remainder(0, 0), coltrain::InvalidArgument);
}

}  // namespace
