// train::share_training_state (coltrain/train/elastic.hpp): after the ranks changed, every rank
// takes one rank's position and optimizer state (Adam's moments and step counts, fp32 masters, the
// loss scale) from memory. 3 TCP ranks as threads of this process; rank 0 took more steps than the
// others, as a leader one collective ahead may have; then the leader took none while the others
// took one, as when a step's allreduce completed on them and failed on it, and the state comes from
// the lowest of the ranks ahead (most_advanced_rank).

#include "../support/thread_ranks.hpp"

#include <catch2/catch.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/elastic.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace {

using namespace coltrain;
using coltrain::testing::expect;

using Model = nn::Sequential<nn::Input<1, 4, 4>, nn::Flatten, nn::Named<"fc", nn::Linear<3>>>;
using Net = nn::Network<Model, half>;
using Optimizer = optim::PrecisionOptimizer<optim::MixedFp16, optim::Adam>;

// `steps` Adam steps on gradients that depend on the rank, so the ranks' states differ.
void take_steps(Net& net, Optimizer& optimizer, int steps, int rank) {
  for (int s = 0; s < steps; ++s) {
    float g = 0.01f * static_cast<float>(rank + 1 + s);
    net.visit_parameters([&](const std::string&, auto& p) {
      for (auto& v : p.grad.span()) v = half(g += 0.001f);
    });
    optimizer.apply(optimizer.unscale_and_check(), 1e-2);
  }
}

// A snapshot's optimizer state and masters, one after the other.
std::vector<float> flat_values(const optim::OptimizerSnapshot& snapshot) {
  std::vector<float> flat;
  for (const auto* group : {&snapshot.state, &snapshot.masters})
    for (const auto& t : *group) flat.insert(flat.end(), t.values.begin(), t.values.end());
  return flat;
}

TEST_CASE("every rank takes rank 0's position and optimizer state", "[elastic]") {
  const std::string failures = coltrain::testing::joined(
      coltrain::testing::run_thread_ranks(3, [](comm::Communicator& comm) {
        Net net({.seed = 5});
        Optimizer optimizer(optim::parameters_of(net), optim::Adam({.lr = 1e-2}));
        take_steps(net, optimizer, comm.rank() == 0 ? 3 : 1, comm.rank());
        const train::ElasticPosition mine{.epoch = comm.rank() == 0 ? 4 : 9,
                                          .taken = 64,
                                          .trained = comm.rank() == 0,
                                          .global_step = 30 + comm.rank(),
                                          .context_step = 11,
                                          .train_seconds = 2.5};
        const train::ElasticPosition at = train::share_training_state(comm, optimizer, mine);
        expect(at.epoch == 4 && at.taken == 64 && at.trained && at.global_step == 30 &&
                   at.context_step == 11 && at.train_seconds == 2.5,
               "rank 0's position");
        // Rank 0's snapshot, to every rank, to compare with: exported and broadcast as floats.
        const optim::OptimizerSnapshot after = optimizer.export_state();
        const std::vector<float> mine_flat = flat_values(after);
        std::vector<float> root_flat = mine_flat;
        comm.broadcast(std::span(root_flat));
        expect(mine_flat == root_flat, "the optimizer state equals rank 0's");
        std::vector<std::int64_t> counts;
        for (const auto& [name, count] : after.step_counts) counts.push_back(count);
        expect(counts.size() == 2 && counts[0] == 3 && counts[1] == 3, "Adam's step counts are 3");
        std::vector<float> scale{after.loss_scale->scale,
                                 static_cast<float>(after.loss_scale->growth_tracker)};
        std::vector<float> root_scale = scale;
        comm.broadcast(std::span(root_scale));
        expect(scale == root_scale, "the loss scale equals rank 0's");
      }));
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("a leader one step behind takes the state of the lowest rank ahead", "[elastic]") {
  const std::string failures = coltrain::testing::joined(
      coltrain::testing::run_thread_ranks(3, [](comm::Communicator& comm) {
        Net net({.seed = 5});
        Optimizer optimizer(optim::parameters_of(net), optim::Adam({.lr = 1e-2}));
        // Rank 0 never completed a step: its optimizer has no state to hand over.
        take_steps(net, optimizer, comm.rank() == 0 ? 0 : 1, comm.rank());
        const train::ElasticPosition mine{.epoch = 0,
                                          .taken = comm.rank() == 0 ? 0 : 32,
                                          .global_step = comm.rank() == 0 ? 0 : 1,
                                          .context_step = comm.rank() == 0 ? 3u : 5u};
        const int source = train::most_advanced_rank(comm, mine.global_step);
        expect(source == 1, "rank 1, the lowest of the ranks that completed the most steps");
        // Rank 1's snapshot as it was, to compare with (ranks 1 and 2 took steps on different
        // gradients, so their states differ).
        std::vector<float> rank1_flat = flat_values(optimizer.export_state());
        std::int64_t size = static_cast<std::int64_t>(rank1_flat.size());
        comm.broadcast(std::span(&size, 1), 1);
        rank1_flat.resize(static_cast<std::size_t>(size));
        comm.broadcast(std::span(rank1_flat), 1);

        const train::ElasticPosition at = train::share_training_state(comm, optimizer, mine, 1);
        expect(at.taken == 32 && at.global_step == 1 && at.context_step == 5u, "rank 1's position");
        const optim::OptimizerSnapshot after = optimizer.export_state();
        const std::vector<float> flat = flat_values(after);
        expect(!flat.empty() && flat == rank1_flat, "the optimizer state equals rank 1's");
        for (const auto& [name, count] : after.step_counts)
          expect(count == 1, "Adam's step count " + name + " is rank 1's, 1");
      }));
  INFO(failures);
  CHECK(failures.empty());
}

}  // namespace
