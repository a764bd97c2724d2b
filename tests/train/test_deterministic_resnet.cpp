// Deterministic mode on ResNet-20 (issue 48's model besides MnistConvNet): two SGD steps of a
// global batch of 16 CIFAR-shaped images in 8 micro-shards on 1, 2, 4 and 8 TCP ranks run as
// threads, fp32 and bf16 with f32 master weights, end with the same bits of every parameter,
// BatchNorm running statistic and loss on every world size and rank; 4 micro-shards give other
// bits, so the comparison can fail. Its own program, unsanitized: ResNet-20 at -O0 under the
// sanitizers would take minutes (the small network of test_deterministic_training.cpp covers the
// same code there).
#include <catch2/catch.hpp>

#include "deterministic_runs.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/models.hpp>
#include <coltrain/optim.hpp>

using namespace coltrain;
using coltrain::testing::deterministic_run;
using coltrain::testing::require_same_bits_on_world_sizes;

TEMPLATE_TEST_CASE(
    "Deterministic data-parallel: ResNet-20 ends with the same bits on 1, 2, 4 and 8 ranks",
    "[train][deterministic]", optim::Fp32, optim::MixedBf16) {
  require_same_bits_on_world_sizes(
      [](comm::Communicator& comm, int micro_shards) {
        return deterministic_run<models::ResNet<20>, TestType>(comm, micro_shards, 16, 2);
      },
      270'000 * sizeof(typename TestType::Storage));
}
