// Collective microbenchmark in the style of nccl-tests: every backend (MPI, coltrain's TCP, NCCL,
// Gloo) and every algorithm measured by one tool with one method, so that the comparison is fair.
//
//   mpiexec -n 2 build/benchmarks/allreduce_bench --backend mpi,tcp,gloo
//       --algo native,ring,tree,halving_doubling,automatic -b 8 -e 128M -f 4 --csv out.csv
//
// Method, per backend, algorithm and size: w warm-up operations, an MPI barrier, then n operations
// back to back; time = elapsed / n, the maximum over ranks. --latency times each operation on its
// own, after a barrier, and adds the median and 99th percentile (the maximum over ranks of each).
// algbw = size / time and busbw = algbw x (allreduce 2(p-1)/p, allgather and reduce_scatter
// (p-1)/p, broadcast and reduce 1) with GB = 1e9 and size the full array, as nccl-tests defines
// them. Inputs are small integers, so every summation order gives the same bits; after the timed
// runs one more operation on fresh inputs is compared element by element, and #wrong sums bad
// elements over ranks. The exit status is 1 when any element is wrong, 2 on an error.
// With --mem device, the mpi and tcp backends run coltrain's collectives through
// Communicator's staging (pinned host memory, pipelined chunks of at most --staging-chunk).
//
// The harness is in collectives/: options, the job, the sizes, exact inputs, buffers, timing,
// the report and the series every backend runs; one file per backend (run_coltrain.hpp for mpi and
// tcp, run_gloo.hpp, run_nccl.hpp), over the Gloo and NCCL adapters (gloo_runner.hpp,
// nccl_runner.hpp).
#include "collectives/buffers.hpp"
#include "collectives/options.hpp"
#include "collectives/report.hpp"
#include "collectives/run_coltrain.hpp"
#include "collectives/run_gloo.hpp"
#include "collectives/run_nccl.hpp"
#include "collectives/world.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/rendezvous/tcp_over_mpi.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <mpi.h>
#include <CLI/CLI.hpp>

#if !COLTRAIN_WITH_MPI
#error "allreduce_bench needs MPI: it launches, synchronises and times its ranks with MPI"
#endif

#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>

namespace coltrain::bench {
namespace {

template <class T>
inline void bench_all(const Options& options, const World& world, Report& report) {
  for (const std::string& backend : options.backends) {
    if (backend == "mpi") {
      Communicator comm = Communicator::mpi(MPI_COMM_WORLD);
      bench_coltrain<T>(options, world, comm, backend, report);
    } else if (backend == "tcp") {
      Communicator comm = coltrain::comm::tcp_over_mpi(MPI_COMM_WORLD);
      bench_coltrain<T>(options, world, comm, backend, report);
    } else if (backend == "gloo") {
      bench_gloo<T>(options, world, report);
    } else {
      bench_nccl<T>(options, world, report);
    }
  }
}

template <class F>
inline void with_element_type(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat32:
      return f(std::type_identity<float>{});
    case DataType::kFloat64:
      return f(std::type_identity<double>{});
    case DataType::kFloat16:
      return f(std::type_identity<coltrain::half>{});
    case DataType::kBFloat16:
      return f(std::type_identity<coltrain::bfloat16>{});
    case DataType::kInt32:
      return f(std::type_identity<std::int32_t>{});
    case DataType::kInt64:
      return f(std::type_identity<std::int64_t>{});
    case DataType::kUInt8:
      break;
  }
  throw coltrain::InvalidArgument("the collectives take no " +
                                  std::string(coltrain::name_of(dtype)));
}

// Checks that need the job: the root among the ranks, a GPU for pinned and device memory.
inline std::optional<std::string> job_problem(const Options& options, const World& world) {
  if (options.root >= world.size) {
    return "--root " + std::to_string(options.root) + " is not a rank of this " +
           std::to_string(world.size) + "-rank job";
  }
#if COLTRAIN_WITH_CUDA
  if (options.memory != MemoryKind::kHost) {
    if (auto why = agree_unavailable(cuda_unavailable(1))) {
      return std::string("--mem ") + name_of(options.memory) + ": " + *why;
    }
  }
#endif
  return std::nullopt;
}

inline int run(int argc, char** argv, const World& world) {
  CLI::App app{
      "Collective microbenchmark: MPI, coltrain's TCP, NCCL and Gloo side by side, "
      "nccl-tests style. Launch with mpiexec -n N."};
  Options options;
  try {
    parse_options(app, options, argc, argv);
  } catch (const CLI::ParseError& e) {
    if (world.rank == 0) return app.exit(e);  // prints help or the error once
    return e.get_exit_code();
  }
  if (auto problem = job_problem(options, world)) {
    if (world.rank == 0) std::fprintf(stderr, "allreduce_bench: %s\n", problem->c_str());
    return 2;
  }
  Report report(options, world);
  report.write_files();  // an unwritable path fails now, not after the sweep
  with_element_type(options.dtype, [&](auto type) {
    bench_all<typename decltype(type)::type>(options, world, report);
  });
  if (world.rank == 0) {
    if (!options.check) {
      std::printf("\n# results not checked (-c 0)\n");
    } else if (report.wrong() == 0) {
      std::printf("\n# every element of every result correct\n");
    } else {
      std::printf("\n# FAILED: %lld wrong elements (see #wrong)\n",
                  static_cast<long long>(report.wrong()));
    }
  }
  return report.wrong() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace coltrain::bench

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int status = 0;
  coltrain::bench::World world;
  try {
    world = coltrain::bench::mpi_world();
    status = coltrain::bench::run(argc, argv, world);
  } catch (const std::exception& e) {
    // Another rank may be blocked in a collective with this one: end the whole job.
    std::fprintf(stderr, "allreduce_bench: rank %d: %s\n", world.rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return status;
}
