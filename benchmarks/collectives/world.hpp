#pragma once
// The job allreduce_bench runs in: its ranks, launched and synchronised by MPI, and which of them
// share a node.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <mpi.h>

#include <optional>
#include <string>

namespace coltrain::bench {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the ranks on this node
  int local_size = 1;
};

inline World mpi_world() {
  World world;
  COLTRAIN_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world.rank));
  COLTRAIN_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world.size));
  MPI_Comm node = MPI_COMM_NULL;
  COLTRAIN_CHECK_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  COLTRAIN_CHECK_MPI(MPI_Comm_rank(node, &world.local_rank));
  COLTRAIN_CHECK_MPI(MPI_Comm_size(node, &world.local_size));
  COLTRAIN_CHECK_MPI(MPI_Comm_free(&node));
  return world;
}

inline void barrier() { COLTRAIN_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD)); }

#if COLTRAIN_WITH_CUDA
// Every rank learns whether any rank found the GPU unusable. Rank 0, which prints, gives its own
// reason where it has one.
inline std::optional<std::string> agree_unavailable(const std::optional<std::string>& local) {
  const int mine = local ? 1 : 0;
  int any = 0;
  COLTRAIN_CHECK_MPI(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (!any) return std::nullopt;
  return local ? *local : std::string("unavailable on another rank");
}
#endif

}  // namespace coltrain::bench
