#pragma once
// Rank-prefixed logging for jobs of many processes, and rank-0 printing for results. A Logger is a
// value owned by whoever needs it (no global logger), so two communicators in one process log
// independently.
//
// Log lines go to stderr as "[coltrain rank 1/4] warn: message"; each line is written with one call
// so lines from several threads do not interleave. print_root() writes plain lines to stdout on
// rank 0 only: that is what a user reads (tables, epoch lines), and it must not depend on the log
// level.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

namespace coltrain {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

inline std::string_view name_of(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "unknown";
}

inline LogLevel parse_log_level(std::string_view text) {
  for (LogLevel level : {LogLevel::kError, LogLevel::kWarn, LogLevel::kInfo, LogLevel::kDebug}) {
    if (text == name_of(level)) return level;
  }
  throw InvalidArgument("unknown log level '" + std::string(text) +
                        "' (expected error, warn, info or debug)");
}

// The level chosen by COLTRAIN_LOG_LEVEL, or `fallback` when it is unset.
inline LogLevel log_level_from_env(LogLevel fallback = LogLevel::kWarn) {
  const char* value = std::getenv("COLTRAIN_LOG_LEVEL");
  if (value == nullptr || *value == '\0') return fallback;
  try {
    return parse_log_level(value);
  } catch (const InvalidArgument& e) {
    throw ConfigError("COLTRAIN_LOG_LEVEL=" + std::string(value) + ": " + e.message());
  }
}

class Logger {
 public:
  Logger(int rank, int world_size, LogLevel level = log_level_from_env(),
         std::ostream& log_stream = std::cerr, std::ostream& print_stream = std::cout)
      : rank_(rank),
        world_size_(world_size),
        level_(level),
        log_(&log_stream),
        print_(&print_stream) {}

  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  LogLevel level() const noexcept { return level_; }
  bool enabled(LogLevel level) const noexcept { return level <= level_; }

  template <class... Parts>
  void error(const Parts&... parts) const {
    log(LogLevel::kError, parts...);
  }
  template <class... Parts>
  void warn(const Parts&... parts) const {
    log(LogLevel::kWarn, parts...);
  }
  template <class... Parts>
  void info(const Parts&... parts) const {
    log(LogLevel::kInfo, parts...);
  }
  template <class... Parts>
  void debug(const Parts&... parts) const {
    log(LogLevel::kDebug, parts...);
  }

  // One line on rank 0's stdout, whatever the level; other ranks print nothing.
  template <class... Parts>
  void print_root(const Parts&... parts) const {
    if (rank_ != 0) return;
    std::ostringstream line;
    (line << ... << parts) << '\n';
    write(*print_, line.str());
  }

  template <class... Parts>
  void log(LogLevel level, const Parts&... parts) const {
    if (!enabled(level)) return;
    std::ostringstream line;
    line << "[coltrain rank " << rank_ << '/' << world_size_ << "] " << name_of(level) << ": ";
    (line << ... << parts) << '\n';
    write(*log_, line.str());
  }

 private:
  static void write(std::ostream& out, const std::string& text) {
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
  }

  int rank_;
  int world_size_;
  LogLevel level_;
  std::ostream* log_;
  std::ostream* print_;
};

}  // namespace coltrain
