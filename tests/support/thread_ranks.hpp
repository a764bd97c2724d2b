#pragma once
// Runs the ranks of a TCP job as threads of the test process, each with a Communicator of its own
// bootstrapped on loopback, rank 0 on a port the kernel picks (MASTER_PORT=0), published to the
// others in a port file of the job's own. Threads, not processes: ranks of a
// GPU test share the one CUDA context, which a fork() after CUDA's initialisation could not use.
//
// A rank's function must not use Catch assertions (Catch is not thread-safe); it reports failures
// by throwing, for example with coltrain::testing::expect(). Each rank's exception message is
// returned, empty for a rank that finished.

#include "tcp_launch.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/core/env.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace coltrain::testing {

// Rank `rank` of a job of `world_size` ranks on this host, with its rendezvous at 127.0.0.1:port
// (0: a port the kernel picks, published in CommOptions::port_file).
inline LaunchEnv loopback_env(int rank, int world_size, int port) {
  LaunchEnv env;
  env.rank = rank;
  env.world_size = world_size;
  env.local_rank = rank;
  env.local_world_size = world_size;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return env;
}

// `base` gives the options other than the timeout and what the job's rendezvous needs.
inline std::vector<std::string> run_thread_ranks(
    int world_size, const std::function<void(comm::Communicator&)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(30),
    const comm::CommOptions& base = {}) {
  static int launches = 0;
  const std::string job_id =
      "thread-ranks-" + std::to_string(::getpid()) + "-" + std::to_string(launches++);
  const TempDir job_dir("coltrain_thread_job");
  std::vector<std::string> failures(static_cast<std::size_t>(world_size));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world_size; ++rank) {
    ranks.emplace_back([&, rank] {
      std::string& failure = failures[static_cast<std::size_t>(rank)];
      try {
        const LaunchEnv env = loopback_env(rank, world_size, 0);
        comm::CommOptions options = base;
        options.timeout = timeout;  // a rank that failed early makes the others fail, not hang
        options.job_id = job_id;
        options.port_file = job_dir / "rendezvous_port";
        comm::Communicator communicator = comm::Communicator::tcp(env, options);
        body(communicator);
      } catch (const std::exception& e) {
        failure = "rank " + std::to_string(rank) + ": " + e.what();
      } catch (...) {
        failure = "rank " + std::to_string(rank) + ": a non-standard exception";
      }
    });
  }
  for (std::thread& rank : ranks) rank.join();
  return failures;
}

// The failures of run_thread_ranks() as one text, empty when every rank finished.
inline std::string joined(const std::vector<std::string>& failures) {
  std::string text;
  for (const std::string& failure : failures) {
    if (!failure.empty()) text += failure + "\n";
  }
  return text;
}

}  // namespace coltrain::testing
