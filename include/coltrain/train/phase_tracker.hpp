#pragma once
// Where a training step's time goes: loading data, forward, loss, backward, waiting for gradient
// allreduces, the optimizer, and anything else the trainer chooses to time ("other": evaluation,
// checkpoints). A scoped timer on the steady clock adds to per-epoch and whole-run totals and call
// counts:
//
//   PhaseTracker phases;                    // the run's clock starts
//   phases.start_epoch();
//   { auto timed = phases.time(Phase::kForward); logits = net.forward(x); }
//   phases.add(Phase::kAllreduceWait, waited);   // measured elsewhere (the data-parallel layer)
//   log["phase_seconds"] = phases.epoch_json();
//   std::cout << phases.report();           // at the end, the table sorted by total time
//
// The report follows PyTorch Lightning's SimpleProfiler (Action | Mean duration (s) | Num calls |
// Total time (s) | Percentage %), with the percentage of the run's wall time. Phases should not
// nest, or their time is counted twice. add() may be called from another thread than time()'s
// (the totals are atomic); the totals cover this process, so after a resume they start again.
// Each timed scope is also a span of the timeline (core/timeline.hpp) when that is on.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/core/timeline.hpp>
#include <coltrain/core/timer.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace coltrain::train {

enum class Phase : std::uint8_t {
  kData,           // fetching and preparing the next batch
  kForward,        // the network's forward pass
  kLoss,           // loss and its gradient
  kBackward,       // the backward pass (including allreduces it overlaps with)
  kAllreduceWait,  // blocked on gradient allreduces after the backward pass
  kOptimizer,      // unscale, check, step
  kOther,          // whatever else the trainer times: evaluation, checkpoints, logging
};

inline constexpr std::array<Phase, 7> kAllPhases = {
    Phase::kData,          Phase::kForward,   Phase::kLoss, Phase::kBackward,
    Phase::kAllreduceWait, Phase::kOptimizer, Phase::kOther};

// The name in reports and JSON: data, forward, loss, backward, allreduce_wait, optimizer, other.
constexpr std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::kData:
      return "data";
    case Phase::kForward:
      return "forward";
    case Phase::kLoss:
      return "loss";
    case Phase::kBackward:
      return "backward";
    case Phase::kAllreduceWait:
      return "allreduce_wait";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kOther:
      return "other";
  }
  return "invalid";
}

class PhaseTracker {
  struct Totals {
    std::array<std::atomic<std::int64_t>, kAllPhases.size()> nanoseconds{};
    std::array<std::atomic<std::int64_t>, kAllPhases.size()> calls{};

    void clear() {
      for (auto& value : nanoseconds) value.store(0, std::memory_order_relaxed);
      for (auto& value : calls) value.store(0, std::memory_order_relaxed);
    }
  };

 public:
  // Adds the time from its construction to its destruction (or stop()) to one phase.
  class [[nodiscard]] Scope {
   public:
    Scope(PhaseTracker& tracker, Phase phase)
        : tracker_(&tracker), phase_(phase), start_(Clock::now()) {}
    Scope(Scope&& other) noexcept
        : tracker_(std::exchange(other.tracker_, nullptr)),
          phase_(other.phase_),
          start_(other.start_) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;
    ~Scope() { stop(); }

    // Ends the measurement early; later calls and the destructor add nothing.
    void stop() {
      if (tracker_ == nullptr) return;
      const Clock::time_point end = Clock::now();
      tracker_->add(phase_, end - start_);
      tracker_ = nullptr;
      Timeline& timeline = Timeline::instance();
      if (timeline.enabled()) timeline.complete(phase_name(phase_), "trainer", start_, end);
    }

   private:
    PhaseTracker* tracker_;
    Phase phase_;
    Clock::time_point start_;
  };

  // The run's wall clock, against which the report's percentages are taken, starts now.
  PhaseTracker() : run_start_(Clock::now()), epoch_start_(run_start_) {}
  PhaseTracker(const PhaseTracker&) = delete;
  PhaseTracker& operator=(const PhaseTracker&) = delete;

  Scope time(Phase phase) { return Scope(*this, phase); }

  // Adds time measured elsewhere, as `calls` calls. Throws InvalidArgument for a negative
  // duration or call count.
  void add(Phase phase, Clock::duration elapsed, std::int64_t calls = 1) {
    const std::int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count();
    if (ns < 0 || calls < 0) {
      throw InvalidArgument("PhaseTracker: negative time (" + std::to_string(ns) +
                            " ns) or call count (" + std::to_string(calls) + ") for phase " +
                            std::string(phase_name(phase)));
    }
    const auto i = index(phase);
    for (Totals* totals : {&epoch_, &run_}) {
      totals->nanoseconds[i].fetch_add(ns, std::memory_order_relaxed);
      totals->calls[i].fetch_add(calls, std::memory_order_relaxed);
    }
  }
  void add_seconds(Phase phase, double seconds, std::int64_t calls = 1) {
    if (!(seconds >= 0) || !std::isfinite(seconds)) {
      throw InvalidArgument("PhaseTracker: invalid time " + std::to_string(seconds) +
                            " s for phase " + std::string(phase_name(phase)));
    }
    add(phase, std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)),
        calls);
  }

  // Starts a new epoch: the epoch totals restart from zero; the run totals go on.
  void start_epoch() {
    epoch_.clear();
    epoch_start_ = Clock::now();
  }

  double epoch_seconds(Phase phase) const { return seconds(epoch_, phase); }
  std::int64_t epoch_calls(Phase phase) const { return calls(epoch_, phase); }
  double run_seconds(Phase phase) const { return seconds(run_, phase); }
  std::int64_t run_calls(Phase phase) const { return calls(run_, phase); }

  // Wall time since the epoch started, and since the tracker was constructed.
  double epoch_elapsed_seconds() const { return since(epoch_start_); }
  double run_elapsed_seconds() const { return since(run_start_); }

  // {"data": s, "forward": s, ...}: this epoch's seconds per phase, every phase present.
  Json epoch_json() const {
    Json out = Json::object();
    for (const Phase phase : kAllPhases) out[std::string(phase_name(phase))] = epoch_seconds(phase);
    return out;
  }

  // The whole run's table: a Total row (all calls, the wall time since construction, 100 %), then
  // each phase that was timed, by decreasing total time.
  std::string report(std::string_view title = "Training profile") const {
    struct Row {
      std::string action;
      std::string mean;
      std::string calls;
      std::string total;
      std::string percent;
      double sort_key;
    };
    const double wall = run_elapsed_seconds();
    std::vector<Row> rows;
    std::int64_t all_calls = 0;
    for (const Phase phase : kAllPhases) {
      const std::int64_t n = run_calls(phase);
      if (n == 0) continue;
      all_calls += n;
      const double total = run_seconds(phase);
      // Inserted in order (after any equal total): a dozen rows, and far less code than a sort.
      const auto at = std::ranges::upper_bound(rows, total, std::greater<>{}, &Row::sort_key);
      rows.insert(at, {std::string(phase_name(phase)), fixed(total / static_cast<double>(n), 6),
                       std::to_string(n), fixed(total, 3),
                       fixed(wall > 0 ? 100.0 * total / wall : 0.0, 1), total});
    }
    const Row header{"Action",         "Mean duration (s)", "Num calls",
                     "Total time (s)", "Percentage %",      0};
    const Row total{"Total", "-", std::to_string(all_calls), fixed(wall, 3), "100 %", 0};

    std::array<std::size_t, 5> width{};
    auto widen = [&](const Row& row) {
      const std::array<const std::string*, 5> cells = {&row.action, &row.mean, &row.calls,
                                                       &row.total, &row.percent};
      for (std::size_t c = 0; c < cells.size(); ++c)
        width[c] = std::max(width[c], cells[c]->size());
    };
    widen(header);
    widen(total);
    for (const Row& row : rows) widen(row);
    auto line = [&](const Row& row) {
      const std::array<const std::string*, 5> cells = {&row.action, &row.mean, &row.calls,
                                                       &row.total, &row.percent};
      std::string text = "|";
      for (std::size_t c = 0; c < cells.size(); ++c) {
        text += "  " + *cells[c] + std::string(width[c] - cells[c]->size(), ' ') + "  |";
      }
      return text + "\n";
    };
    std::size_t rule_width = 1;
    for (const std::size_t w : width) rule_width += w + 5;
    const std::string rule(rule_width, '-');

    std::string out = std::string(title) + "\n\n" + rule + "\n" + line(header) + rule + "\n" +
                      line(total) + rule + "\n";
    for (const Row& row : rows) out += line(row);
    return out + rule + "\n";
  }

 private:
  static std::size_t index(Phase phase) { return static_cast<std::size_t>(phase); }

  static double seconds(const Totals& totals, Phase phase) {
    return static_cast<double>(totals.nanoseconds[index(phase)].load(std::memory_order_relaxed)) *
           1e-9;
  }
  static std::int64_t calls(const Totals& totals, Phase phase) {
    return totals.calls[index(phase)].load(std::memory_order_relaxed);
  }
  static double since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  static std::string fixed(double value, int decimals) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", decimals, value);
    return text;
  }

  Clock::time_point run_start_;
  Clock::time_point epoch_start_;
  Totals epoch_;
  Totals run_;
};

}  // namespace coltrain::train
