#pragma once
// LaunchEnv: where this process sits in the job (rank, world size, local rank, rendezvous
// address) and which launcher said so. core/env.hpp reads it from the launcher's variables
// (detect_launch_env) and says by which rules; this header holds the type alone, for the
// declarations that only pass one on.

#include <optional>
#include <string>
#include <string_view>

namespace coltrain {

enum class Launcher { kNone, kTorchrun, kOpenMpi, kMpich, kSlurm };

constexpr std::string_view name_of(Launcher launcher) noexcept {
  switch (launcher) {
    case Launcher::kNone:
      return "none";
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kOpenMpi:
      return "Open MPI";
    case Launcher::kMpich:
      return "MPICH/Hydra";
    case Launcher::kSlurm:
      return "Slurm";
  }
  return "unknown";
}

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Processes on this node; absent when the launcher does not say (Slurm).
  std::optional<int> local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  Launcher launcher = Launcher::kNone;
  // Whether a launcher gave local_rank; otherwise it is the rank, assumed (a Kubeflow PyTorchJob
  // sets no LOCAL_RANK).
  bool local_rank_from_launcher = false;
  // Whether a PMIx server started this process (PMIX_RANK set): srun --mpi=pmix, or Open MPI 5's
  // mpirun. The ranks then come from Slurm's variables, and MPI_Init finds its peers through PMIx.
  bool pmix_server = false;

  bool is_root() const noexcept { return rank == 0; }

  // Whether an MPI process manager started this process, so that MPI_Init joins the others: an MPI
  // launcher, or a PMIx server where no explicit launcher (torchrun's variables) says otherwise.
  bool started_by_mpi() const noexcept {
    return launcher == Launcher::kMpich || launcher == Launcher::kOpenMpi ||
           (pmix_server && (launcher == Launcher::kSlurm || launcher == Launcher::kNone));
  }
};

}  // namespace coltrain
