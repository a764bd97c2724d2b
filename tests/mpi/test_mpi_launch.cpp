// Under mpiexec, the launcher's environment and MPI must agree on who is who, and MPI failures
// become BackendError with MPI's own message.
#include <mpi.h>
#include <catch2/catch.hpp>

#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>

using Catch::Matchers::Contains;

namespace {
int world_rank() {
  int rank = -1;
  COLTRAIN_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}
int world_size() {
  int size = -1;
  COLTRAIN_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}
}  // namespace

TEST_CASE("launch environment under mpiexec matches MPI's rank and size", "[mpi][env]") {
  const coltrain::LaunchEnv env = coltrain::detect_launch_env();
  CHECK(env.rank == world_rank());
  CHECK(env.world_size == world_size());
  CHECK(env.launcher != coltrain::Launcher::kNone);
  // All ranks of these tests run on this host.
  CHECK(env.local_rank == world_rank());
}

TEST_CASE("COLTRAIN_CHECK_MPI throws MPI's message, naming the failed call", "[mpi][error]") {
  MPI_Comm comm = MPI_COMM_NULL;
  COLTRAIN_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  COLTRAIN_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int value = 0;
  const int invalid_rank = world_size() + 5;
  try {
    COLTRAIN_CHECK_MPI(MPI_Send(&value, 1, MPI_INT, invalid_rank, 0, comm));
    FAIL("MPI_Send to an invalid rank succeeded");
  } catch (const coltrain::BackendError& e) {
    CHECK(e.library() == "MPI");
    CHECK(e.code() != MPI_SUCCESS);
    CHECK_THAT(e.what(), Contains("MPI_Send") && Contains("test_mpi_launch.cpp:"));
  }
  COLTRAIN_CHECK_MPI(MPI_Comm_free(&comm));
}
