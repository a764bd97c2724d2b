// The tuning file coltrain_tune writes (comm/tuning/tuning_file.hpp): what it says round trips,
// which rule covers a call, and every malformed file refused with the field that is wrong.
#include <catch2/catch.hpp>

#include <coltrain/comm/options.hpp>
#include <coltrain/comm/tuning/tuning_file.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

using namespace coltrain;
using namespace coltrain::comm;
using Catch::Contains;

namespace {

TuningFile sample_file() {
  TuningFile file;
  CostModel tcp = default_cost_model(Backend::kTcp);
  tcp.point_to_point = {2.5, 1.0 / 2000.0, 1.0 / 7000.0};
  tcp.same_host = {0.5, 1.0 / 4000.0, 1.0 / 7000.0};
  file.cost_models[Backend::kTcp] = tcp;
  CostModel mpi = default_cost_model(Backend::kMpi);
  mpi.native = {1.5, 1.0 / 900.0, 1.0 / 7000.0};
  file.cost_models[Backend::kMpi] = mpi;
  file.rules.push_back(
      {Backend::kTcp,
       Collective::kAllreduce,
       4,
       1,
       {{0, Algorithm::kTree}, {4096, Algorithm::kHalvingDoubling}, {1 << 20, Algorithm::kRing}}});
  file.rules.push_back({Backend::kMpi,
                        Collective::kAllreduce,
                        4,
                        1,
                        {{0, Algorithm::kNative}, {65536, Algorithm::kRing}}});
  file.rules.push_back(
      {Backend::kTcp, Collective::kAllreduce, 8, 2, {{0, Algorithm::kHierarchical}}});
  file.single_copy_exchanges = CallSizeRange{92681};
  file.single_copy_exchanges_on_small_pages = CallSizeRange{131072, 12000000};
  file.measured = Json::array({Json::object({{"date", "2026-12-04T16:00:00Z"}})}).dump();
  return file;
}

// `text` with the first `from` replaced by `to`.
std::string with(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("a tuning file round trips through its text", "[comm][tuning]") {
  const TuningFile file = sample_file();
  const TuningFile back = parse_tuning_file(tuning_file_text(file), "sample");
  CHECK(back.rules == file.rules);
  CHECK(back.measured == file.measured);
  REQUIRE(back.cost_models.size() == 2);
  const CostModel& tcp = back.cost_models.at(Backend::kTcp);
  CHECK(tcp.point_to_point.alpha_us == 2.5);
  CHECK(tcp.point_to_point.beta_us_per_byte == 1.0 / 2000.0);  // doubles print exactly
  CHECK(tcp.same_host.alpha_us == 0.5);
  CHECK(back.cost_models.at(Backend::kMpi).native.beta_us_per_byte == 1.0 / 900.0);
  CHECK(back.single_copy_exchanges == CallSizeRange{92681, CallSizeRange::kUnbounded});
  CHECK(back.single_copy_exchanges_on_small_pages == CallSizeRange{131072, 12000000});
}

TEST_CASE("a tuning file's single-copy ranges: measured, never, or not measured",
          "[comm][tuning]") {
  TuningFile file = sample_file();
  file.single_copy_exchanges_on_small_pages = kNoCallSizes;
  std::string text = tuning_file_text(file);
  CHECK_THAT(text, Contains("\"single_copy_exchanges_on_small_pages\": \"never\""));
  TuningFile back = parse_tuning_file(text, "sample");
  CHECK(back.single_copy_exchanges_on_small_pages == kNoCallSizes);
  CHECK_FALSE(back.single_copy_exchanges_on_small_pages->contains(1 << 20));
  CHECK(back.single_copy_exchanges->contains(92681));
  CHECK_FALSE(back.single_copy_exchanges->contains(92680));
  // A file from before single copy was measured, or from MPI alone: the options stay as they are.
  file.single_copy_exchanges.reset();
  file.single_copy_exchanges_on_small_pages.reset();
  text = tuning_file_text(file);
  CHECK(text.find("shared_memory") == std::string::npos);
  back = parse_tuning_file(text, "sample");
  CHECK_FALSE(back.single_copy_exchanges);
  CHECK_FALSE(back.single_copy_exchanges_on_small_pages);
}

TEST_CASE("a tuning file's record of its measurements must be JSON to be written",
          "[comm][tuning]") {
  TuningFile file = sample_file();
  file.measured = "";
  CHECK(tuning_file_text(file).find("\"measured\"") == std::string::npos);
  CHECK(parse_tuning_file(tuning_file_text(file), "sample").measured.empty());
  file.measured = "{\"date\": \"2026-12-04\"";  // the closing brace lost
  CHECK_THROWS_WITH(tuning_file_text(file), Contains("TuningFile::measured is not JSON"));
}

TEST_CASE("a rule covers its shape and sizes from its threshold on", "[comm][tuning]") {
  const TuningFile file = sample_file();
  auto rule = [&](Backend b, int ranks, int hosts, std::size_t bytes) {
    return file.rule_for(b, Collective::kAllreduce, ranks, hosts, bytes);
  };
  CHECK(rule(Backend::kTcp, 4, 1, 0) == Algorithm::kTree);
  CHECK(rule(Backend::kTcp, 4, 1, 4095) == Algorithm::kTree);
  CHECK(rule(Backend::kTcp, 4, 1, 4096) == Algorithm::kHalvingDoubling);
  CHECK(rule(Backend::kTcp, 4, 1, (1 << 20) - 1) == Algorithm::kHalvingDoubling);
  CHECK(rule(Backend::kTcp, 4, 1, std::size_t{1} << 30) == Algorithm::kRing);
  CHECK(rule(Backend::kMpi, 4, 1, 100) == Algorithm::kNative);
  CHECK(rule(Backend::kTcp, 8, 2, 100) == Algorithm::kHierarchical);
  // Another shape, backend or collective: no rule, the cost model decides.
  CHECK_FALSE(rule(Backend::kTcp, 5, 1, 100));
  CHECK_FALSE(rule(Backend::kTcp, 8, 1, 100));
  CHECK_FALSE(file.rule_for(Backend::kTcp, Collective::kBroadcast, 4, 1, 100));
}

TEST_CASE("a malformed tuning file is refused naming the file and the field", "[comm][tuning]") {
  const std::string good = tuning_file_text(sample_file());
  REQUIRE_NOTHROW(parse_tuning_file(good, "t.json"));
  auto refused = [](const std::string& text) {
    try {
      parse_tuning_file(text, "t.json");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    FAIL("accepted: " << text);
    return std::string();
  };
  CHECK_THAT(refused("{"), Contains("tuning file t.json"));
  CHECK_THAT(refused("[]"), Contains("expected a JSON object"));
  CHECK_THAT(refused(with(good, "coltrain-tuning", "other")), Contains("/format"));
  CHECK_THAT(refused(with(good, "\"version\": 1", "\"version\": 2")),
             Contains("reads version 1, not 2"));
  CHECK_THAT(refused(with(good, "\"algorithm\": \"tree\"", "\"algorithm\": \"tre\"")),
             Contains("/rules/0/sizes/0/algorithm") && Contains("tre"));
  CHECK_THAT(refused(with(good, "\"algorithm\": \"tree\"", "\"algorithm\": \"native\"")),
             Contains("'native' cannot run allreduce on tcp"));
  CHECK_THAT(refused(with(good, "\"algorithm\": \"tree\"", "\"algorithm\": \"automatic\"")),
             Contains("/rules/0/sizes/0/algorithm"));
  CHECK_THAT(refused(with(good, "\"algorithm\": \"tree\"", "\"algorithm\": \"pairwise\"")),
             Contains("'pairwise' cannot run allreduce"));
  CHECK_THAT(refused(with(good, "\"from_bytes\": 0", "\"from_bytes\": 8")),
             Contains("/rules/0/sizes/0/from_bytes: the first rule starts at 0 bytes"));
  CHECK_THAT(refused(with(good, "\"from_bytes\": 4096", "\"from_bytes\": 2000000")),
             Contains("/rules/0/sizes/2/from_bytes: sizes must ascend"));
  CHECK_THAT(refused(with(good, "\"from_bytes\": 4096", "\"from_bytes\": -1")),
             Contains("/rules/0/sizes/1/from_bytes: expected a byte count"));
  CHECK_THAT(refused(with(good, "\"ranks\": 8", "\"ranks\": 1")),
             Contains("/rules/2/hosts: 2 hosts for 1 ranks"));
  CHECK_THAT(refused(with(good, "\"ranks\": 4", "\"ranks\": 0")),
             Contains("/rules/0/ranks: expected a whole number"));
  CHECK_THAT(refused(with(with(good, "\"backend\": \"mpi\"", "\"backend\": \"tcp\""),
                          "\"algorithm\": \"native\"", "\"algorithm\": \"tree\"")),
             Contains("/rules/1: a second rule for allreduce on tcp, 4 ranks on 1 hosts"));
  CHECK_THAT(refused(with(good, "\"backend\": \"tcp\"", "\"backend\": \"nccl\"")),
             Contains("/rules/0/backend: rules are for host buffers"));
  CHECK_THAT(refused(with(good, "\"alpha_us\": 2.5", "\"alpha_us\": -2.5")),
             Contains("/cost_models/tcp/point_to_point/alpha_us: expected a finite cost"));
  CHECK_THAT(refused(with(good, "\"alpha_us\": 2.5", "\"alpha\": 2.5")),
             Contains("/cost_models/tcp/point_to_point: 'alpha_us' is missing"));
  CHECK_THAT(refused(with(good, "\"tcp\": {", "\"udp\": {")),
             Contains("/cost_models/udp") && Contains("udp"));
  CHECK_THAT(refused(with(good, "\"below_bytes\": 12000000", "\"below_bytes\": 131072")),
             Contains("/shared_memory/single_copy_exchanges_on_small_pages/below_bytes: the range "
                      "ends at or before it starts"));
  CHECK_THAT(refused(with(good, "\"from_bytes\": 92681", "\"from_bytes\": \"all\"")),
             Contains("/shared_memory/single_copy_exchanges/from_bytes: expected a byte count"));
  CHECK_THAT(refused(with(good, "\"from_bytes\": 92681", "\"since\": 92681")),
             Contains("/shared_memory/single_copy_exchanges: 'from_bytes' is missing"));
  const std::string ranges = "\"single_copy_exchanges\": {";
  CHECK_THAT(refused(with(good, ranges, "\"single_copy_exchanges\": \"always\", \"x\": {")),
             Contains("/shared_memory/single_copy_exchanges: expected \"never\""));
  CHECK_THAT(refused(with(good, "\"shared_memory\": {", "\"shared_memory\": 5, \"unused\": {")),
             Contains("/shared_memory: expected an object"));
}

TEST_CASE("tuning files are written atomically and read back, and COLTRAIN_TUNING_FILE names one",
          "[comm][tuning]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("coltrain_tuning_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "cluster.tuning.json";
  save_tuning_file(path, sample_file());
  CHECK(load_tuning_file(path).rules == sample_file().rules);
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    CHECK(entry.path().filename() == "cluster.tuning.json");  // no temporary left behind
  CHECK_THROWS_WITH(
      load_tuning_file(dir / "missing.json"),
      Contains("tuning file " + (dir / "missing.json").string() + ": cannot be read"));

  ::setenv("COLTRAIN_TUNING_FILE", path.c_str(), 1);
  CHECK(comm_options_from_env().tuning_file == path);
  ::unsetenv("COLTRAIN_TUNING_FILE");
  CHECK(comm_options_from_env().tuning_file.empty());
  std::filesystem::remove_all(dir);
}
