#pragma once
// A training run's records in one directory (a trainer's --log-dir), written by rank 0:
//
//   DIR/config.json    the run's options, written at the start
//   DIR/metrics.jsonl  one JSON object per epoch, appended and flushed to disk line by line, so a
//                      crashed run keeps every finished epoch
//   DIR/result.json    at the end: final metrics, confusion matrix, time to the target accuracy,
//                      total time, world size and backend
//
// config.json and result.json are replaced atomically (core/atomic_file.hpp). A resumed run
// (RunLogOptions::resume_after_epoch = the checkpoint's epoch) keeps the lines up to that epoch,
// drops the later ones (they will be run again) and the stale result.json, and appends from there;
// a fresh run refuses a directory whose metrics.jsonl already holds epochs. scripts/plot_run
// draws the curves. JSON has no NaN or infinity: such values (a diverged loss) are written as null.

#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/train/metrics.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace coltrain::train {

// One line of metrics.jsonl. Validation fields stay null for epochs without an evaluation;
// loss_scale only under fp16 loss scaling.
struct EpochRecord {
  std::int64_t epoch = 0;  // as the trainer counts them; must increase from line to line
  std::int64_t global_step = 0;
  double train_loss = 0;
  double train_accuracy = 0;
  std::optional<double> val_loss{}, val_top1{}, val_top5{}, val_precision{}, val_recall{}, val_f1{};
  double lr = 0;
  double images_per_second = 0;
  double epoch_seconds = 0;
  double elapsed_seconds = 0;  // the run's wall time at the end of this epoch, across resumes
  Json phase_seconds = Json::object();  // PhaseTracker
  std::optional<double> loss_scale{};

  // Fills the val_* fields from an evaluation's (already allreduced) metrics.
  void set_validation(const ClassificationMetrics& metrics) {
    val_loss = metrics.mean_loss();
    val_top1 = metrics.top1();
    val_top5 = metrics.top5();
    val_precision = metrics.macro_precision();
    val_recall = metrics.macro_recall();
    val_f1 = metrics.macro_f1();
  }

  Json to_json() const {
    Json out;
    out["epoch"] = epoch;
    out["global_step"] = global_step;
    out["train_loss"] = train_loss;
    out["train_accuracy"] = train_accuracy;
    out["val_loss"] = val_loss;
    out["val_top1"] = val_top1;
    out["val_top5"] = val_top5;
    out["val_precision"] = val_precision;
    out["val_recall"] = val_recall;
    out["val_f1"] = val_f1;
    out["lr"] = lr;
    out["images_per_second"] = images_per_second;
    out["epoch_seconds"] = epoch_seconds;
    out["elapsed_seconds"] = elapsed_seconds;
    out["phase_seconds"] = phase_seconds;
    out["loss_scale"] = loss_scale;
    return out;
  }
};

// What result.json holds besides the time to target, which RunLog finds in the logged epochs.
struct RunResult {
  std::int64_t epochs = 0;
  std::int64_t global_step = 0;
  double total_seconds = 0;
  int world_size = 1;
  std::string backend{};  // "mpi", "tcp", "nccl", or "none" for one process
  std::optional<double> train_loss{}, train_accuracy{};
  // The final evaluation: ClassificationMetrics::to_json(true), with the confusion matrix.
  Json validation{};
  std::optional<double> target_accuracy{};  // top-1, as a fraction (MLBench: 0.80)
  Json extra = Json::object();              // anything else to record
};

struct RunLogOptions {
  // Resume a run whose checkpoint finished this epoch: later lines are dropped.
  std::optional<std::int64_t> resume_after_epoch{};
};

class RunLog {
 public:
  // When the run first reached a validation top-1 accuracy.
  struct TargetReached {
    std::int64_t epoch;
    double elapsed_seconds;
  };

  // Creates `dir` (and its parents). Throws IoError naming the path if it cannot, if a fresh run
  // finds epochs already logged there, or if a resumed run's metrics.jsonl has a malformed line.
  explicit RunLog(std::filesystem::path dir, RunLogOptions options = {}) : dir_(std::move(dir)) {
    std::error_code error;
    std::filesystem::create_directories(dir_, error);
    if (error || !std::filesystem::is_directory(dir_)) {
      coltrain::detail::fail_io(
          "create log directory", dir_,
          "cannot create the log directory: " +
              (error ? error.message() : std::string("a file of that name exists")));
    }
    const std::vector<std::string> lines = read_existing_lines();
    if (!options.resume_after_epoch && !lines.empty()) {
      coltrain::detail::fail_io(
          "open run log", metrics_path(),
          "already holds " + std::to_string(lines.size()) +
              " epochs of an earlier run; choose another log directory, or resume "
              "that run from its checkpoint");
    }
    // Rewritten even for a fresh run: it drops a fragment a crash may have left.
    std::string kept;
    std::optional<std::int64_t> previous;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const Logged logged = parse_line(lines[i], i + 1, previous);
      previous = logged.epoch;
      if (logged.epoch > *options.resume_after_epoch) continue;
      logged_.push_back(logged);
      kept += lines[i] + "\n";
    }
    write_file_atomically(metrics_path(), kept);
    std::error_code ignored;
    if (std::filesystem::remove(result_path(), ignored)) sync_directory(dir_);
  }

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path config_path() const { return dir_ / "config.json"; }
  std::filesystem::path metrics_path() const { return dir_ / "metrics.jsonl"; }
  std::filesystem::path result_path() const { return dir_ / "result.json"; }

  // Writes config.json (the run's options, as the trainer names them). Throws IoError.
  void write_config(const Json& config) const {
    write_file_atomically(config_path(), config.dump(2) + "\n");
  }

  // Appends the epoch's line to metrics.jsonl and flushes it to disk. Throws InvalidArgument if
  // the epoch does not follow the last logged one, IoError if the write fails.
  void append_epoch(const EpochRecord& record) {
    if (!logged_.empty() && record.epoch <= logged_.back().epoch) {
      ErrorContext context;
      context.operation = "append epoch";
      context.file = metrics_path().string();
      throw InvalidArgument("epoch " + std::to_string(record.epoch) +
                                " does not follow the last "
                                "logged epoch " +
                                std::to_string(logged_.back().epoch),
                            context);
    }
    const std::string line = record.to_json().dump() + "\n";
    const std::filesystem::path path = metrics_path();
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      coltrain::detail::fail_io("append epoch", path,
                                "cannot open: " + coltrain::detail::errno_message(errno));
    int error = coltrain::detail::write_all(fd, std::as_bytes(std::span(line)));
    if (error == 0 && ::fdatasync(fd) != 0) error = errno;
    if (::close(fd) != 0 && error == 0) error = errno;
    if (error != 0) {
      coltrain::detail::fail_io("append epoch", path,
                                "cannot write epoch " + std::to_string(record.epoch) + ": " +
                                    coltrain::detail::errno_message(error));
    }
    logged_.push_back({record.epoch, record.val_top1, record.elapsed_seconds});
  }

  // The first logged epoch whose validation top-1 reached `target`.
  std::optional<TargetReached> time_to_target(double target) const {
    for (const Logged& logged : logged_) {
      if (logged.val_top1 && *logged.val_top1 >= target) {
        return TargetReached{logged.epoch, logged.elapsed_seconds};
      }
    }
    return std::nullopt;
  }

  // Writes result.json. Throws IoError.
  void write_result(const RunResult& result) const {
    Json out;
    out["epochs"] = result.epochs;
    out["global_step"] = result.global_step;
    out["total_seconds"] = result.total_seconds;
    out["world_size"] = result.world_size;
    out["backend"] = result.backend;
    out["train"] =
        Json::object({{"loss", result.train_loss}, {"accuracy", result.train_accuracy}});
    out["validation"] = result.validation;
    if (result.target_accuracy) {
      const std::optional<TargetReached> reached = time_to_target(*result.target_accuracy);
      out["target"] = Json::object(
          {{"top1", *result.target_accuracy},
           {"reached", reached.has_value()},
           {"epoch", reached ? Json(reached->epoch) : Json()},
           {"time_to_target_seconds", reached ? Json(reached->elapsed_seconds) : Json()}});
    } else {
      out["target"] = nullptr;
    }
    out["extra"] = result.extra;
    write_file_atomically(result_path(), out.dump(2) + "\n");
  }

 private:
  struct Logged {
    std::int64_t epoch;
    std::optional<double> val_top1;
    double elapsed_seconds;
  };

  // The complete lines of metrics.jsonl (none when it does not exist). A last line without its
  // newline is an append that a crash cut short: it is dropped.
  std::vector<std::string> read_existing_lines() const {
    std::vector<std::string> lines;
    std::ifstream in(metrics_path(), std::ios::binary);
    if (!in) return lines;
    std::ostringstream contents;
    contents << in.rdbuf();
    const std::string text = contents.str();
    std::size_t begin = 0;
    for (std::size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
      lines.push_back(text.substr(begin, end - begin));
    }
    return lines;
  }

  Logged parse_line(const std::string& line, std::size_t number,
                    std::optional<std::int64_t> previous) const {
    auto fail = [&](const std::string& message) {
      coltrain::detail::fail_io("resume run log",
                                metrics_path().string() + ":" + std::to_string(number), message);
    };
    Json value;
    try {
      value = Json::parse(line);
    } catch (const JsonError& e) {
      fail("not valid JSON: " + e.description() + " at byte " +
           std::to_string(e.offset().value_or(0)));
    }
    if (!value.contains("epoch") || !value["epoch"].is_number_integer()) {
      fail("not an epoch record (a JSON object with an integer \"epoch\")");
    }
    Logged logged{value["epoch"].get<std::int64_t>(), std::nullopt, 0.0};
    if (value.contains("val_top1") && value["val_top1"].is_number()) {
      logged.val_top1 = value["val_top1"].get<double>();
    }
    if (value.contains("elapsed_seconds") && value["elapsed_seconds"].is_number()) {
      logged.elapsed_seconds = value["elapsed_seconds"].get<double>();
    }
    if (previous && logged.epoch <= *previous) {
      fail("epoch " + std::to_string(logged.epoch) + " does not follow epoch " +
           std::to_string(*previous));
    }
    return logged;
  }

  std::filesystem::path dir_;
  std::vector<Logged> logged_;
};

}  // namespace coltrain::train
