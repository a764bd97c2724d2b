#pragma once
// How the trainer's optimizer state is spread over the ranks, as two strategies with one interface:
// ReplicatedOptimizer (plain data parallelism: every rank holds and steps all of it) and
// ShardedOptimizer (ZeRO-1, train/zero_optimizer.hpp: each rank steps its shard, then every rank's
// values go to all). train::Trainer steps, clips and checkpoints through whichever it was given,
// so its loop has no ZeRO branches.

#include <coltrain/comm/types.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/zero_optimizer.hpp>

#include <filesystem>
#include <span>
#include <string>

namespace coltrain::train {

namespace detail {

// What both strategies do alike: save and load the optimizer they hold, through the
// save_checkpoint / load_checkpoint overloads for its type.
template <class Net, class Held>
class HeldOptimizer {
 public:
  void save(const std::filesystem::path& dir, Net& network, const TrainingState& state,
            const CheckpointOptions& options) {
    save_checkpoint(dir, network, optimizer_, state, options);
  }
  TrainingState load(const std::filesystem::path& source, Net& network,
                     const CheckpointOptions& options) {
    return load_checkpoint(source, network, optimizer_, options);
  }

 protected:
  explicit HeldOptimizer(Held& optimizer) : optimizer_(optimizer) {}
  Held& optimizer_;
};

}  // namespace detail

template <class Net, class Policy, class Optimizer>
class ReplicatedOptimizer
    : public detail::HeldOptimizer<Net, optim::PrecisionOptimizer<Policy, Optimizer>> {
 public:
  using Local = optim::PrecisionOptimizer<Policy, Optimizer>;

  explicit ReplicatedOptimizer(Local& optimizer) : detail::HeldOptimizer<Net, Local>(optimizer) {}

  Local& local() { return this->optimizer_; }
  void apply(bool finite, double lr) { this->optimizer_.apply(finite, lr); }
  // Whether every rank's gradients are finite, from this rank's check of all of them: the same
  // answer everywhere without communication where the ranks hold the same bits.
  template <class Ddp>
  bool all_finite(Ddp& ddp, bool local_finite) {
    return ddp.gradients_identical_on_every_rank() ? local_finite : ddp.all_finite(local_finite);
  }
  // The squared global norm of the averaged gradients, which every rank holds whole.
  template <class Ddp>
  double gradient_sum_of_squares(Ddp&) {
    return this->optimizer_.gradient_sum_of_squares();
  }
  // Whether rank `rank` takes part in writing a checkpoint: rank 0 alone.
  static bool saves_on(int rank) { return rank == 0; }
};

template <class Net, class Policy, class Optimizer>
class ShardedOptimizer : public detail::HeldOptimizer<Net, ZeroOptimizer<Net, Policy, Optimizer>> {
 public:
  using Local = optim::PrecisionOptimizer<Policy, Optimizer>;

  explicit ShardedOptimizer(ZeroOptimizer<Net, Policy, Optimizer>& optimizer)
      : detail::HeldOptimizer<Net, ZeroOptimizer<Net, Policy, Optimizer>>(optimizer) {}

  Local& local() { return this->optimizer_.local(); }
  void apply(bool finite, double lr) { this->optimizer_.apply(finite, lr); }
  // Each rank checked its shard alone: the ranks agree. Collective.
  template <class Ddp>
  bool all_finite(Ddp& ddp, bool local_finite) {
    return ddp.all_finite(local_finite);
  }
  // Each rank holds its shard of the averaged gradients: the shards' sums, summed. Collective.
  // In deterministic mode every rank holds all of them: summed here, in the order and with the
  // rounding of the unsharded optimizer, so that the norm (and the bits of the run) does not
  // depend on where the shards begin, that is on the world size.
  template <class Ddp>
  double gradient_sum_of_squares(Ddp& ddp) {
    if (ddp.deterministic()) {
      double sum = 0;
      const Local& local = this->optimizer_.local();
      ddp.network().visit_parameters([&](const std::string&, const auto& parameter) {
        sum = local.add_unscaled_squares(sum, parameter.grad.span());
      });
      return sum;
    }
    double sum = this->optimizer_.local().gradient_sum_of_squares();
    ddp.allreduce(std::span<double>(&sum, 1), comm::ReduceOp::kSum);
    return sum;
  }
  // Every rank gathers its shard into the checkpoint, which rank 0 writes in the unsharded format
  // (so it resumes at any world size).
  static bool saves_on(int) { return true; }
};

}  // namespace coltrain::train
