#pragma once
// Settings of a communicator that users change through the environment, as with NCCL_* and GLOO_*:
// COLTRAIN_TIMEOUT, COLTRAIN_SOCKET_IFNAME, COLTRAIN_JOB_ID, COLTRAIN_TRACE_DIR, COLTRAIN_SHM,
// COLTRAIN_SHM_SINGLE_COPY, COLTRAIN_HOST_ID, COLTRAIN_PORT_FILE, and the shared secret of
// comm/rendezvous/auth.hpp (COLTRAIN_AUTH_TOKEN, COLTRAIN_AUTH_FILE, COLTRAIN_AUTH).

#include <coltrain/comm/rendezvous/auth.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace coltrain::comm {

struct CommOptions {
  // Bound on every blocking wait and on the connect-and-retry window of the TCP rendezvous.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Network interface whose address (IPv4 or IPv6) the TCP transport listens on and advertises;
  // empty: the address this host uses to reach MASTER_ADDR.
  std::string socket_ifname;
  // Identifies the job in TCP handshakes, so processes of another job that reach our ports are
  // turned away. The same on every rank: COLTRAIN_JOB_ID, else SLURM_JOB_ID, else
  // TORCHELASTIC_RUN_ID.
  std::string job_id;
  // Where the flight recorder writes its file when a call fails or SIGUSR1 arrives
  // (comm/protocol/flight_recorder.hpp); empty: nowhere. COLTRAIN_TRACE_DIR.
  std::filesystem::path trace_dir;
  // The job's shared secret: with one, every TCP connection of the job proves it both ways.
  AuthSettings auth;
  // Whether the TCP backend moves the bytes of ranks on one host through shared memory
  // (comm/transport/shm/shm_channel.hpp); both ranks of a pair must want it. COLTRAIN_SHM=0 turns
  // it off.
  bool shared_memory = true;
  // Whether payloads of at least single_copy_bytes between ranks that share memory are copied
  // once, straight from the sender's memory (process_vm_readv), instead of twice through a ring;
  // used only where a probe at setup shows it works. COLTRAIN_SHM_SINGLE_COPY=0 turns it off.
  bool shared_memory_single_copy = true;
  // Below this size the reader's system call costs more than the ring's second copy.
  std::size_t single_copy_bytes = std::size_t{64} << 10;
  // Replaces the host identity that decides which ranks share memory (as NCCL_HOSTID does): ranks
  // with the same COLTRAIN_HOST_ID try shared memory (a segment that is not in fact shared falls
  // back to TCP), ranks with different ones use TCP. At most 60 characters.
  std::string host_id;
  // Where rank 0 publishes the port of its rendezvous, and why it failed if it could not start
  // one; the other ranks wait for it there (comm/rendezvous/port_file.hpp). Needed with
  // MASTER_PORT=0 (rank 0 listens on a port the kernel picks, which nothing can take before it).
  // COLTRAIN_PORT_FILE.
  std::filesystem::path port_file;
};

namespace detail {

inline const char* nonempty_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

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

// COLTRAIN_SHM_SINGLE_COPY: 0 (off), 1 (on, the default size), or the smallest payload piece in
// bytes that goes by single copy (4096 or more). Returns whether it is on.
inline bool parse_single_copy(const std::string& text, std::size_t& min_bytes) {
  if (text == "0") return false;
  if (text == "1") return true;
  std::size_t used = 0;
  unsigned long long bytes = 0;
  try {
    bytes = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.front() == '-' || bytes < 4096 || bytes > (1ull << 40)) {
    throw ConfigError("COLTRAIN_SHM_SINGLE_COPY=" + text +
                      ": expected 0, 1 (the default), or the smallest payload in bytes that goes "
                      "by single copy (4096 to 2^40)");
  }
  min_bytes = static_cast<std::size_t>(bytes);
  return true;
}

}  // namespace detail

inline CommOptions comm_options_from_env() {
  CommOptions options;
  if (const char* timeout = detail::nonempty_env("COLTRAIN_TIMEOUT")) {
    options.timeout = detail::parse_timeout_seconds(timeout);
  }
  if (const char* ifname = detail::nonempty_env("COLTRAIN_SOCKET_IFNAME")) {
    options.socket_ifname = ifname;
  }
  if (const char* dir = detail::nonempty_env("COLTRAIN_TRACE_DIR")) options.trace_dir = dir;
  if (const char* file = detail::nonempty_env("COLTRAIN_PORT_FILE")) options.port_file = file;
  if (const char* shm = detail::nonempty_env("COLTRAIN_SHM")) {
    const std::string value = shm;
    if (value != "0" && value != "1")
      throw ConfigError("COLTRAIN_SHM=" + value + ": expected 1 (the default) or 0");
    options.shared_memory = value == "1";
  }
  if (const char* single = detail::nonempty_env("COLTRAIN_SHM_SINGLE_COPY")) {
    options.shared_memory_single_copy =
        detail::parse_single_copy(single, options.single_copy_bytes);
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
