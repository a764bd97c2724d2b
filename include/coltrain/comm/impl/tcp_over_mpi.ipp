// tcp_over_mpi(). Header-only builds include this file at the end of
// comm/rendezvous/tcp_over_mpi.hpp; with COLTRAIN_SEPARATE_COMPILATION only <coltrain/src.hpp>
// includes it (in MPI builds).
#pragma once

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/tcp_over_mpi.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <filesystem>
#include <string>

namespace coltrain::comm {

COLTRAIN_DECL Communicator tcp_over_mpi(MPI_Comm comm, CommOptions options) {
  LaunchEnv env = detect_launch_env();
  COLTRAIN_CHECK_MPI(MPI_Comm_rank(comm, &env.rank));
  COLTRAIN_CHECK_MPI(MPI_Comm_size(comm, &env.world_size));
  MPI_Comm host = MPI_COMM_NULL;
  COLTRAIN_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
  int local_size = 1;
  COLTRAIN_CHECK_MPI(MPI_Comm_rank(host, &env.local_rank));
  COLTRAIN_CHECK_MPI(MPI_Comm_size(host, &local_size));
  COLTRAIN_CHECK_MPI(MPI_Comm_free(&host));
  env.local_world_size = local_size;
  env.local_rank_from_launcher = true;
  ErrorContext context;
  context.rank = env.rank;
  context.operation = "TCP communicator over MPI";

  if (local_size == env.world_size && options.port_file.empty()) {
    // Rank 0's process id and a count name the file, so two communicators (of this job or of a
    // concurrent one) never share it.
    static std::atomic<int> made{0};
    const int serial = made++;
    std::array<char, 512> name{};
    if (env.rank == 0) {
      const std::string path =
          (std::filesystem::temp_directory_path() /
           ("coltrain-" + std::to_string(::getpid()) + "-" + std::to_string(serial) + ".port"))
              .string();
      if (path.size() >= name.size()) {
        throw ConfigError("the temporary directory's path is too long for a port file: " + path,
                          context);
      }
      std::copy(path.begin(), path.end(), name.begin());
    }
    COLTRAIN_CHECK_MPI(MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, comm));
    options.port_file = name.data();
    env.master_port = 0;
    if (options.job_id.empty())
      options.job_id = std::filesystem::path(options.port_file).filename().string();
    return Communicator::tcp(env, options);
  }
  if (!detail::nonempty_env("MASTER_ADDR")) {
    std::array<char, MPI_MAX_PROCESSOR_NAME> name{};
    int length = 0;
    if (env.rank == 0) COLTRAIN_CHECK_MPI(MPI_Get_processor_name(name.data(), &length));
    COLTRAIN_CHECK_MPI(MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, comm));
    env.master_addr = name.data();
  }
  return Communicator::tcp(env, options);
}

}  // namespace coltrain::comm
