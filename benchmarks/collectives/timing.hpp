#pragma once
// How one collective at one size is timed: warm-up, a barrier, back-to-back operations (or each
// alone with --latency), the slowest rank's time; and the bus bandwidth factors of nccl-tests.

#include "options.hpp"
#include "world.hpp"

#include <coltrain/comm/types.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

namespace coltrain::bench {

// One collective at one size, ready to run. launch() issues one operation; finish() waits until
// everything launched is done (a GPU stream); on the CPU backends launch() returns when it is done.
struct Prepared {
  std::function<void()> launch;
  std::function<void()> finish = [] {};
};

struct Timing {
  double mean_us = 0;
  std::optional<double> p50_us;
  std::optional<double> p99_us;
};

// The sample at quantile q of sorted samples, by the nearest-rank method.
inline double quantile(const std::vector<double>& sorted, double q) {
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

inline Timing measure(const Prepared& op, const Options& options) {
  for (int i = 0; i < options.warmup; ++i) op.launch();
  op.finish();
  barrier();
  double local[3] = {0, 0, 0};
  if (options.latency) {
    std::vector<double> samples(static_cast<std::size_t>(options.iterations));
    for (double& sample : samples) {
      barrier();
      coltrain::Stopwatch watch;
      op.launch();
      op.finish();
      sample = watch.microseconds();
    }
    double total = 0;
    for (double sample : samples) total += sample;
    local[0] = total / static_cast<double>(samples.size());
    std::sort(samples.begin(), samples.end());
    local[1] = quantile(samples, 0.50);
    local[2] = quantile(samples, 0.99);
  } else {
    coltrain::Stopwatch watch;
    for (int i = 0; i < options.iterations; ++i) op.launch();
    op.finish();
    local[0] = watch.microseconds() / options.iterations;
  }
  double slowest[3] = {0, 0, 0};
  COLTRAIN_CHECK_MPI(MPI_Allreduce(local, slowest, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  Timing timing{slowest[0], std::nullopt, std::nullopt};
  if (options.latency) {
    timing.p50_us = slowest[1];
    timing.p99_us = slowest[2];
  }
  return timing;
}

inline double bus_factor(Collective collective, int ranks) {
  const double p = ranks;
  switch (collective) {
    case Collective::kAllreduce:
      return 2 * (p - 1) / p;
    case Collective::kAllgather:
    case Collective::kReduceScatter:
    case Collective::kAlltoall:
      return (p - 1) / p;
    default:
      return 1;
  }
}

}  // namespace coltrain::bench
