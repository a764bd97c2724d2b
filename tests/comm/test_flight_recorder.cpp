// The flight recorder (comm/protocol/flight_recorder.hpp): one recorder's ring of calls and its
// JSON, then what TCP ranks (threads of this process) write when a call fails or SIGUSR1 asks, read
// back by scripts/diagnose, which must name the rank at fault.
#include "../support/thread_ranks.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/comm/protocol/flight_recorder.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/core/json.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using Catch::Contains;
using namespace std::chrono_literals;

namespace {

Json read_json(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

// scripts/diagnose's output for `dir`.
std::string diagnose(const std::filesystem::path& dir) {
  const std::string command = std::string(COLTRAIN_TEST_PYTHON) + " " + COLTRAIN_TEST_DIAGNOSE +
                              " " + dir.string() + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buffer[512];
  while (const std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  const int status = pclose(pipe);
  INFO(out);
  CHECK(status == 0);
  return out;
}

template <class Predicate>
bool wait_for(Predicate ready, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace

TEST_CASE("FlightRecorder keeps the last N calls, oldest first, as JSON that parses", "[flight]") {
  FlightRecorder recorder(3);
  recorder.set_identity(2, 4, "tcp");
  for (std::uint64_t sequence = 0; sequence < 5; ++sequence) {
    MessageHeader call;
    call.sequence = sequence;
    call.count = 10 * sequence;
    recorder.started(call);
    if (sequence < 4) recorder.done(sequence);
  }
  recorder.failed(4, "rank 3 \"lost\"\n\ttab");

  const auto records = recorder.records();
  REQUIRE(records.size() == 3);
  CHECK(records[0].call.sequence == 2);
  CHECK(records[2].call.sequence == 4);
  CHECK(records[1].state == CollectiveRecord::State::kDone);
  CHECK(records[2].state == CollectiveRecord::State::kFailed);
  CHECK(records[2].end_seconds >= records[2].start_seconds);

  const Json json = Json::parse(recorder.to_json("a test"));
  CHECK(json["rank"] == 2);
  CHECK(json["world_size"] == 4);
  CHECK(json["backend"] == "tcp");
  CHECK(json["reason"] == "a test");
  REQUIRE(json["records"].size() == 3);
  CHECK(json["records"][0]["sequence"] == 2);
  CHECK(json["records"][0]["count"] == 20);
  CHECK(json["records"][0]["collective"] == "allreduce");
  CHECK(json["records"][2]["state"] == "failed");
  CHECK(json["records"][2]["error"] == "rank 3 \"lost\"\n\ttab");

  // Without a directory a dump writes nothing; with one, flight_rank<R>.json.
  CHECK(recorder.dump("nowhere").empty());
  const auto dir = fresh_dir("coltrain_flight_unit");
  recorder.set_trace_dir(dir);
  const auto file = recorder.dump("asked");
  CHECK(file == dir / "flight_rank2.json");
  CHECK(read_json(file)["reason"] == "asked");
  std::filesystem::remove_all(dir);
}

TEST_CASE("a bad COLTRAIN_TRACE_RECORDS is a ConfigError naming it", "[flight]") {
  ::setenv("COLTRAIN_TRACE_RECORDS", "lots", 1);
  CHECK_THROWS_WITH(FlightRecorder(), Contains("COLTRAIN_TRACE_RECORDS=lots"));
  ::unsetenv("COLTRAIN_TRACE_RECORDS");
}

TEST_CASE("on a mismatch the ranks write their calls and diagnose names the odd rank",
          "[flight][tcp]") {
  const auto dir = fresh_dir("coltrain_flight_mismatch");
  const auto failures = testing::run_thread_ranks(
      3,
      [&](Communicator& comm) {
        comm.set_trace_dir(dir);
        std::vector<float> data(100, 1.0f);
        for (int i = 0; i < 3; ++i)
          comm.allreduce(std::span(data), ReduceOp::kSum, Algorithm::kRing);
        if (comm.rank() == 2) {
          std::vector<std::int32_t> other(7, 1);
          comm.allreduce(std::span(other), ReduceOp::kSum, Algorithm::kRing);
        } else {
          comm.allreduce(std::span(data), ReduceOp::kSum, Algorithm::kRing);
        }
      },
      5s);
  CHECK_FALSE(testing::joined(failures).empty());
  for (int rank = 0; rank < 3; ++rank) {
    const auto file = dir / ("flight_rank" + std::to_string(rank) + ".json");
    INFO(file);
    REQUIRE(std::filesystem::exists(file));
    const Json json = read_json(file);
    CHECK(json["rank"] == rank);
    CHECK(json["records"].elements().back()["sequence"] == 3);
    CHECK(json["records"].elements().back()["state"] == "failed");
    CHECK(json["records"][0]["state"] == "done");
  }
  const std::string verdict = diagnose(dir);
  CHECK_THAT(verdict, Contains("mismatch at call #3: rank 2 called allreduce #3 (i32 x 7") &&
                          Contains("ranks 0, 1 allreduce #3 (f32 x 100"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a rank that stops calling is named: missing without its file, behind with SIGUSR1's",
          "[flight][tcp]") {
  const auto dir = fresh_dir("coltrain_flight_hang");
  std::atomic<int> timed_out{0};
  std::string without_file;
  bool signal_answered = false;
  const auto failures = testing::run_thread_ranks(
      3,
      [&](Communicator& comm) {
        comm.set_trace_dir(dir);
        std::vector<float> data(100, 1.0f);
        for (int i = 0; i < 3; ++i) comm.allreduce(std::span(data));
        if (comm.rank() != 1) {
          try {
            comm.allreduce(std::span(data));
          } catch (const CommError&) {
            ++timed_out;
            throw;
          }
          return;
        }
        // Rank 1 hangs: no more calls. Once the others have given up, what they wrote names it as
        // missing; then SIGUSR1 makes it write its own calls, which show it behind.
        if (!wait_for([&] { return timed_out == 2; }, 30s)) return;
        without_file = diagnose(dir);
        if (!flight_recorder_answers_sigusr1()) return;
        std::raise(SIGUSR1);
        signal_answered =
            wait_for([&] { return std::filesystem::exists(dir / "flight_rank1.json"); }, 10s);
      },
      2s);
  CHECK(timed_out == 2);
  CHECK_FALSE(testing::joined(failures).empty());
  CHECK_THAT(without_file, Contains("rank 1 wrote no flight record") &&
                               Contains("ranks 0, 2 failed in allreduce #3"));
  REQUIRE(flight_recorder_answers_sigusr1());
  REQUIRE(signal_answered);
  CHECK(read_json(dir / "flight_rank1.json")["reason"] == "SIGUSR1");
  CHECK_THAT(diagnose(dir), Contains("rank 1 is behind: its last call is allreduce #2") &&
                                Contains("done; ranks 0, 2 failed in allreduce #3"));
  std::filesystem::remove_all(dir);
}
