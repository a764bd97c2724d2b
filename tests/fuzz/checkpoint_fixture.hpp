#pragma once
// The run whose checkpoint fuzz_checkpoint loads with its sidecar replaced by the fuzz input:
// fp16 with Adam, so that the sidecar has every field a loader reads (loss scaler, fp32 masters,
// per-parameter step counts). write_seed_corpora saves the same checkpoint for the seed sidecar;
// everything in it is fixed, so the data files' recorded sizes match.

// The layers' own headers, not coltrain/nn.hpp: clang 14 cannot compile BatchNorm2d and Dropout,
// whose template parameters are doubles (C++20; clang supports them from version 18).
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/sequential.hpp>
#include <coltrain/optim/adam.hpp>
#include <coltrain/optim/network_parameters.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/train/checkpoint.hpp>

#include <cstdint>
#include <filesystem>
#include <vector>

namespace coltrain::fuzz {

struct CheckpointFixture {
  using Net = nn::Sequential<nn::Input<3>, nn::Named<"fc", nn::Linear<2>>>;
  using Storage = optim::MixedFp16::Storage;
  static constexpr std::uint64_t kSeed = 7;

  CheckpointFixture()
      : net({.threads = 1, .seed = kSeed}),
        params(optim::parameters_of(net)),
        optimizer(params, optim::Adam{}) {}

  // Saves a checkpoint after one step (so that the optimizer has state) into `dir`.
  train::CheckpointFiles save(const std::filesystem::path& dir) {
    optimizer.step(1e-3);
    return train::save_checkpoint(dir, net, optimizer, {.epoch = 1, .global_step = 1},
                                  {.model_name = "fuzz"});
  }

  nn::Network<Net, Storage> net;
  std::vector<optim::TypedParamRef<Storage>> params;
  optim::PrecisionOptimizer<optim::MixedFp16, optim::Adam> optimizer;
};

}  // namespace coltrain::fuzz
