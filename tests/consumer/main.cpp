// A program that uses coltrain as a downstream code would. It is built by CMake (find_package and
// add_subdirectory) and by bare compiler lines (mpicxx, g++), and checks its own results.
#include <coltrain/coltrain.hpp>

#if COLTRAIN_WITH_MPI
#include <mpi.h>
#endif

#include <cstdio>
#include <exception>

namespace {

// Every rank contributes rank + 1 as an fp16 value; the sum 1 + 2 + ... + n is exact in fp16 for the
// world sizes the tests use.
int run(int mpi_rank, int mpi_size) {
  const coltrain::LaunchEnv env = coltrain::detect_launch_env();
  if (env.rank != mpi_rank || env.world_size != mpi_size) {
    std::fprintf(stderr, "launch env says rank %d of %d, MPI says %d of %d\n", env.rank,
                 env.world_size, mpi_rank, mpi_size);
    return 1;
  }
  const coltrain::half mine(static_cast<float>(env.rank + 1));
  float sum = static_cast<float>(mine);
#if COLTRAIN_WITH_MPI
  const float contribution = sum;
  COLTRAIN_CHECK_MPI(MPI_Allreduce(&contribution, &sum, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
#endif
  const float expected = static_cast<float>(env.world_size * (env.world_size + 1) / 2);
  if (static_cast<float>(coltrain::half(sum)) != expected) {
    std::fprintf(stderr, "rank %d: sum %g, expected %g\n", env.rank, sum, expected);
    return 1;
  }
  const coltrain::Logger logger(env.rank, env.world_size);
  logger.print_root("consumer ok: coltrain ", coltrain::BuildConfig::kVersion, ", ", env.world_size,
                    " rank(s), launcher ", coltrain::name_of(env.launcher), ", MPI ",
                    coltrain::BuildConfig::kWithMpi ? "on" : "off", ", CUDA ",
                    coltrain::BuildConfig::kWithCuda ? "on" : "off");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = 0;
  int size = 1;
#if COLTRAIN_WITH_MPI
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
#else
  (void)argc;
  (void)argv;
#endif
  int status = 1;
  try {
    status = run(rank, size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
#if COLTRAIN_WITH_MPI
  MPI_Finalize();
#endif
  return status;
}
