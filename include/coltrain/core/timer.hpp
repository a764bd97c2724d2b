#pragma once
// Wall-clock time on the monotonic clock: a Stopwatch for measuring, a Deadline for bounding waits
// (every blocking wait in coltrain has one, so nothing hangs forever).

#include <coltrain/core/config.hpp>

#include <algorithm>
#include <chrono>

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

}  // namespace coltrain
