#pragma once
// Which CUDA device this process uses, from where its launcher placed it.
//
// Rules, and why:
// - Ordinals count the devices this process can see. The CUDA runtime numbers them within
//   CUDA_VISIBLE_DEVICES, so a launcher that narrows the set (Slurm's --gpus-per-task, Kubernetes'
//   nvidia.com/gpu) is honoured by passing the runtime's device count, without reading it here.
// - A local rank from the launcher (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
//   SLURM_LOCALID; see core/env.hpp) is the ordinal: one rank per device, in node order.
// - Without one (a Kubeflow PyTorchJob sets only RANK) the ordinal is the rank modulo the visible
//   device count, which is the local rank when ranks fill nodes in blocks of that count.
// - One visible device serves every rank on its node: each rank was given its own (one device per
//   task) or the ranks share it on purpose (tests, debugging). Nothing here tells the two apart.
// - More ranks on a node than visible devices, with two or more visible, is a ConfigError naming
//   both counts: some devices would carry two ranks and the others one, a silent, uneven slowdown.
//   It is raised on every rank of the node when the launcher says how many share it.
// - No visible device is a ConfigError.

#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>

#include <string>
#include <utility>

namespace coltrain {

// The CUDA device ordinal (within the visible set) for the process that `env` describes, given
// `visible_devices`, the CUDA runtime's device count. Throws ConfigError when no device is visible
// or a node has more ranks than visible devices; InvalidArgument when the count is negative.
inline int select_cuda_device(const LaunchEnv& env, int visible_devices) {
  ErrorContext context;
  context.rank = env.rank;
  context.operation = "select CUDA device";
  if (visible_devices < 0) {
    throw InvalidArgument("negative CUDA device count " + std::to_string(visible_devices),
                          std::move(context));
  }
  if (visible_devices == 0) {
    throw ConfigError(
        "no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES and that the job "
        "requested GPUs: Slurm --gpus-per-task=1, Kubernetes nvidia.com/gpu)",
        std::move(context));
  }
  if (!env.local_rank_from_launcher) return env.rank % visible_devices;
  if (visible_devices == 1) return 0;

  const std::string launcher(name_of(env.launcher));
  if (env.local_world_size && *env.local_world_size > visible_devices) {
    throw ConfigError(std::to_string(*env.local_world_size) + " ranks per node (" + launcher +
                          ") but " + std::to_string(visible_devices) +
                          " visible CUDA devices: start at most one rank per device, or give "
                          "each rank its own (Slurm --gpus-per-task=1)",
                      std::move(context));
  }
  if (env.local_rank >= visible_devices) {
    throw ConfigError("at least " + std::to_string(env.local_rank + 1) + " ranks per node (" +
                          launcher + " local rank " + std::to_string(env.local_rank) + ") but " +
                          std::to_string(visible_devices) +
                          " visible CUDA devices: start at most one rank per device, or give "
                          "each rank its own (Slurm --gpus-per-task=1)",
                      std::move(context));
  }
  return env.local_rank;
}

}  // namespace coltrain
