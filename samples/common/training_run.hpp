#pragma once
// One data-parallel training run on the CPU, for one model at one precision: how coltrain's
// pieces fit together.
//
//   communicator (MPI or TCP, from the launcher's environment)
//   -> Network<Model, Storage> -> DataParallel (parameters broadcast, gradient buckets)
//   -> PrecisionOptimizer<Policy, Sgd> (or ZeroOptimizer: --zero 1) + learning-rate schedule
//   -> DistributedSampler + Loader (background thread) for each rank's shard
//   -> Trainer::fit (epoch lines, metrics, profile, run records, checkpoints, resume)
//
// Each instantiation is the whole training stack, so a one-line build compiles one of them
// (sample_options.hpp).

#include "sample_options.hpp"

#include <coltrain/coltrain.hpp>

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace sample {

// Trains Model on `train`, validating on `test`, across the ranks the launcher started. Returns the
// process exit status: 0, or 2 when a target accuracy was given and not reached.
// `comm` is a Communicator, or an ElasticGroup (--elastic): then the trainer keeps its own
// DataParallel, rebuilt whenever the ranks change.
template <class Model, class Policy, class Group, class TrainTransform, class EvalTransform>
int train_with_policy(const Options& o, const std::string& model_name, Group& comm,
                      const ct::data::ImageDataset& train, const ct::data::ImageDataset& test,
                      TrainTransform train_transform, EvalTransform eval_transform) {
  using T = typename Policy::Storage;
  const int rank = comm.rank(), world = comm.size();

  constexpr bool kElastic = std::is_same_v<Group, ct::comm::ElasticGroup>;
  ct::nn::Network<Model, T> net({.threads = o.threads, .seed = o.seed});
  // Every rank now holds rank 0's weights (elastic: once the trainer is built).
  std::optional<ct::train::DataParallel<decltype(net)>> ddp;
  ct::train::DataParallelOptions ddp_options;
  ddp_options.compression = ct::comm::parse_wire_compression(o.grad_compression);
  ddp_options.zero_stage = o.zero;
  if (o.global_batch > 0) ddp_options.micro_shards = o.micro_shards;
  if constexpr (!kElastic) ddp.emplace(net, comm, ddp_options);
  const ct::optim::Sgd::Options sgd_options{
      .lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay, .nesterov = o.nesterov};
  // The whole optimizer on every rank, or (--zero 1) each rank's shard of it.
  std::optional<ct::optim::PrecisionOptimizer<Policy, ct::optim::Sgd>> sgd;
  std::optional<ct::train::ZeroOptimizer<decltype(net), Policy, ct::optim::Sgd>> zero;
  if constexpr (!kElastic) {
    if (o.zero == 1) zero.emplace(*ddp, ct::optim::Sgd(sgd_options));
  }
  if (!zero) sgd.emplace(ct::optim::parameters_of(net), ct::optim::Sgd(sgd_options));

  // Each rank trains on its shard, reshuffled every epoch; validation shards are disjoint. Under
  // --global-batch each rank's share of a step is its block of the global batch.
  ct::data::DistributedSampler sampler(train.size(), {.num_replicas = world,
                                                      .rank = rank,
                                                      .shuffle = true,
                                                      .seed = o.seed,
                                                      .global_batch = o.global_batch});
  const std::int64_t batch_size = o.global_batch > 0 ? o.global_batch / world : o.batch_size;
  ct::data::Loader<T, TrainTransform> train_loader(train, sampler, {.batch_size = batch_size},
                                                   train_transform);
  std::vector<std::int64_t> shard;
  for (std::int64_t i = rank; i < test.size(); i += world) shard.push_back(i);
  ct::data::Loader<T, EvalTransform> test_loader(test, shard, {.batch_size = 256}, eval_transform);

  std::string backend = "tcp (elastic)";
  if constexpr (!kElastic) backend = ct::comm::name_of(comm.backend());
  ct::train::TrainerOptions options = trainer_options(o, model_name, world, backend);
  auto schedule = make_schedule(o, world, train_loader.batches_per_epoch());
  using Trainer = ct::train::Trainer<decltype(net), Policy, ct::optim::Sgd>;
  std::optional<Trainer> trainer;
  if constexpr (kElastic)
    trainer.emplace(net, *sgd, comm, std::move(schedule), std::move(options), ddp_options);
  else if (zero)
    trainer.emplace(net, *zero, *ddp, std::move(schedule), std::move(options));
  else
    trainer.emplace(net, *sgd, *ddp, std::move(schedule), std::move(options));
  if (rank == 0) {
    std::cout << model_name << ": " << decltype(net)::kParameterCount << " parameters, " << world
              << (world == 1 ? " rank" : " ranks") << " (" << backend << ") x " << o.threads
              << (o.threads == 1 ? " thread" : " threads") << ", " << train.size()
              << " training and " << test.size() << " validation images, " << Policy::kName
              << (zero ? ", ZeRO-1 (optimizer state sharded)" : "");
    if (o.global_batch > 0)
      std::cout << ", global batch " << o.global_batch << " in " << o.micro_shards
                << " micro-shards (the same bits on any world size that fits)";
    if (o.grad_accum > 1) std::cout << ", " << o.grad_accum << " batches per optimizer step";
    if (o.scale_lr) std::cout << ", learning rate scaled to " << effective_lr(o, world);
    std::cout << "\n";
  }
  const ct::train::FitResult result = trainer->fit(train_loader, test_loader);
  if (o.eval_only)
    return o.target_accuracy && result.validation.top1() < *o.target_accuracy ? 2 : 0;
  return o.target_accuracy && !result.time_to_target ? 2 : 0;
}

}  // namespace sample
