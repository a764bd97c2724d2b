#pragma once
// The gloo backend: Gloo's own allreduce and alltoall (gloo_runner.hpp) in the same series, or a
// skip saying why not.

#include "buffers.hpp"
#include "exact_inputs.hpp"
#include "options.hpp"
#include "report.hpp"
#include "series.hpp"
#include "timing.hpp"

#include <coltrain/comm/options.hpp>
#include <coltrain/comm/types.hpp>

// Gloo is optional; CMake says whether it links it, a hand-made build finds it by its header.
#ifndef COLTRAIN_BENCH_WITH_GLOO
#if __has_include(<gloo/allreduce_ring_chunked.h>)
#define COLTRAIN_BENCH_WITH_GLOO 1
#else
#define COLTRAIN_BENCH_WITH_GLOO 0
#endif
#endif
#if COLTRAIN_BENCH_WITH_GLOO
#include "../gloo_runner.hpp"
#endif

#include <mpi.h>

#include <memory>
#include <string>

namespace coltrain::bench {

template <class T>
void bench_gloo(const Options& options, const World& world, Report& report) {
#if COLTRAIN_BENCH_WITH_GLOO
  if (options.collective != Collective::kAllreduce && options.collective != Collective::kAlltoall) {
    report.skip("gloo", "the harness runs Gloo's allreduce and alltoall only");
    return;
  }
  if (options.memory == MemoryKind::kDevice) {
    report.skip("gloo", "Gloo's TCP allreduce takes host memory (--mem device)");
    return;
  }
  const bool alltoall = options.collective == Collective::kAlltoall;
  if (std::string why = gloo_unsupported(options.dtype, options.op); !why.empty() && !alltoall) {
    report.skip("gloo", why);
    return;
  }
  // f16 and bf16 were turned away above; this keeps Gloo's templates from being built for them.
  if constexpr (!kNarrowFloat<T>) {
    const auto context = std::make_shared<GlooMpiContext>(
        MPI_COMM_WORLD, coltrain::comm::comm_options_from_env().timeout);
    if (alltoall) {
      if (runs_in_place(options)) {
        report.skip("gloo", "Gloo's alltoall works out of place only");
        return;
      }
      const Prepare<T> prepare = [&context](Workspace<T>& workspace, const Case& c) {
        return Prepared{
            make_gloo_alltoall<T>(context, workspace.input(), workspace.output(), c.count)};
      };
      run_series<T>(options, world, {"gloo", "native", false, "Gloo's alltoall (gloo::alltoall)"},
                    prepare, {}, report);
      return;
    }
    for (const std::string& name : options.algorithms) {
      const auto gloo_algorithm = gloo_allreduce_for(coltrain::comm::parse_algorithm(name));
      if (!gloo_algorithm) {
        report.skip("gloo / " + name,
                    "Gloo's counterparts are ring (allreduce_ring_chunked) and halving_doubling "
                    "(allreduce_halving_doubling)");
        continue;
      }
      const Prepare<T> prepare = [&context, gloo_algorithm](Workspace<T>& workspace,
                                                            const Case& c) {
        return Prepared{
            make_gloo_allreduce<T>(context, *gloo_algorithm, workspace.output(), c.count, c.op)};
      };
      const Series series{
          "gloo", name, true,
          std::string("Gloo's ") + name_of(*gloo_algorithm) + ", which works in place only"};
      run_series<T>(options, world, series, prepare, {}, report);
    }
  }
#else
  (void)options;
  (void)world;
  report.skip("gloo", "not built with Gloo (install Debian's libgloo-dev and reconfigure)");
#endif
}

}  // namespace coltrain::bench
