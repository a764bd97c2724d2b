#pragma once
// One series, common to every backend: every size of the sweep prepared, timed, checked and
// reported.

#include "buffers.hpp"
#include "exact_inputs.hpp"
#include "options.hpp"
#include "report.hpp"
#include "sizes.hpp"
#include "timing.hpp"
#include "world.hpp"

#include <coltrain/core/error.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::bench {

template <class T>
using Prepare = std::function<Prepared(Workspace<T>&, const Case&)>;

// Runs one series over every size: prepare, time, check, report.
template <class T>
void run_series(const Options& options, const World& world, const Series& series,
                const Prepare<T>& prepare, const std::function<std::string(const Case&)>& chosen,
                Report& report) {
  report.begin(series, static_cast<bool>(chosen));
  const std::vector<Case> cases = sweep(options, world);
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    report.progress().show("# " + series.backend + " / " + series.algorithm + ": " +
                           human_size(c.bytes()) + " (" + std::to_string(k + 1) + "/" +
                           std::to_string(cases.size()) + ")");
    const Inputs inputs(c);
    Workspace<T> workspace(options.memory, c, series.in_place);
    const Prepared op = prepare(workspace, c);
    workspace.fill(inputs);  // timing on real data, not on zeros
    Row row{series, c, measure(op, options), 0, 0, std::nullopt, {}};
    if (options.check) {
      workspace.fill(inputs);
      op.launch();
      op.finish();
      const std::int64_t local = workspace.count_wrong(inputs);
      std::int64_t total = 0;
      COLTRAIN_CHECK_MPI(MPI_Allreduce(&local, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
      row.wrong = total;
    }
    row.algbw_gbs = static_cast<double>(c.bytes()) / row.timing.mean_us / 1e3;
    row.busbw_gbs = row.algbw_gbs * bus_factor(c.collective, c.ranks);
    if (chosen) row.chosen = chosen(c);
    report.add(std::move(row));
  }
  report.progress().clear();
  report.write_files();
}

// Broadcast has a single buffer, so it always runs in place.
inline bool runs_in_place(const Options& options) {
  return options.in_place || options.collective == Collective::kBroadcast;
}

}  // namespace coltrain::bench
