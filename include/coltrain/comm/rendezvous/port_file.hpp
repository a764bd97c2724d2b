#pragma once
// Rank 0's rendezvous port, published in a file (COLTRAIN_PORT_FILE) that every rank can read: a
// shared file system between hosts, or any path on one host.
//
// Why: a port chosen before the job starts (MASTER_PORT) can be taken by anything between the
// choice and rank 0's bind; a port the kernel picks from its ephemeral range, as a launcher's
// "free port" probe does, can be taken by any outgoing connection in that window. With
// MASTER_PORT=0 rank 0 binds a port the kernel picks and keeps it, so nothing can take it, and the
// others learn it from the file. And when rank 0 cannot start the rendezvous at all (the port is
// in use, the address is wrong), it writes why, so the other ranks fail at once with rank 0's
// reason instead of retrying their connection until COLTRAIN_TIMEOUT.
//
// The file holds one line: `coltrain-port 1 <job hash> port <number>` or
// `coltrain-port 1 <job hash> error <reason>`. It is replaced atomically (rename), so a reader
// sees a whole line or none. A line of another job (another COLTRAIN_JOB_ID, or an older run with
// another one) is not this job's and is waited past; rank 0 removes the file once the rendezvous
// is over, so the next run that uses the same path and job id cannot read a stale port. A rank 0
// killed between publishing and removing leaves its line behind: give each job a path of its own
// (under a per-job directory, or with the job id in the name).

#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>

namespace coltrain::comm::detail {

inline constexpr std::string_view kPortFileTag = "coltrain-port 1";

inline std::string port_file_job(std::uint64_t job_hash) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(job_hash));
  return text;
}

// Writes `line` to `file` atomically: a temporary beside it, then rename(). Not fsynced: the
// file only lives as long as the job's rendezvous.
inline void replace_port_file(const std::filesystem::path& file, const std::string& line,
                              const ErrorContext& context) {
  std::filesystem::path temporary = file;
  temporary += ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << line << '\n';
    out.close();
    if (!out) {
      throw CommError(
          "cannot write the rendezvous port file " + temporary.string() + " (COLTRAIN_PORT_FILE)",
          context);
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, file, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    throw CommError("cannot put the rendezvous port file in place at " + file.string() +
                        " (COLTRAIN_PORT_FILE): " + error.message(),
                    context);
  }
}

// Rank 0: the port it listens on for the rendezvous.
inline void publish_port(const std::filesystem::path& file, std::uint64_t job_hash, int port,
                         const ErrorContext& context) {
  replace_port_file(
      file,
      std::string(kPortFileTag) + " " + port_file_job(job_hash) + " port " + std::to_string(port),
      context);
}

// Rank 0: why it could not start the rendezvous (best effort: the caller is already failing).
inline void publish_rendezvous_failure(const std::filesystem::path& file, std::uint64_t job_hash,
                                       std::string reason, const ErrorContext& context) {
  std::replace(reason.begin(), reason.end(), '\n', ' ');
  try {
    replace_port_file(
        file, std::string(kPortFileTag) + " " + port_file_job(job_hash) + " error " + reason,
        context);
  } catch (const CommError&) {
  }
}

// Rank 0, once every rank has the address table: the port means nothing any more.
inline void withdraw_port_file(const std::filesystem::path& file) {
  std::error_code ignored;
  std::filesystem::remove(file, ignored);
}

// What a port file says for one job.
struct PublishedPort {
  enum class State { kAbsent, kPort, kFailure } state = State::kAbsent;
  int port = 0;
  std::string failure;
};

// Reads `file` for the job `job_hash`: absent when there is no file, no whole line, or another
// job's line. A line of this job that is neither a port nor a failure is an error.
inline PublishedPort read_port_file(const std::filesystem::path& file, std::uint64_t job_hash,
                                    const ErrorContext& context) {
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line) || in.eof()) return {};  // no file, or no whole line yet
  const std::string prefix = std::string(kPortFileTag) + " " + port_file_job(job_hash) + " ";
  if (line.rfind(std::string(kPortFileTag) + " ", 0) != 0) {
    throw ConfigError("COLTRAIN_PORT_FILE=" + file.string() +
                          " is not a coltrain port file (its first line is \"" +
                          line.substr(0, 80) + "\")",
                      context);
  }
  if (line.rfind(prefix, 0) != 0) return {};  // another job's
  const std::string rest = line.substr(prefix.size());
  if (rest.rfind("error ", 0) == 0) {
    return {PublishedPort::State::kFailure, 0, rest.substr(6)};
  }
  if (rest.rfind("port ", 0) == 0) {
    std::istringstream number(rest.substr(5));
    int port = 0;
    if (number >> port && number.eof() && port >= 1 && port <= 65535) {
      return {PublishedPort::State::kPort, port, {}};
    }
  }
  throw ConfigError("COLTRAIN_PORT_FILE=" + file.string() +
                        " holds a malformed line for this job: \"" + line.substr(0, 120) + "\"",
                    context);
}

// Ranks 1..n-1: waits for rank 0 to publish its port in `file`. Returns the port; throws
// CommError with rank 0's reason when it published a failure, TimeoutError at the deadline.
inline int await_published_port(const std::filesystem::path& file, std::uint64_t job_hash,
                                const Deadline& deadline, std::chrono::milliseconds timeout,
                                const ErrorContext& context) {
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    const PublishedPort published = read_port_file(file, job_hash, context);
    if (published.state == PublishedPort::State::kPort) return published.port;
    if (published.state == PublishedPort::State::kFailure) {
      ErrorContext peer_context = context;
      peer_context.peer = 0;
      throw CommError("rank 0 could not start the rendezvous: " + published.failure +
                          " (reported in COLTRAIN_PORT_FILE=" + file.string() + ")",
                      peer_context);
    }
    if (deadline.expired()) {
      ErrorContext peer_context = context;
      peer_context.peer = 0;
      throw TimeoutError(
          "rank 0 never arrived: it published no rendezvous port in "
          "COLTRAIN_PORT_FILE=" +
              file.string() + " within " + format_seconds(timeout) + " (COLTRAIN_TIMEOUT)",
          peer_context);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline.remaining()));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace coltrain::comm::detail
