// PhaseTracker: totals and call counts per epoch and per run, from durations added by hand (so the
// expected values are exact), scoped timers that count each measurement once, concurrent add(),
// the per-epoch JSON and the profile table's layout and order. No assertion depends on how long
// anything takes.

#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/train/phase_tracker.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>

namespace {

using coltrain::train::Phase;
using coltrain::train::PhaseTracker;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

}  // namespace

TEST_CASE("Added time accumulates per epoch and per run", "[train][phases]") {
  PhaseTracker phases;
  phases.add(Phase::kForward, milliseconds(3));
  phases.add(Phase::kForward, milliseconds(4));
  phases.add(Phase::kAllreduceWait, milliseconds(10), 5);
  phases.add_seconds(Phase::kData, 0.5);
  CHECK(phases.epoch_seconds(Phase::kForward) == Approx(0.007));
  CHECK(phases.epoch_calls(Phase::kForward) == 2);
  CHECK(phases.epoch_calls(Phase::kAllreduceWait) == 5);
  CHECK(phases.epoch_seconds(Phase::kData) == Approx(0.5));
  CHECK(phases.epoch_calls(Phase::kBackward) == 0);

  phases.start_epoch();
  CHECK(phases.epoch_seconds(Phase::kForward) == 0.0);
  CHECK(phases.epoch_calls(Phase::kForward) == 0);
  phases.add(Phase::kForward, milliseconds(1));
  CHECK(phases.epoch_seconds(Phase::kForward) == Approx(0.001));
  CHECK(phases.run_seconds(Phase::kForward) == Approx(0.008));
  CHECK(phases.run_calls(Phase::kForward) == 3);
  CHECK(phases.run_seconds(Phase::kAllreduceWait) == Approx(0.010));

  CHECK_THROWS_AS(phases.add(Phase::kLoss, nanoseconds(-1)), coltrain::InvalidArgument);
  CHECK_THROWS_AS(phases.add(Phase::kLoss, nanoseconds(1), -1), coltrain::InvalidArgument);
  CHECK_THROWS_AS(phases.add_seconds(Phase::kLoss, -0.5), coltrain::InvalidArgument);
  CHECK(phases.run_calls(Phase::kLoss) == 0);
}

TEST_CASE("A scoped timer adds one call, once", "[train][phases]") {
  PhaseTracker phases;
  { auto timed = phases.time(Phase::kBackward); }
  CHECK(phases.epoch_calls(Phase::kBackward) == 1);
  CHECK(phases.epoch_seconds(Phase::kBackward) >= 0.0);

  {
    auto timed = phases.time(Phase::kOptimizer);
    auto moved = std::move(timed);
    moved.stop();
    moved.stop();
  }
  CHECK(phases.epoch_calls(Phase::kOptimizer) == 1);
}

TEST_CASE("add() from another thread is not lost", "[train][phases]") {
  PhaseTracker phases;
  constexpr int kAdds = 20000;
  std::thread other([&] {
    for (int i = 0; i < kAdds; ++i) phases.add(Phase::kAllreduceWait, nanoseconds(3));
  });
  for (int i = 0; i < kAdds; ++i) phases.add(Phase::kAllreduceWait, nanoseconds(2));
  other.join();
  CHECK(phases.run_calls(Phase::kAllreduceWait) == 2 * kAdds);
  CHECK(phases.run_seconds(Phase::kAllreduceWait) == Approx(5e-9 * kAdds));
}

TEST_CASE("The epoch JSON lists every phase in order", "[train][phases]") {
  PhaseTracker phases;
  phases.add(Phase::kLoss, milliseconds(250));
  const auto json = phases.epoch_json();
  std::string keys;
  for (const auto& [key, value] : json.items()) keys += key + " ";
  CHECK(keys == "data forward loss backward allreduce_wait optimizer other ");
  CHECK(json["loss"].get<double>() == Approx(0.25));
  CHECK(json["other"] == 0.0);
}

TEST_CASE("The profile report is a table sorted by total time", "[train][phases]") {
  PhaseTracker phases;
  phases.add(Phase::kForward, milliseconds(2), 4);
  phases.add(Phase::kData, milliseconds(30), 3);
  phases.add(Phase::kOptimizer, milliseconds(1), 2);
  const std::string report = phases.report("Profile");
  INFO(report);
  CHECK(report.rfind("Profile\n", 0) == 0);
  CHECK(report.find("| Action ") == std::string::npos);  // two spaces of padding, as below
  CHECK(report.find("|  Action") != std::string::npos);
  for (const char* column : {"Mean duration (s)", "Num calls", "Total time (s)", "Percentage %"}) {
    CHECK(report.find(column) != std::string::npos);
  }
  const auto total = report.find("|  Total  ");  // not the "Total time" header
  const auto data = report.find("|  data");
  const auto forward = report.find("|  forward");
  const auto optimizer = report.find("|  optimizer");
  REQUIRE(total != std::string::npos);
  REQUIRE(data != std::string::npos);
  CHECK(total < data);
  CHECK(data < forward);
  CHECK(forward < optimizer);
  CHECK(report.find("|  loss") == std::string::npos);  // never timed
  // data: 30 ms over 3 calls.
  CHECK(report.find("0.010000") != std::string::npos);
  CHECK(report.find("0.030") != std::string::npos);
  // The Total row counts every call.
  const std::string total_row = report.substr(total, report.find('\n', total) - total);
  CHECK(total_row.find(" 9 ") != std::string::npos);
  CHECK(total_row.find("100 %") != std::string::npos);
  // Every row has the same width.
  std::size_t width = 0;
  for (std::size_t at = report.find('|'); at != std::string::npos; at = report.find('|', at)) {
    const std::size_t end = report.find('\n', at);
    if (width == 0) width = end - at;
    CHECK(end - at == width);
    at = end;
  }
}
