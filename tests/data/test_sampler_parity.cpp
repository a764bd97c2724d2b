// Parity with PyTorch 1.13's torch.utils.data.DistributedSampler (shuffle=False): for every case
// sampler_references.py recorded, coltrain's rank lists are torch's exactly.

#include <catch2/catch.hpp>
#include <coltrain/data/sampler.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "../support/parity.hpp"

namespace {

TEST_CASE("unshuffled DistributedSampler lists equal PyTorch's", "[sampler][parity]") {
  const auto references = coltrain::testing::parity_reference("sampler.safetensors");
  std::size_t cases = 0;
  for (const auto& entry : references.entries()) {
    std::int64_t n = 0;
    int replicas = 0, drop_last = 0, rank = 0;
    REQUIRE(std::sscanf(entry.name.c_str(), "n%ld_r%d_drop%d_rank%d", &n, &replicas, &drop_last,
                        &rank) == 4);
    INFO(entry.name);
    const coltrain::data::DistributedSampler sampler(
        n, {.num_replicas = replicas, .rank = rank, .shuffle = false, .drop_last = drop_last != 0});
    CHECK(sampler.indices() == references.read<std::int64_t>(entry.name));
    ++cases;
  }
  CHECK(cases == 9 * (1 + 2 + 3 + 4 + 5 + 7) * 2);
}

}  // namespace
