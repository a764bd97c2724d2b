#pragma once
// Runs the ranks of a TCP job as child processes of a Catch test, the way torchrun would: each
// child gets RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT=0 with a COLTRAIN_PORT_FILE
// of the job's own, so rank 0 listens on a port the kernel gives it and nothing else can take
// (a port probed free beforehand can be taken by any connection of a test running beside it);
// runs the test's function for its rank, and exits 0 when it returned, 1 when it threw (after
// writing the exception to stderr). The parent collects each rank's exit status and everything it
// wrote, and kills the ranks that outlive a hard timeout, so a hanging rank fails the test instead
// of the run.
//
// Call it from a single-threaded test (fork() copies only the calling thread). A rank's function
// must not use Catch assertions: the child's Catch state dies with it. It reports failures by
// throwing, for example with expect().

#include <coltrain/comm/transport/tcp/socket.hpp>

#include "temp_dir.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace coltrain::testing {

struct RankOutcome {
  int rank = 0;
  int exit_code = -1;      // when the rank exited
  int signal = 0;          // the signal that ended it, or 0
  bool timed_out = false;  // killed by the launcher at the hard timeout
  std::string output;      // its stdout and stderr

  bool passed() const { return !timed_out && signal == 0 && exit_code == 0; }

  std::string describe() const {
    std::string how = timed_out     ? "was killed at the launcher's hard timeout"
                      : signal != 0 ? "died of signal " + std::to_string(signal)
                                    : "exited with status " + std::to_string(exit_code);
    return "rank " + std::to_string(rank) + " " + how + "; its output:\n" + output;
  }
};

struct LaunchOptions {
  // Set in every rank (COLTRAIN_TIMEOUT...), after the launcher's own variables, which they
  // override.
  std::map<std::string, std::string> env;
  std::chrono::milliseconds hard_timeout{std::chrono::seconds(30)};
};

// How a rank's function reports a failed expectation.
inline void expect(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error("expectation failed: " + what);
}

// How a rank's function checks that call() throws an exception whose message contains `part`.
template <class F>
void expect_throws_containing(F&& call, const std::string& part, const std::string& what) {
  try {
    call();
  } catch (const std::exception& e) {
    const std::string message = e.what();
    if (message.find(part) != std::string::npos) return;
    throw std::runtime_error("expectation failed: " + what + ": the error \"" + message +
                             "\" does not contain \"" + part + "\"");
  }
  throw std::runtime_error("expectation failed: " + what + ": nothing was thrown");
}

// The lowest port of the kernel's ephemeral range, from which every outgoing connection draws its
// local port.
inline int first_ephemeral_port() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  range >> low;
  return low;
}

// A TCP port on 127.0.0.1 that nothing listens on now, below the ephemeral range, for the jobs
// that need a fixed port (an elastic job's joiners come back to it). The kernel's pick for port 0
// would lie in the ephemeral range, where any outgoing connection can take it before the job binds
// it; here only another test drawing the same port from about 12,000 in the same moment could.
inline int free_tcp_port() {
  const int low = 20000, high = std::max(low + 1000, first_ephemeral_port());
  std::random_device seed;
  std::mt19937 draw(seed() ^ static_cast<unsigned>(::getpid()));
  std::uniform_int_distribution<int> pick(low, high - 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(draw);
    try {
      const comm::detail::FileDescriptor probe = comm::detail::listen_tcp(
          {comm::detail::IpAddress::ipv4(htonl(INADDR_LOOPBACK)), static_cast<std::uint16_t>(port)},
          0, "a free port for a test job", {});
      return port;
    } catch (const Error&) {
    }
  }
  throw std::runtime_error("no free TCP port in [" + std::to_string(low) + ", " +
                           std::to_string(high) + ") after 200 draws");
}

namespace detail {

// The variables of other launchers that could contradict ours (a test run under mpiexec).
inline constexpr const char* kForeignLaunchVariables[] = {"OMPI_COMM_WORLD_RANK",
                                                          "OMPI_COMM_WORLD_SIZE",
                                                          "OMPI_COMM_WORLD_LOCAL_RANK",
                                                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                          "PMI_RANK",
                                                          "PMI_SIZE",
                                                          "MPI_LOCALRANKID",
                                                          "MPI_LOCALNRANKS"};

[[noreturn]] inline void run_rank(int rank, int world_size, const std::string& port_file,
                                  const std::string& job_id, int output,
                                  const std::function<void(int)>& body,
                                  const LaunchOptions& options) {
  ::dup2(output, STDOUT_FILENO);
  ::dup2(output, STDERR_FILENO);
  ::close(output);
  for (const char* name : kForeignLaunchVariables) ::unsetenv(name);
  const std::map<std::string, std::string> launch = {
      {"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world_size)},
      {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", "0"},
      {"COLTRAIN_PORT_FILE", port_file},    {"COLTRAIN_JOB_ID", job_id},
  };
  for (const auto& [name, value] : launch) ::setenv(name.c_str(), value.c_str(), 1);
  for (const auto& [name, value] : options.env) ::setenv(name.c_str(), value.c_str(), 1);
  int status = 0;
  try {
    body(rank);
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << " failed: " << e.what() << std::endl;
    status = 1;
  } catch (...) {
    std::cerr << "rank " << rank << " failed with a non-standard exception" << std::endl;
    status = 1;
  }
  std::cout.flush();
  std::cerr.flush();
  // _exit: the parent's atexit handlers and static destructors (Catch's) are not the child's to
  // run.
  ::_exit(status);
}

}  // namespace detail

// Runs `body(rank)` in `world_size` child processes and returns their outcomes, indexed by rank.
inline std::vector<RankOutcome> launch_ranks(int world_size, const std::function<void(int)>& body,
                                             const LaunchOptions& options = {}) {
  static int launches = 0;
  const std::string job_id =
      "tcp-test-" + std::to_string(::getpid()) + "-" + std::to_string(launches++);
  const TempDir job_dir("coltrain_tcp_job");
  const std::string port_file = (job_dir / "rendezvous_port").string();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);  // or the children would write the parent's buffered output again

  struct Child {
    pid_t pid = -1;
    int output = -1;  // read end of the pipe to its stdout and stderr
    bool running = true;
  };
  std::vector<Child> children(static_cast<std::size_t>(world_size));
  std::vector<RankOutcome> outcomes(static_cast<std::size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    int pipe_ends[2];
    if (::pipe(pipe_ends) != 0) throw std::runtime_error("pipe() failed");
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork() failed");
    if (pid == 0) {
      ::close(pipe_ends[0]);
      for (int earlier = 0; earlier < rank; ++earlier) {
        ::close(children[static_cast<std::size_t>(earlier)].output);
      }
      detail::run_rank(rank, world_size, port_file, job_id, pipe_ends[1], body, options);
    }
    ::close(pipe_ends[1]);
    children[static_cast<std::size_t>(rank)] = {pid, pipe_ends[0], true};
    outcomes[static_cast<std::size_t>(rank)].rank = rank;
  }

  const auto hard_deadline = std::chrono::steady_clock::now() + options.hard_timeout;
  bool killed = false;
  while (true) {
    std::vector<pollfd> outputs;
    std::vector<std::size_t> owners;
    for (std::size_t i = 0; i < children.size(); ++i) {
      if (children[i].output < 0) continue;
      outputs.push_back({children[i].output, POLLIN, 0});
      owners.push_back(i);
    }
    bool any_running = false;
    for (std::size_t i = 0; i < children.size(); ++i) {
      Child& child = children[i];
      if (!child.running) continue;
      int status = 0;
      if (::waitpid(child.pid, &status, WNOHANG) == child.pid) {
        child.running = false;
        if (WIFEXITED(status)) outcomes[i].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) outcomes[i].signal = WTERMSIG(status);
      } else {
        any_running = true;
      }
    }
    if (!any_running && outputs.empty()) break;
    if (!killed && std::chrono::steady_clock::now() > hard_deadline) {
      killed = true;
      for (std::size_t i = 0; i < children.size(); ++i) {
        if (!children[i].running) continue;
        ::kill(children[i].pid, SIGKILL);
        outcomes[i].timed_out = true;
      }
    }
    ::poll(outputs.data(), outputs.size(), 20);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      if (outputs[k].revents == 0) continue;
      Child& child = children[owners[k]];
      char buffer[4096];
      const ssize_t got = ::read(child.output, buffer, sizeof buffer);
      if (got > 0) {
        outcomes[owners[k]].output.append(buffer, static_cast<std::size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(child.output);
        child.output = -1;
      }
    }
  }
  return outcomes;
}

// Every outcome's description, for Catch's INFO when a check fails.
inline std::string describe(const std::vector<RankOutcome>& outcomes) {
  std::string text;
  for (const RankOutcome& outcome : outcomes) text += outcome.describe() + "\n";
  return text;
}

}  // namespace coltrain::testing
