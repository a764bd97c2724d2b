#pragma once
// Which backend Communicator::from_env builds, as a pure function of what the caller asked for,
// COLTRAIN_BACKEND, the memory the caller will hand it, the launcher and what this build has; kept
// apart from the environment so that every combination is testable on one machine.

#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace coltrain::comm {

// What the build has and how the process was started.
struct BackendEnvironment {
  bool with_mpi = BuildConfig::kWithMpi;
  bool with_nccl = BuildConfig::kWithNccl;
  bool mpi_launch = false;  // an MPI launcher (mpiexec, mpirun) started this process
};

struct BackendChoice {
  Backend backend = Backend::kTcp;  // what device buffers run on
  Backend host = Backend::kTcp;     // what host buffers run on, and NCCL's bootstrap: MPI or TCP
};

// The backend is `requested`, else `env_backend` (COLTRAIN_BACKEND's value; empty when unset),
// else NCCL when `memory` is kDevice and the build has NCCL, else MPI when the build has it and an
// MPI launcher started the process, else TCP. Host buffers go to the backend itself, or, under
// NCCL, to that MPI-or-TCP default. Throws ConfigError for a backend the build lacks, naming where
// the request came from.
inline BackendChoice choose_backend(std::optional<Backend> requested, std::string_view env_backend,
                                    Memory memory, const BackendEnvironment& environment) {
  std::string source = "the requested backend";
  if (!requested && !env_backend.empty()) {
    source = "COLTRAIN_BACKEND=" + std::string(env_backend);
    try {
      requested = parse_backend(env_backend);
    } catch (const InvalidArgument& e) {
      throw ConfigError(source + ": " + e.message());
    }
  }
  const Backend host_default =
      environment.with_mpi && environment.mpi_launch ? Backend::kMpi : Backend::kTcp;
  BackendChoice choice;
  choice.backend = requested.value_or(
      memory == Memory::kDevice && environment.with_nccl ? Backend::kNccl : host_default);
  choice.host = choice.backend == Backend::kNccl ? host_default : choice.backend;
  if (choice.backend == Backend::kMpi && !environment.with_mpi) {
    throw ConfigError(source +
                      ": the MPI backend was requested, but this program was built without MPI "
                      "(compile with mpicxx, or set COLTRAIN_BACKEND=tcp)");
  }
  if (choice.backend == Backend::kNccl && !environment.with_nccl) {
    throw ConfigError(source +
                      ": the NCCL backend was requested, but this program was built without NCCL "
                      "(build with COLTRAIN_WITH_NCCL=1, or set COLTRAIN_BACKEND=mpi or tcp, which "
                      "stage device buffers through host memory)");
  }
  return choice;
}

}  // namespace coltrain::comm
