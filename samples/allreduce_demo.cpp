// coltrain's demo at this stage: an allreduce sweep over MPI across the ranks that mpiexec started,
// checked element by element and timed, with the launch environment detected the way every coltrain
// program does it.
//
//   mpiexec -n 2 build/samples/allreduce_demo
#include <coltrain/coltrain.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <vector>

namespace {

// Small integers are exact in float, so the sum is the same in any order and is checked exactly.
float contribution(int rank, std::size_t i) { return static_cast<float>(rank + 1 + i % 7); }

float expected_sum(int world_size, std::size_t i) {
  return static_cast<float>(world_size * (world_size + 1) / 2 + world_size * (i % 7));
}

int run() {
  const coltrain::LaunchEnv env = coltrain::detect_launch_env();
  int mpi_rank = 0;
  int mpi_size = 1;
  COLTRAIN_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank));
  COLTRAIN_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size));
  if (env.rank != mpi_rank || env.world_size != mpi_size) {
    throw coltrain::ConfigError("the launch environment (rank " + std::to_string(env.rank) + " of " +
                                std::to_string(env.world_size) + ") disagrees with MPI (rank " +
                                std::to_string(mpi_rank) + " of " + std::to_string(mpi_size) + ")");
  }
  const coltrain::Logger logger(env.rank, env.world_size);
  logger.print_root("coltrain ", coltrain::BuildConfig::kVersion, " allreduce demo: ", env.world_size,
                    " ranks, launcher ", coltrain::name_of(env.launcher), ", f32 sum over MPI");
  logger.print_root("       bytes      count   time_us   algbw_GB/s   busbw_GB/s   wrong");

  constexpr int kIterations = 20;
  int total_wrong = 0;
  for (std::size_t count = 256; count <= (std::size_t{1} << 22); count *= 16) {
    std::vector<float> input(count), output(count);
    for (std::size_t i = 0; i < count; ++i) input[i] = contribution(env.rank, i);

    COLTRAIN_CHECK_MPI(MPI_Allreduce(input.data(), output.data(), static_cast<int>(count), MPI_FLOAT,
                                     MPI_SUM, MPI_COMM_WORLD));  // warm-up
    COLTRAIN_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
    coltrain::Stopwatch watch;
    for (int it = 0; it < kIterations; ++it) {
      COLTRAIN_CHECK_MPI(MPI_Allreduce(input.data(), output.data(), static_cast<int>(count),
                                       MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    }
    double seconds = watch.seconds() / kIterations;
    // The slowest rank decides the time of a collective.
    COLTRAIN_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));

    int wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += output[i] != expected_sum(env.world_size, i);
    COLTRAIN_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    total_wrong += wrong;

    const double bytes = static_cast<double>(count * sizeof(float));
    const double algbw = bytes / seconds / 1e9;
    const double busbw = algbw * 2.0 * (env.world_size - 1) / env.world_size;
    char line[128];
    std::snprintf(line, sizeof line, "%12.0f %10zu %9.1f %12.3f %12.3f %7d", bytes, count,
                  seconds * 1e6, algbw, busbw, wrong);
    logger.print_root(line);
  }
  logger.print_root(total_wrong == 0 ? "all results exact" : "WRONG RESULTS");
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  COLTRAIN_CHECK_MPI(MPI_Init(&argc, &argv));
  int status = 1;
  try {
    status = run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
