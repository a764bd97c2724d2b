// comm_options_from_env() and its parsers. Header-only builds include this file at the end of
// comm/options.hpp; with COLTRAIN_SEPARATE_COMPILATION only <coltrain/src.hpp> includes it.
#pragma once

#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/auth.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <exception>
#include <string>

namespace coltrain::comm {

namespace detail {

inline std::chrono::milliseconds parse_timeout_seconds(const std::string& text) {
  std::size_t used = 0;
  double seconds = 0;
  try {
    seconds = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !std::isfinite(seconds) || seconds <= 0 || seconds > 1e7) {
    throw ConfigError("COLTRAIN_TIMEOUT=" + text +
                      ": expected a positive number of seconds (at most 1e7)");
  }
  return std::chrono::milliseconds(static_cast<long long>(std::ceil(seconds * 1000.0)));
}

// COLTRAIN_SHM_SINGLE_COPY: 0 (off), 1 (on where it pays, the default), always (every piece of the
// default size or more), or the smallest payload piece in bytes that goes by single copy (4096 or
// more) where it pays. Returns whether it is on.
inline bool parse_single_copy(const std::string& text, std::size_t& min_bytes,
                              bool& where_it_pays) {
  if (text == "0") return false;
  if (text == "1") return true;
  if (text == "always") {
    where_it_pays = false;
    return true;
  }
  std::size_t used = 0;
  unsigned long long bytes = 0;
  try {
    bytes = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.front() == '-' || bytes < 4096 || bytes > (1ull << 40)) {
    throw ConfigError("COLTRAIN_SHM_SINGLE_COPY=" + text +
                      ": expected 0, 1 (the default), always, or the smallest payload in bytes "
                      "that goes by single copy (4096 to 2^40)");
  }
  min_bytes = static_cast<std::size_t>(bytes);
  return true;
}

// COLTRAIN_SPIN_US: whole microseconds, 0 (sleep at once) to 10 s.
inline std::chrono::microseconds parse_spin_microseconds(const std::string& text) {
  std::size_t used = 0;
  unsigned long long us = 0;
  try {
    us = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.front() == '-' || us > 10'000'000) {
    throw ConfigError("COLTRAIN_SPIN_US=" + text +
                      ": expected the microseconds a waiting rank polls before it sleeps, 0 to "
                      "10000000");
  }
  return std::chrono::microseconds(static_cast<long long>(us));
}

}  // namespace detail

COLTRAIN_DECL CommOptions comm_options_from_env() {
  CommOptions options;
  if (const char* timeout = detail::nonempty_env("COLTRAIN_TIMEOUT")) {
    options.timeout = detail::parse_timeout_seconds(timeout);
  }
  if (const char* ifname = detail::nonempty_env("COLTRAIN_SOCKET_IFNAME")) {
    options.socket_ifname = ifname;
  }
  if (const char* dir = detail::nonempty_env("COLTRAIN_TRACE_DIR")) options.trace_dir = dir;
  if (const char* file = detail::nonempty_env("COLTRAIN_PORT_FILE")) options.port_file = file;
  if (const char* file = detail::nonempty_env("COLTRAIN_TUNING_FILE")) options.tuning_file = file;
  if (const char* shm = detail::nonempty_env("COLTRAIN_SHM")) {
    const std::string value = shm;
    if (value != "0" && value != "1")
      throw ConfigError("COLTRAIN_SHM=" + value + ": expected 1 (the default) or 0");
    options.shared_memory = value == "1";
  }
  if (const char* deterministic = detail::nonempty_env("COLTRAIN_DETERMINISTIC")) {
    const std::string value = deterministic;
    if (value != "0" && value != "1")
      throw ConfigError("COLTRAIN_DETERMINISTIC=" + value + ": expected 1 or 0 (the default)");
    options.deterministic = value == "1";
  }
  if (const char* single = detail::nonempty_env("COLTRAIN_SHM_SINGLE_COPY")) {
    options.shared_memory_single_copy =
        detail::parse_single_copy(single, options.single_copy_bytes,
                                  options.single_copy_where_it_pays);
  }
  if (const char* spin = detail::nonempty_env("COLTRAIN_SPIN_US")) {
    options.spin_before_sleep = detail::parse_spin_microseconds(spin);
  }
  if (const char* host = detail::nonempty_env("COLTRAIN_HOST_ID")) {
    options.host_id = host;
    if (options.host_id.size() > 60)
      throw ConfigError("COLTRAIN_HOST_ID has " + std::to_string(options.host_id.size()) +
                        " characters: at most 60");
  }
  options.auth = auth_settings_from_env();
  for (const char* name : {"COLTRAIN_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"}) {
    if (const char* id = detail::nonempty_env(name)) {
      options.job_id = id;
      break;
    }
  }
  return options;
}

}  // namespace coltrain::comm
