#pragma once
// The sample trainers on a GPU (--device cuda), compiled only by nvcc: the same run as
// train_with_policy in training_sample.hpp, with the GPU's pieces in place of the CPU's:
//
//   cudaSetDevice(LOCAL_RANK, or RANK modulo the visible devices)
//   -> communicator for device buffers (NCCL when built with it, else MPI/TCP through staging)
//   -> Network<Model, Storage, Cuda> -> DeviceDataParallel
//   -> DevicePrecisionOptimizer<Policy, Sgd> (fp32 masters and loss scale on the device)
//   -> host Loader (background thread) -> DeviceTrainer (pinned copies ahead of each step)

#include "sample_options.hpp"

#include <coltrain/cuda/nn.cuh>
#include <coltrain/cuda/optim/device_optimizer.cuh>
#include <coltrain/cuda/train/data_parallel.cuh>
#include <coltrain/cuda/train/trainer.cuh>

#include <cuda_runtime.h>

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace sample {

template <class Model, class Policy, class TrainTransform, class EvalTransform>
int train_classifier_on_cuda(const Options& o, const std::string& model_name,
                             ct::comm::Communicator& comm, int cuda_device,
                             const ct::data::ImageDataset& train,
                             const ct::data::ImageDataset& test, TrainTransform train_transform,
                             EvalTransform eval_transform) {
  using T = typename Policy::Storage;
  const int rank = comm.rank(), world = comm.size();
  COLTRAIN_CHECK_CUDA(cudaSetDevice(cuda_device));

  ct::nn::Network<Model, T, ct::tensor::Cuda> net({.seed = o.seed});
  ct::train::DeviceDataParallel ddp(net, comm);  // every rank now holds rank 0's weights
  // Built after the broadcast, so that the fp32 master weights are rank 0's too.
  ct::optim::DevicePrecisionOptimizer<Policy, ct::optim::Sgd> sgd(
      net, ct::optim::Sgd({.lr = o.lr,
                           .momentum = o.momentum,
                           .weight_decay = o.weight_decay,
                           .nesterov = o.nesterov}));

  ct::data::DistributedSampler sampler(
      train.size(), {.num_replicas = world, .rank = rank, .shuffle = true, .seed = o.seed});
  ct::data::Loader<T, TrainTransform> train_loader(train, sampler, {.batch_size = o.batch_size},
                                                   train_transform);
  std::vector<std::int64_t> shard;
  for (std::int64_t i = rank; i < test.size(); i += world) shard.push_back(i);
  ct::data::Loader<T, EvalTransform> test_loader(test, shard, {.batch_size = 1024},
                                                 eval_transform);

  ct::train::TrainerOptions options =
      trainer_options(o, model_name, world, std::string(ct::comm::name_of(comm.backend())));
  options.cuda_graph = o.cuda_graph;
  ct::train::DeviceTrainer trainer(
      net, sgd, ddp, make_schedule(o, world, train_loader.batches_per_epoch()), std::move(options));
  if (rank == 0) {
    cudaDeviceProp properties{};
    COLTRAIN_CHECK_CUDA(cudaGetDeviceProperties(&properties, cuda_device));
    std::cout << model_name << ": " << decltype(net)::kParameterCount << " parameters, " << world
              << (world == 1 ? " rank" : " ranks") << " (" << ct::comm::name_of(comm.backend())
              << ") on " << properties.name << (o.cuda_graph ? " (CUDA graph)" : "") << ", "
              << train.size() << " training and " << test.size() << " validation images, "
              << Policy::kName << "\n";
  }
  const ct::train::FitResult result = trainer.fit(train_loader, test_loader);
  return o.target_accuracy && !result.time_to_target ? 2 : 0;
}

}  // namespace sample
