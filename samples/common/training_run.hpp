#pragma once
// One data-parallel training run on the CPU, for one model at one precision: how coltrain's
// pieces fit together.
//
//   communicator (MPI or TCP, from the launcher's environment)
//   -> Network<Model, Storage> -> DataParallel (parameters broadcast, gradient buckets)
//   -> PrecisionOptimizer<Policy, Sgd> + learning-rate schedule
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
#include <vector>

namespace sample {

// Trains Model on `train`, validating on `test`, across the ranks the launcher started. Returns the
// process exit status: 0, or 2 when a target accuracy was given and not reached.
template <class Model, class Policy, class TrainTransform, class EvalTransform>
int train_with_policy(const Options& o, const std::string& model_name, ct::comm::Communicator& comm,
                      const ct::data::ImageDataset& train, const ct::data::ImageDataset& test,
                      TrainTransform train_transform, EvalTransform eval_transform) {
  using T = typename Policy::Storage;
  const int rank = comm.rank(), world = comm.size();

  ct::nn::Network<Model, T> net({.threads = o.threads, .seed = o.seed});
  ct::train::DataParallel ddp(net, comm);  // every rank now holds rank 0's weights
  ct::optim::PrecisionOptimizer<Policy, ct::optim::Sgd> sgd(
      ct::optim::parameters_of(net), ct::optim::Sgd({.lr = o.lr,
                                                     .momentum = o.momentum,
                                                     .weight_decay = o.weight_decay,
                                                     .nesterov = o.nesterov}));

  // Each rank trains on its shard, reshuffled every epoch; validation shards are disjoint.
  ct::data::DistributedSampler sampler(
      train.size(), {.num_replicas = world, .rank = rank, .shuffle = true, .seed = o.seed});
  ct::data::Loader<T, TrainTransform> train_loader(train, sampler, {.batch_size = o.batch_size},
                                                   train_transform);
  std::vector<std::int64_t> shard;
  for (std::int64_t i = rank; i < test.size(); i += world) shard.push_back(i);
  ct::data::Loader<T, EvalTransform> test_loader(test, shard, {.batch_size = 256}, eval_transform);

  ct::train::Trainer trainer(
      net, sgd, ddp, make_schedule(o, train_loader.batches_per_epoch()),
      {.epochs = o.epochs,
       .target_accuracy = o.target_accuracy,
       .log_dir = o.log_dir,
       .checkpoint_dir = o.checkpoint_dir,
       .checkpoint_every = o.checkpoint_every,
       .model_name = model_name,
       .resume = o.resume,
       .progress = o.progress ? std::nullopt : std::optional<bool>(false),
       .config = to_json(o, model_name, world, std::string(ct::comm::name_of(comm.backend())))});
  if (rank == 0)
    std::cout << model_name << ": " << decltype(net)::kParameterCount << " parameters, " << world
              << (world == 1 ? " rank" : " ranks") << " (" << ct::comm::name_of(comm.backend())
              << ") x " << o.threads << (o.threads == 1 ? " thread" : " threads") << ", "
              << train.size() << " training and " << test.size() << " validation images, "
              << Policy::kName << "\n";
  const ct::train::FitResult result = trainer.fit(train_loader, test_loader);
  return o.target_accuracy && !result.time_to_target ? 2 : 0;
}

}  // namespace sample
