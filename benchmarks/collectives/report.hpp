#pragma once
// What allreduce_bench prints and writes: nccl-tests' tables on rank 0, a progress line on a
// terminal, and the CSV and JSON files, written atomically.

#include "options.hpp"
#include "sizes.hpp"
#include "timing.hpp"
#include "world.hpp"

#include <coltrain/comm/types.hpp>
#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/core/terminal.hpp>
#include <coltrain/core/timer.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace coltrain::bench {

// One table: a backend and an algorithm as requested.
struct Series {
  std::string backend;
  std::string algorithm;
  bool in_place = false;
  std::string note;  // why the series departs from the options, if it does
};

struct Row {
  Series series;
  Case size;
  Timing timing;
  double algbw_gbs = 0;
  double busbw_gbs = 0;
  std::optional<std::int64_t> wrong;  // absent with -c 0
  std::string chosen;                 // what automatic ran
};

// One updating line on stderr while a sweep runs, on rank 0: on a terminal, or where --progress
// asks for it because a launcher pipes stderr (mpiexec does). stdout's lines clear it first. A
// launcher forwards stdout and stderr separately and may swap what arrives at once, so on a pipe
// the line pauses briefly at each switch, letting the table's lines through in order.
class Progress {
 public:
  enum class Mode { kOff, kTerminal, kPipe };

  explicit Progress(Mode mode) : mode_(mode) {}

  void show(const std::string& text) {
    if (mode_ == Mode::kOff) return;
    settle();
    std::fprintf(stderr, "\r%-*s", static_cast<int>(shown_), text.c_str());
    std::fflush(stderr);
    shown_ = std::max(shown_, text.size());
  }
  void clear() {
    if (mode_ == Mode::kOff || shown_ == 0) return;
    std::fprintf(stderr, "\r%*s\r", static_cast<int>(shown_), "");
    std::fflush(stderr);
    shown_ = 0;
    settle();
  }

 private:
  void settle() const {
    if (mode_ == Mode::kPipe) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  Mode mode_;
  std::size_t shown_ = 0;
};

inline std::string human_size(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%g %s", value, units[unit]);
  return text;
}

inline std::string op_name(const Case& c) {
  return reduces(c.collective) ? std::string(coltrain::comm::name_of(c.op)) : "none";
}

template <class... Args>
std::string formatted(const char* format, Args... args) {
  char text[256];
  std::snprintf(text, sizeof(text), format, args...);
  return text;
}

// The tables on stdout (rank 0), and the CSV and JSON files, rewritten after each series.
class Report {
 public:
  Report(const Options& options, const World& world)
      : options_(options), world_(world), progress_(progress_mode(options, world)) {}

  bool root() const { return world_.rank == 0; }
  Progress& progress() { return progress_; }

  // A line of its own for something not run; not an error.
  void skip(const std::string& what, const std::string& why) {
    if (!root()) return;
    progress_.clear();
    std::printf("# skipping %s: %s\n", what.c_str(), why.c_str());
    std::fflush(stdout);
  }

  void begin(const Series& series, bool automatic) {
    if (!root()) return;
    progress_.clear();
    const Collective collective = options_.collective;
    std::string what = std::string(coltrain::comm::name_of(collective)) + ", " +
                       std::to_string(world_.size) + " ranks, " +
                       std::string(coltrain::name_of(options_.dtype));
    if (reduces(collective)) what += " " + std::string(coltrain::comm::name_of(options_.op));
    if (collective == Collective::kBroadcast || collective == Collective::kReduce) {
      what += ", root " + std::to_string(options_.root);
    }
    std::printf("\n# %s / %s: %s, %s, %s memory, %d iterations after %d warm-up\n",
                series.backend.c_str(), series.algorithm.c_str(), what.c_str(),
                series.in_place ? "in place" : "out of place", name_of(options_.memory),
                options_.iterations, options_.warmup);
    if (!series.note.empty()) std::printf("# %s\n", series.note.c_str());
    std::string names =
        formatted("#%11s %12s %6s %6s %5s |%10s", "size", "count", "type", "redop", "root", "time");
    std::string units =
        formatted("#%11s %12s %6s %6s %5s |%10s", "(B)", "(elements)", "", "", "", "(us)");
    if (options_.latency) {
      names += formatted(" %10s %10s", "p50", "p99");
      units += formatted(" %10s %10s", "(us)", "(us)");
    }
    names += formatted(" %9s %9s %7s", "algbw", "busbw", "#wrong");
    units += formatted(" %9s %9s", "(GB/s)", "(GB/s)");
    if (automatic) names += "  algorithm";
    std::printf("%s\n%s\n", names.c_str(), units.c_str());
    std::fflush(stdout);
  }

  void add(Row row) {
    if (row.wrong) wrong_ += *row.wrong;
    if (!root()) return;
    progress_.clear();
    const Case& c = row.size;
    const int root_column =
        c.collective == Collective::kBroadcast || c.collective == Collective::kReduce ? c.root : -1;
    std::string latency;
    if (row.timing.p50_us) {
      latency = formatted(" %10.2f", *row.timing.p50_us) + formatted(" %10.2f", *row.timing.p99_us);
    }
    const std::string wrong = row.wrong ? std::to_string(*row.wrong) : "N/A";
    std::printf("%12zu %12zu %6s %6s %5d |%10.2f%s %9.3f %9.3f %7s%s%s\n", c.bytes(), c.count,
                std::string(coltrain::name_of(c.dtype)).c_str(), op_name(c).c_str(), root_column,
                row.timing.mean_us, latency.c_str(), row.algbw_gbs, row.busbw_gbs, wrong.c_str(),
                row.chosen.empty() ? "" : "  ", row.chosen.c_str());
    std::fflush(stdout);
    rows_.push_back(std::move(row));
  }

  // Rewrites the files with every row so far; an interrupted sweep keeps what it measured.
  void write_files() const {
    if (!root()) return;
    if (!options_.csv_path.empty()) {
      coltrain::write_file_atomically(options_.csv_path, csv(), "write the results CSV");
    }
    if (!options_.json_path.empty()) {
      coltrain::write_file_atomically(options_.json_path, json().dump(2) + "\n",
                                      "write the results JSON");
    }
  }

  std::int64_t wrong() const { return wrong_; }

 private:
  static Progress::Mode progress_mode(const Options& options, const World& world) {
    if (world.rank != 0) return Progress::Mode::kOff;
    if (coltrain::writes_to_terminal(STDERR_FILENO)) return Progress::Mode::kTerminal;
    return options.progress ? Progress::Mode::kPipe : Progress::Mode::kOff;
  }

  std::string csv() const {
    std::string text = std::string(kCsvHeader) + "\n";
    for (const Row& row : rows_) {
      const Case& c = row.size;
      const auto optional_us = [](const std::optional<double>& us) {
        return us ? formatted("%.3f", *us) : std::string();
      };
      text += std::string(coltrain::comm::name_of(c.collective)) + "," + row.series.backend + "," +
              row.series.algorithm + "," + std::to_string(c.ranks) + "," +
              std::to_string(c.bytes()) + "," + std::to_string(c.count) + "," +
              std::string(coltrain::name_of(c.dtype)) + "," + op_name(c) + "," +
              formatted("%.3f", row.timing.mean_us) + "," + optional_us(row.timing.p50_us) + "," +
              optional_us(row.timing.p99_us) + "," + formatted("%.6g", row.algbw_gbs) + "," +
              formatted("%.6g", row.busbw_gbs) + "," +
              (row.wrong ? std::to_string(*row.wrong) : std::string()) + "\n";
    }
    return text;
  }

  coltrain::Json json() const {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    coltrain::Json results = coltrain::Json::array();
    for (const Row& row : rows_) {
      const Case& c = row.size;
      coltrain::Json entry = coltrain::Json::object({
          {"collective", coltrain::comm::name_of(c.collective)},
          {"backend", row.series.backend},
          {"algo", row.series.algorithm},
          {"ranks", c.ranks},
          {"bytes", c.bytes()},
          {"count", c.count},
          {"dtype", coltrain::name_of(c.dtype)},
          {"op", op_name(c)},
          {"in_place", row.series.in_place},
          {"time_us", row.timing.mean_us},
          {"p50_us", nullptr},
          {"p99_us", nullptr},
          {"algbw_gbs", row.algbw_gbs},
          {"busbw_gbs", row.busbw_gbs},
          {"wrong", nullptr},
      });
      if (row.timing.p50_us) entry["p50_us"] = *row.timing.p50_us;
      if (row.timing.p99_us) entry["p99_us"] = *row.timing.p99_us;
      if (row.wrong) entry["wrong"] = *row.wrong;
      if (!row.chosen.empty()) entry["chosen"] = row.chosen;
      results.push_back(std::move(entry));
    }
    return coltrain::Json::object({
        {"command", options_.command},
        {"date", coltrain::utc_now()},
        {"host", host},
        {"coltrain_version", coltrain::BuildConfig::kVersion},
        {"ranks", world_.size},
        {"iterations", options_.iterations},
        {"warmup", options_.warmup},
        {"latency_mode", options_.latency},
        {"memory", name_of(options_.memory)},
        {"staging_chunk_bytes", options_.staging.chunk_bytes},
        {"checked", options_.check != 0},
        {"results", std::move(results)},
    });
  }

  const Options& options_;
  World world_;
  Progress progress_;
  std::vector<Row> rows_;
  std::int64_t wrong_ = 0;
};

}  // namespace coltrain::bench
