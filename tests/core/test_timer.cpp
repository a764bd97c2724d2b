#include <catch2/catch.hpp>
#include <coltrain/core/timer.hpp>

#include <chrono>
#include <thread>

using namespace std::chrono_literals;

// Only lower bounds and orderings are checked: a loaded machine can make any wait longer.
TEST_CASE("stopwatch measures at least the time slept", "[timer]") {
  coltrain::Stopwatch watch;
  std::this_thread::sleep_for(5ms);
  CHECK(watch.elapsed() >= 5ms);
  CHECK(watch.seconds() >= 0.005);
  CHECK(watch.microseconds() >= 5000.0);
  watch.restart();
  CHECK(watch.elapsed() < 5s);
}

TEST_CASE("deadline expires after its timeout and never reports negative time left", "[timer]") {
  const coltrain::Deadline soon(2ms);
  CHECK(soon.remaining() <= 2ms);
  std::this_thread::sleep_for(3ms);
  CHECK(soon.expired());
  CHECK(soon.remaining() == coltrain::Clock::duration::zero());

  const auto later = coltrain::Deadline::after_seconds(3600.0);
  CHECK_FALSE(later.expired());
  CHECK(later.remaining() > 3590s);
}
