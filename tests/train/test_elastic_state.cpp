// train::share_training_state (coltrain/train/elastic.hpp): after the ranks changed, every rank
// takes rank 0's position and optimizer state (Adam's moments and step counts, fp32 masters, the
// loss scale) from memory. 3 TCP ranks as threads of this process; rank 0 took more steps than the
// others, as a leader one collective ahead may have.

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
        std::vector<float> mine_flat, root_flat;
        for (const auto* group : {&after.state, &after.masters})
          for (const auto& t : *group)
            mine_flat.insert(mine_flat.end(), t.values.begin(), t.values.end());
        root_flat = mine_flat;
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

}  // namespace
