#pragma once
// The nccl backend: NCCL's own collectives on device buffers (nccl_runner.hpp), or a skip saying
// why not.

#include "buffers.hpp"
#include "options.hpp"
#include "report.hpp"
#include "series.hpp"
#include "timing.hpp"
#include "world.hpp"

#include <coltrain/core/config.hpp>

#if COLTRAIN_WITH_NCCL
#include "../nccl_runner.hpp"
#endif

#include <mpi.h>

#include <string>

namespace coltrain::bench {

template <class T>
void bench_nccl(const Options& options, const World& world, Report& report) {
#if COLTRAIN_WITH_NCCL
  if (options.memory != MemoryKind::kDevice) {
    report.skip("nccl", "NCCL works on GPU memory: add --mem device");
    return;
  }
  if (auto why = agree_unavailable(cuda_unavailable(world.local_size))) {
    report.skip("nccl", *why);
    return;
  }
  NcclCommunicator nccl(MPI_COMM_WORLD, world.local_rank);
  for (const std::string& name : options.algorithms) {
    if (name != "native") {
      report.skip("nccl / " + name, "NCCL picks its own algorithms: ask for native");
      continue;
    }
    const Prepare<T> prepare = [&nccl](Workspace<T>& workspace, const Case& c) {
      const T* in = workspace.input();
      T* out = workspace.output();
      return Prepared{[&nccl, in, out, c] {
                        nccl.launch(c.collective, in, out, c.count, c.block, c.dtype, c.op, c.root);
                      },
                      [&nccl] { nccl.synchronize(); }};
    };
    run_series<T>(options, world, {"nccl", name, runs_in_place(options), {}}, prepare, {}, report);
  }
#else
  (void)options;
  (void)world;
  report.skip("nccl", "not built with NCCL support (configure with CUDA and NCCL found)");
#endif
}

}  // namespace coltrain::bench
