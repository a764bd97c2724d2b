// RunLog: the files of a --log-dir (config.json, metrics.jsonl line by line, result.json with the
// time to target), refusing to mix two runs, resuming after a checkpoint's epoch, and the errors.

#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/train/metrics.hpp>
#include <coltrain/train/run_log.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using coltrain::Json;
using coltrain::train::EpochRecord;
using coltrain::train::RunLog;
using coltrain::train::RunResult;

std::string read(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<Json> read_lines(const fs::path& file) {
  std::vector<Json> lines;
  std::istringstream in(read(file));
  for (std::string line; std::getline(in, line);) lines.push_back(Json::parse(line));
  return lines;
}

EpochRecord epoch(std::int64_t n, double top1) {
  EpochRecord r;
  r.epoch = n;
  r.global_step = 100 * n;
  r.train_loss = 1.0 / static_cast<double>(n);
  r.train_accuracy = 0.5;
  r.val_top1 = top1;
  r.lr = 0.1;
  r.images_per_second = 1000;
  r.epoch_seconds = 2;
  r.elapsed_seconds = 2.5 * static_cast<double>(n);
  r.phase_seconds = Json::object({{"forward", 0.5}, {"backward", 1.0}});
  return r;
}

// Nothing but the three records: temporary files are renamed or removed.
void check_only_records(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    CHECK((name == "config.json" || name == "metrics.jsonl" || name == "result.json"));
  }
}

}  // namespace

TEST_CASE("A run log writes its config, one flushed line per epoch and the result",
          "[train][run_log]") {
  coltrain::testing::TempDir tmp("coltrain_runlog");
  const fs::path dir = tmp / "runs" / "a";  // parents are created
  RunLog log(dir);
  log.write_config(Json::object({{"model", "resnet20"}, {"batch", 128}}));
  CHECK(Json::parse(read(dir / "config.json"))["batch"] == 128);

  log.append_epoch(epoch(1, 0.45));
  // On disk right away, not at the end of the run.
  REQUIRE(read_lines(dir / "metrics.jsonl").size() == 1);
  EpochRecord second = epoch(2, 0.81);
  coltrain::train::ClassificationMetrics metrics(3);
  const std::vector<float> logits = {3, 0, 0, 0, 3, 0};
  const std::vector<std::int32_t> labels = {0, 2};
  metrics.add_batch(coltrain::tensor::TensorView<const float>(logits.data(), {2, 3}), labels, 0.75);
  second.set_validation(metrics);
  second.loss_scale = 32768;
  log.append_epoch(second);
  log.append_epoch(epoch(3, 0.90));

  const auto lines = read_lines(dir / "metrics.jsonl");
  REQUIRE(lines.size() == 3);
  CHECK(lines[0]["epoch"] == 1);
  CHECK(lines[0]["val_loss"].is_null());
  CHECK(lines[0]["loss_scale"].is_null());
  CHECK(lines[0]["phase_seconds"]["backward"] == 1.0);
  CHECK(lines[1]["val_loss"] == 0.75);
  CHECK(lines[1]["val_top1"] == 0.5);
  CHECK(lines[1]["val_top5"].is_null());  // three classes
  // Recall 1, 0 and 0 for classes 0, 2 and 1 (predicted once, no samples).
  CHECK(lines[1]["val_recall"].get<double>() == Approx(1.0 / 3));
  CHECK(lines[1]["loss_scale"] == 32768);
  for (const char* key : {"global_step", "train_loss", "train_accuracy", "val_precision", "val_f1",
                          "lr", "images_per_second", "epoch_seconds", "elapsed_seconds"}) {
    CHECK(lines[2].contains(key));
  }

  // Validation top-1 reached 0.5 at epoch 2 (0.81 was overwritten by the metrics), 0.85 at 3.
  const auto reached = log.time_to_target(0.85);
  REQUIRE(reached.has_value());
  CHECK(reached->epoch == 3);
  CHECK(reached->elapsed_seconds == 7.5);

  RunResult result;
  result.epochs = 3;
  result.global_step = 300;
  result.total_seconds = 8;
  result.world_size = 2;
  result.backend = "mpi";
  result.train_loss = 0.3;
  result.validation = metrics.to_json(true);
  result.target_accuracy = 0.85;
  log.write_result(result);
  const Json json = Json::parse(read(dir / "result.json"));
  CHECK(json["world_size"] == 2);
  CHECK(json["backend"] == "mpi");
  CHECK(json["train"]["accuracy"].is_null());
  CHECK(json["target"]["reached"] == true);
  CHECK(json["target"]["epoch"] == 3);
  CHECK(json["target"]["time_to_target_seconds"] == 7.5);
  CHECK(json["validation"]["confusion_matrix"][2][1] == 1);

  result.target_accuracy = 0.95;
  log.write_result(result);
  const Json missed = Json::parse(read(dir / "result.json"));
  CHECK(missed["target"]["reached"] == false);
  CHECK(missed["target"]["time_to_target_seconds"].is_null());
  check_only_records(dir);
}

TEST_CASE("A diverged loss is written as null, keeping the line valid JSON", "[train][run_log]") {
  coltrain::testing::TempDir tmp("coltrain_runlog");
  RunLog log(tmp.path());
  EpochRecord r = epoch(1, 0.1);
  r.train_loss = std::numeric_limits<double>::quiet_NaN();
  log.append_epoch(r);
  CHECK(read_lines(tmp / "metrics.jsonl")[0]["train_loss"].is_null());
}

TEST_CASE("A run log keeps runs apart and resumes after a checkpoint's epoch", "[train][run_log]") {
  coltrain::testing::TempDir tmp("coltrain_runlog");
  {
    RunLog log(tmp.path());
    for (int n = 1; n <= 4; ++n) log.append_epoch(epoch(n, 0.2 * n));
    log.write_result(RunResult{});
    CHECK_THROWS_WITH(log.append_epoch(epoch(4, 0.9)),
                      Contains("epoch 4 does not follow the last logged epoch 4"));
  }
  // A second fresh run in the same directory would mix two runs' curves.
  CHECK_THROWS_WITH(RunLog(tmp.path()), Contains("already holds 4 epochs") &&
                                            Contains((tmp / "metrics.jsonl").string()));

  // The checkpoint was taken after epoch 2: epochs 3 and 4 will run again.
  RunLog resumed(tmp.path(), {.resume_after_epoch = 2});
  CHECK_FALSE(fs::exists(tmp / "result.json"));
  auto lines = read_lines(tmp / "metrics.jsonl");
  REQUIRE(lines.size() == 2);
  CHECK(lines[1]["epoch"] == 2);
  CHECK_THROWS_AS(resumed.append_epoch(epoch(2, 0.5)), coltrain::InvalidArgument);
  resumed.append_epoch(epoch(3, 0.7));
  lines = read_lines(tmp / "metrics.jsonl");
  REQUIRE(lines.size() == 3);
  CHECK(lines[2]["val_top1"] == 0.7);
  // The time to target comes from the kept lines too.
  REQUIRE(resumed.time_to_target(0.4).has_value());
  CHECK(resumed.time_to_target(0.4)->epoch == 2);
  check_only_records(tmp.path());
}

TEST_CASE("Resuming drops a line a crash cut short and rejects a malformed one",
          "[train][run_log]") {
  coltrain::testing::TempDir tmp("coltrain_runlog");
  {
    std::ofstream out(tmp / "metrics.jsonl");
    out << epoch(1, 0.1).to_json().dump() << "\n"
        << R"({"epoch": 2, "train_lo)";
  }
  {
    RunLog log(tmp.path(), {.resume_after_epoch = 5});
    log.append_epoch(epoch(2, 0.2));
  }
  const auto lines = read_lines(tmp / "metrics.jsonl");
  REQUIRE(lines.size() == 2);
  CHECK(lines[1]["epoch"] == 2);

  {
    std::ofstream out(tmp / "metrics.jsonl");
    out << epoch(1, 0.1).to_json().dump() << "\n{not json}\n";
  }
  const std::string where = (tmp / "metrics.jsonl").string() + ":2";
  CHECK_THROWS_WITH(RunLog(tmp.path(), {.resume_after_epoch = 5}),
                    Contains(where) && Contains("not valid JSON"));
  {
    std::ofstream out(tmp / "metrics.jsonl");
    out << R"({"epoch": 3})"
        << "\n"
        << R"({"epoch": 1})"
        << "\n";
  }
  CHECK_THROWS_WITH(RunLog(tmp.path(), {.resume_after_epoch = 5}),
                    Contains("epoch 1 does not follow epoch 3"));
}

TEST_CASE("A run log names the path it cannot create", "[train][run_log]") {
  coltrain::testing::TempDir tmp("coltrain_runlog");
  { std::ofstream(tmp / "file") << "x"; }
  CHECK_THROWS_AS(RunLog(tmp / "file"), coltrain::IoError);
  CHECK_THROWS_WITH(RunLog(tmp / "file" / "sub"), Contains((tmp / "file" / "sub").string()));
}
