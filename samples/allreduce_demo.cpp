// coltrain's demo: allreduce over MPI and over coltrain's own TCP transport across the ranks that
// mpiexec (or srun, or torchrun-style variables) started; every result is checked element by
// element and timed. docs/collectives.md quotes this program.
//
//   mpiexec -n 2 build/samples/allreduce_demo
#include <coltrain/coltrain.hpp>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <vector>

namespace {

using coltrain::comm::Algorithm;
using coltrain::comm::Backend;
using coltrain::comm::Communicator;
using coltrain::comm::ReduceOp;

// Small integers are exact in float, so the sum is the same in any order and is checked exactly.
float contribution(int rank, std::size_t i) { return static_cast<float>(rank + 1 + i % 7); }

float expected_sum(int world_size, std::size_t i) {
  return static_cast<float>(world_size * (world_size + 1) / 2 + world_size * (i % 7));
}

// Times `kIterations` allreduces of each size on `comm` and checks the last one.
int sweep(Communicator& comm, const coltrain::Logger& logger) {
  constexpr int kIterations = 20;
  int total_wrong = 0;
  logger.print_root("backend ", name_of(comm.backend()), ", ", comm.size(), " ranks, f32 sum");
  logger.print_root("       bytes      count  algorithm          time_us   busbw_GB/s   wrong");
  for (std::size_t count = 256; count <= (std::size_t{1} << 22); count *= 16) {
    std::vector<float> input(count), output(count);
    for (std::size_t i = 0; i < count; ++i) input[i] = contribution(comm.rank(), i);

    comm.allreduce(std::span<const float>(input), std::span(output));  // warm-up
    comm.barrier();
    coltrain::Stopwatch watch;
    for (int it = 0; it < kIterations; ++it) {
      comm.allreduce(std::span<const float>(input), std::span(output), ReduceOp::kSum,
                     Algorithm::kAutomatic);
    }
    // The slowest rank decides the time of a collective.
    std::vector<double> seconds{watch.seconds() / kIterations};
    comm.allreduce(std::span(seconds), ReduceOp::kMax);

    std::vector<int> wrong{0};
    for (std::size_t i = 0; i < count; ++i) wrong[0] += output[i] != expected_sum(comm.size(), i);
    comm.allreduce(std::span(wrong));
    total_wrong += wrong[0];

    const double bytes = static_cast<double>(count * sizeof(float));
    const double busbw = bytes / seconds[0] / 1e9 * 2.0 * (comm.size() - 1) / comm.size();
    char line[160];
    std::snprintf(line, sizeof line, "%12.0f %10zu  %-16s %9.1f %12.3f %7d", bytes, count,
                  std::string(name_of(comm.choose(coltrain::comm::Collective::kAllreduce,
                                                  count * sizeof(float))))
                      .c_str(),
                  seconds[0] * 1e6, busbw, wrong[0]);
    logger.print_root(line);
  }
  return total_wrong;
}

}  // namespace

int main() {
  try {
    const coltrain::LaunchEnv env = coltrain::detect_launch_env();
    const coltrain::Logger logger(env.rank, env.world_size);
    logger.print_root("coltrain ", coltrain::BuildConfig::kVersion,
                      " allreduce demo: ", env.world_size, " ranks, launcher ",
                      coltrain::name_of(env.launcher));
    int wrong = 0;
    // MPI needs an MPI launcher (mpiexec, srun); TCP works under any, torchrun-style ones included.
    const bool mpi_launch =
        env.launcher == coltrain::Launcher::kMpich || env.launcher == coltrain::Launcher::kOpenMpi;
    for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
      if (backend == Backend::kMpi && !(coltrain::BuildConfig::kWithMpi && mpi_launch)) continue;
      Communicator comm = Communicator::from_env(backend);
      wrong += sweep(comm, logger);
    }
    logger.print_root(wrong == 0 ? "all results exact" : "WRONG RESULTS");
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
