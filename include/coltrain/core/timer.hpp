#pragma once
// Wall-clock time on the monotonic clock: a Stopwatch for measuring, a Deadline for bounding waits
// (every blocking wait in coltrain has one, so nothing hangs forever); and the time of day in UTC
// for the records that carry a date (checkpoints, benchmark results).

#include <coltrain/core/config.hpp>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <string>

namespace coltrain {

using Clock = std::chrono::steady_clock;

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}

  void restart() { start_ = Clock::now(); }
  Clock::duration elapsed() const { return Clock::now() - start_; }
  double seconds() const { return std::chrono::duration<double>(elapsed()).count(); }
  double microseconds() const {
    return std::chrono::duration<double, std::micro>(elapsed()).count();
  }

 private:
  Clock::time_point start_;
};

class Deadline {
 public:
  // A deadline `timeout` from now.
  explicit Deadline(Clock::duration timeout) : at_(Clock::now() + timeout) {}
  static Deadline after_seconds(double seconds) {
    return Deadline(
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  }

  bool expired() const { return Clock::now() >= at_; }
  // Time left, never negative.
  Clock::duration remaining() const {
    return std::max(at_ - Clock::now(), Clock::duration::zero());
  }
  Clock::time_point time_point() const { return at_; }

 private:
  Clock::time_point at_;
};

// Now in UTC, ISO 8601 to the second: 2026-12-02T10:42:06Z.
inline std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace coltrain
