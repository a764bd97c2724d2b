// DistributedSampler (coltrain/data/sampler.hpp): PyTorch's index lists, worked out by hand from
// torch/utils/data/distributed.py's rules, and the properties of the shuffled lists.

#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/sampler.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <vector>

namespace {

namespace data = coltrain::data;
using data::DistributedSampler;
using data::DistributedSamplerOptions;
using Indices = std::vector<std::int64_t>;

Indices indices_of(std::int64_t n, int replicas, int rank, bool drop_last, bool shuffle = false,
                   std::uint64_t seed = 0, std::uint64_t epoch = 0) {
  DistributedSampler sampler(n, {.num_replicas = replicas,
                                 .rank = rank,
                                 .shuffle = shuffle,
                                 .seed = seed,
                                 .drop_last = drop_last});
  sampler.set_epoch(epoch);
  const Indices result = sampler.indices();
  CHECK(static_cast<std::int64_t>(result.size()) == sampler.num_samples());
  return result;
}

TEST_CASE("without shuffling, the index lists are PyTorch's", "[sampler]") {
  // N = 10, R = 3: num_samples = ceil(10 / 3) = 4, the list 0..9 padded with 0, 1 to 12 entries.
  CHECK(indices_of(10, 3, 0, false) == Indices{0, 3, 6, 9});
  CHECK(indices_of(10, 3, 1, false) == Indices{1, 4, 7, 0});
  CHECK(indices_of(10, 3, 2, false) == Indices{2, 5, 8, 1});
  // drop_last: num_samples = ceil((10 - 3) / 3) = 3, the list cut to 9 entries.
  CHECK(indices_of(10, 3, 0, true) == Indices{0, 3, 6});
  CHECK(indices_of(10, 3, 1, true) == Indices{1, 4, 7});
  CHECK(indices_of(10, 3, 2, true) == Indices{2, 5, 8});
  // Divisible: both modes agree.
  CHECK(indices_of(8, 4, 3, false) == Indices{3, 7});
  CHECK(indices_of(8, 4, 3, true) == Indices{3, 7});
  // Fewer samples than ranks: padding repeats the list, more than once when needed.
  CHECK(indices_of(2, 4, 2, false) == Indices{0});
  CHECK(indices_of(2, 4, 3, false) == Indices{1});
  CHECK(indices_of(1, 4, 3, false) == Indices{0});
  CHECK(indices_of(3, 5, 4, false) == Indices{1});
  CHECK(indices_of(3, 4, 0, true).empty());  // ceil((3 - 4) / 4) = 0
  CHECK(indices_of(0, 2, 1, false).empty());
  CHECK(indices_of(7, 1, 0, false) == Indices{0, 1, 2, 3, 4, 5, 6});
}

TEST_CASE("num_samples and total_size follow PyTorch's formulas", "[sampler]") {
  for (std::int64_t n = 0; n <= 12; ++n) {
    for (int r = 1; r <= 5; ++r) {
      const DistributedSampler keep(n, {.num_replicas = r});
      const DistributedSampler drop(n, {.num_replicas = r, .drop_last = true});
      // PyTorch: math.ceil(n / r), and with drop_last and n % r != 0, math.ceil((n - r) / r).
      const std::int64_t ceil_n = (n + r - 1) / r;
      std::int64_t drop_expected = ceil_n;
      if (n % r != 0) {
        const std::int64_t numerator = n - r;  // may be negative: ceil toward +infinity
        drop_expected = numerator >= 0 ? (numerator + r - 1) / r : -((-numerator) / r);
      }
      INFO("n = " << n << ", r = " << r);
      CHECK(keep.num_samples() == ceil_n);
      CHECK(drop.num_samples() == drop_expected);
      CHECK(keep.total_size() == ceil_n * r);
    }
  }
}

TEST_CASE("shuffled lists: a permutation split across ranks, padded from its start", "[sampler]") {
  for (const std::int64_t n : {1, 7, 10, 64, 101}) {
    for (const int r : {1, 2, 3, 4, 5}) {
      for (const bool drop_last : {false, true}) {
        INFO("n = " << n << ", r = " << r << ", drop_last = " << drop_last);
        const DistributedSampler probe(n, {.num_replicas = r, .drop_last = drop_last});
        // Interleave the ranks' lists back into the one list they were dealt from.
        Indices dealt(static_cast<std::size_t>(probe.total_size()));
        for (int rank = 0; rank < r; ++rank) {
          const Indices mine = indices_of(n, r, rank, drop_last, true, 42, 3);
          for (std::size_t k = 0; k < mine.size(); ++k) dealt[k * r + rank] = mine[k];
        }
        if (drop_last) {
          // Distinct indices: the ranks' shares are disjoint.
          CHECK(std::set<std::int64_t>(dealt.begin(), dealt.end()).size() == dealt.size());
        } else {
          // The first n form a permutation of 0..n-1 and the padding repeats them from the start.
          Indices head(dealt.begin(), dealt.begin() + n);
          Indices sorted = head;
          std::sort(sorted.begin(), sorted.end());
          Indices all(static_cast<std::size_t>(n));
          std::iota(all.begin(), all.end(), 0);
          CHECK(sorted == all);
          for (std::size_t k = static_cast<std::size_t>(n); k < dealt.size(); ++k)
            CHECK(dealt[k] == head[k % static_cast<std::size_t>(n)]);
        }
        for (const std::int64_t index : dealt) CHECK((index >= 0 && index < n));
      }
    }
  }
}

TEST_CASE("the shuffle is a fixed function of seed and epoch", "[sampler]") {
  // From an independent Python implementation of keyed SplitMix64 + Fisher-Yates: any change to the
  // shuffle would change which samples a resumed run sees.
  CHECK(indices_of(10, 1, 0, false, true, 0, 0) == Indices{0, 1, 4, 6, 3, 9, 8, 7, 2, 5});
  CHECK(indices_of(10, 1, 0, false, true, 0, 1) == Indices{6, 7, 2, 3, 4, 1, 8, 0, 5, 9});
  CHECK(indices_of(10, 1, 0, false, true, 7, 0) == Indices{7, 6, 9, 2, 8, 4, 0, 3, 5, 1});
  // Rank 1 of 2 takes every other entry of the same list.
  CHECK(indices_of(10, 2, 1, false, true, 0, 1) == Indices{7, 3, 1, 0, 9});

  DistributedSampler sampler(1000, {.num_replicas = 2, .rank = 1, .seed = 5});
  const Indices epoch0 = sampler.indices();
  CHECK(sampler.indices() == epoch0);
  sampler.set_epoch(1);
  CHECK(sampler.epoch() == 1);
  const Indices epoch1 = sampler.indices();
  CHECK(epoch1 != epoch0);
  sampler.set_epoch(0);
  CHECK(sampler.indices() == epoch0);
  // Seed and epoch are mixed, not added: seed 6 at epoch 0 is not seed 5 at epoch 1.
  CHECK(indices_of(1000, 2, 1, false, true, 6, 0) != epoch1);
}

TEST_CASE("invalid sampler options are errors that say what is wrong", "[sampler]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(DistributedSampler(10, {.num_replicas = 2, .rank = 2}),
                    Contains("rank 2 is outside [0, num_replicas = 2)"));
  CHECK_THROWS_WITH(DistributedSampler(10, {.num_replicas = 2, .rank = -1}),
                    Contains("rank -1 is outside"));
  CHECK_THROWS_WITH(DistributedSampler(10, {.num_replicas = 0}),
                    Contains("num_replicas is 0, expected at least 1"));
  CHECK_THROWS_WITH(DistributedSampler(-1, {}), Contains("dataset size -1 is negative"));
  CHECK_THROWS_AS(DistributedSampler(10, {.num_replicas = 2, .rank = 5}),
                  coltrain::InvalidArgument);
  CHECK_THROWS_WITH(DistributedSampler(10, {.num_replicas = 4, .global_batch = 6}),
                    Contains("a global batch of 6 samples does not divide among 4 ranks"));
}

TEST_CASE("a global batch shares blocks: each global batch the same samples on every world size",
          "[sampler][deterministic]") {
  // 37 samples in global batches of 8: four whole ones, the tail of 5 left out.
  for (const bool shuffle : {false, true}) {
    INFO((shuffle ? "shuffled" : "in order"));
    const auto share = [&](int replicas, int rank) {
      DistributedSampler sampler(37, {.num_replicas = replicas,
                                      .rank = rank,
                                      .shuffle = shuffle,
                                      .seed = 3,
                                      .global_batch = 8});
      sampler.set_epoch(2);
      const Indices result = sampler.indices();
      CHECK(static_cast<std::int64_t>(result.size()) == sampler.num_samples());
      CHECK(sampler.total_size() == 32);
      return result;
    };
    const Indices one = share(1, 0);
    REQUIRE(one.size() == 32);
    if (!shuffle) {
      Indices first_32(32);
      std::iota(first_32.begin(), first_32.end(), std::int64_t{0});
      CHECK(one == first_32);
    }
    for (const int replicas : {2, 4, 8}) {
      INFO(replicas << " ranks");
      const std::size_t block = 8 / static_cast<std::size_t>(replicas);
      // Global batch b of the ranks' blocks, rank after rank, is global batch b of one rank.
      for (std::size_t b = 0; b < 4; ++b) {
        Indices batch;
        for (int rank = 0; rank < replicas; ++rank) {
          const Indices mine = share(replicas, rank);
          REQUIRE(mine.size() == 4 * block);
          batch.insert(batch.end(), mine.begin() + static_cast<std::ptrdiff_t>(b * block),
                       mine.begin() + static_cast<std::ptrdiff_t>((b + 1) * block));
        }
        CHECK(batch == Indices(one.begin() + static_cast<std::ptrdiff_t>(b * 8),
                               one.begin() + static_cast<std::ptrdiff_t>((b + 1) * 8)));
      }
    }
  }
  // The strided share of the same samples differs: rank 0 of 2 takes 0, 2, 4...
  CHECK(indices_of(37, 2, 0, true).at(1) == 2);
}

}  // namespace
