// The timeline (core/timeline.hpp): nothing is recorded while it is off; once on, collectives of
// TCP ranks (threads of this process) and the trainer's phases become Chrome trace spans, a process
// per rank, in a file that parses, and scripts/merge_traces joins the ranks' files.
#include "../support/thread_ranks.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/core/timeline.hpp>
#include <coltrain/train/phase_tracker.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace coltrain;

namespace {

Json read_json(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

std::vector<Json> spans_named(const Json& trace, const std::string& name) {
  std::vector<Json> found;
  for (const Json& event : trace["traceEvents"])
    if (event["ph"] == "X" && event["name"] == name) found.push_back(event);
  return found;
}

}  // namespace

TEST_CASE("the timeline records nothing while off, then collectives and phases as spans",
          "[timeline][tcp]") {
  Timeline& timeline = Timeline::instance();
  REQUIRE_FALSE(timeline.enabled());  // COLTRAIN_TRACE is not set for the tests
  CHECK(timeline.write().empty());
  { const Timeline::Span before("while off", "test"); }

  const auto dir =
      std::filesystem::temp_directory_path() / ("coltrain_timeline_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  timeline.enable(dir / "trace.json");
  REQUIRE(timeline.enabled());
  {
    const Timeline::Span main_thread("outer", "test");
    std::thread([] { const Timeline::Span other_thread("inner", "test"); }).join();
  }
  train::PhaseTracker phases;
  { auto timed = phases.time(train::Phase::kForward); }
  const auto failures = testing::run_thread_ranks(2, [](comm::Communicator& comm) {
    std::vector<float> data(64, 1.0f);
    comm.allreduce(std::span(data), comm::ReduceOp::kSum, comm::Algorithm::kRing);
    comm.broadcast(std::span(data), 1);
  });
  REQUIRE(testing::joined(failures).empty());

  const std::filesystem::path file = timeline.write();
  // The first communicator made (rank 0 or 1 of 2) named the process, and so the file.
  CHECK((file == dir / "trace.rank0.json" || file == dir / "trace.rank1.json"));
  const Json trace = read_json(file);
  CHECK(spans_named(trace, "while off").empty());
  const auto outer = spans_named(trace, "outer");
  const auto inner = spans_named(trace, "inner");
  REQUIRE(outer.size() == 1);
  REQUIRE(inner.size() == 1);
  CHECK(outer[0]["tid"] != inner[0]["tid"]);
  CHECK(inner[0]["ts"].get<double>() >= outer[0]["ts"].get<double>());
  CHECK(inner[0]["ts"].get<double>() + inner[0]["dur"].get<double>() <=
        outer[0]["ts"].get<double>() + outer[0]["dur"].get<double>() + 1.0);
  CHECK(spans_named(trace, "forward").size() == 1);
  CHECK(spans_named(trace, "forward")[0]["cat"] == "trainer");

  // One allreduce and one broadcast per rank, each rank its own process.
  const auto allreduces = spans_named(trace, "allreduce");
  REQUIRE(allreduces.size() == 2);
  std::set<int> ranks;
  for (const auto& span : allreduces) {
    ranks.insert(span["pid"].get<int>());
    CHECK(span["cat"] == "collective");
    CHECK(span["args"]["sequence"] == 0);
    CHECK(span["args"]["algorithm"] == "ring");
    CHECK(span["args"]["dtype"] == "f32");
    CHECK(span["args"]["count"] == 64);
    CHECK(span["dur"].get<double>() >= 0);
  }
  CHECK(ranks == std::set<int>{0, 1});
  CHECK(spans_named(trace, "broadcast").size() == 2);
  std::set<int> named;
  for (const Json& event : trace["traceEvents"])
    if (event["ph"] == "M") named.insert(event["pid"].get<int>());
  CHECK(named == std::set<int>{0, 1});

  // scripts/merge_traces joins files: here the same one twice.
  const std::string command = std::string(COLTRAIN_TEST_PYTHON) + " " + COLTRAIN_TEST_MERGE_TRACES +
                              " " + (dir / "merged.json").string() + " " + file.string() + " " +
                              file.string() + " > /dev/null";
  REQUIRE(std::system(command.c_str()) == 0);
  const Json merged = read_json(dir / "merged.json");
  CHECK(merged["traceEvents"].size() == 2 * trace["traceEvents"].size());
  timeline.enable({});
  CHECK_FALSE(timeline.enabled());
  std::filesystem::remove_all(dir);
}
