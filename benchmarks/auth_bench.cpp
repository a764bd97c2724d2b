// What the job's secret costs: the TCP rendezvous of --ranks ranks (threads of this process, on
// loopback) from the first rank's start to the last rank's ready communicator, and the latency of
// an 8-byte allreduce on 2 ranks, each with and without COLTRAIN_AUTH_TOKEN's challenge-response
// (comm/rendezvous/tcp_handshake.hpp). The two settings alternate round by round, so drift in the
// machine's load falls on both; medians are reported.
//
//   build/benchmarks/auth_bench --ranks 8 --rounds 30 --calls 2000

#include "../tests/support/thread_ranks.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/auth.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/timer.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace coltrain;

comm::CommOptions options_with(const std::shared_ptr<const comm::AuthSecret>& secret, int port) {
  comm::CommOptions options;
  options.timeout = std::chrono::seconds(30);
  options.job_id = "auth-bench-" + std::to_string(port);
  options.auth.secret = secret;
  return options;
}

// Seconds from the start of every rank's rendezvous to the last ready communicator.
double rendezvous_seconds(int ranks, const std::shared_ptr<const comm::AuthSecret>& secret) {
  const int port = testing::free_tcp_port();
  std::vector<std::thread> threads;
  std::vector<double> ready(static_cast<std::size_t>(ranks));
  const Stopwatch clock;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      comm::Communicator communicator = comm::Communicator::tcp(
          testing::loopback_env(rank, ranks, port), options_with(secret, port));
      ready[static_cast<std::size_t>(rank)] = clock.seconds();
      communicator.barrier();  // no rank closes its connections while another still handshakes
    });
  }
  for (std::thread& thread : threads) thread.join();
  return *std::ranges::max_element(ready);
}

// Median microseconds of an 8-byte allreduce between 2 ranks.
double allreduce_microseconds(int calls, const std::shared_ptr<const comm::AuthSecret>& secret) {
  const int port = testing::free_tcp_port();
  std::vector<double> per_call(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      comm::Communicator communicator =
          comm::Communicator::tcp(testing::loopback_env(rank, 2, port), options_with(secret, port));
      double value = rank;
      for (int call = 0; call < calls / 10; ++call) communicator.allreduce(std::span(&value, 1));
      std::vector<double> samples;
      for (int call = 0; call < calls; ++call) {
        const Stopwatch one;
        communicator.allreduce(std::span(&value, 1));
        samples.push_back(one.seconds() * 1e6);
      }
      std::ranges::nth_element(samples, samples.begin() + samples.size() / 2);
      per_call[static_cast<std::size_t>(rank)] = samples[samples.size() / 2];
    });
  }
  for (std::thread& thread : threads) thread.join();
  return per_call[0];
}

double median(std::vector<double> values) {
  std::ranges::sort(values);
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Cost of the shared-secret handshake at rendezvous and per collective"};
  int ranks = 8;
  int rounds = 30;
  int calls = 2000;
  app.add_option("--ranks", ranks, "ranks of the timed rendezvous")->check(CLI::Range(2, 64));
  app.add_option("--rounds", rounds, "rendezvous per setting")->check(CLI::Range(1, 10000));
  app.add_option("--calls", calls, "timed allreduce calls per round")
      ->check(CLI::Range(10, 1000000));
  CLI11_PARSE(app, argc, argv);

  const auto secret = std::make_shared<const comm::AuthSecret>(
      "bench-secret-0123456789abcdef0123456789abcdef", "auth_bench");
  std::vector<double> plain_ms, secret_ms;
  for (int round = 0; round < rounds; ++round) {
    plain_ms.push_back(rendezvous_seconds(ranks, nullptr) * 1e3);
    secret_ms.push_back(rendezvous_seconds(ranks, secret) * 1e3);
  }
  std::vector<double> plain_us, secret_us;
  for (int round = 0; round < 5; ++round) {
    plain_us.push_back(allreduce_microseconds(calls, nullptr));
    secret_us.push_back(allreduce_microseconds(calls, secret));
  }
  std::printf("%-34s %12s %12s %12s\n", "measure (median)", "no secret", "secret", "difference");
  std::printf("%-34s %12.2f %12.2f %12.2f\n",
              ("rendezvous of " + std::to_string(ranks) + " ranks, ms").c_str(), median(plain_ms),
              median(secret_ms), median(secret_ms) - median(plain_ms));
  std::printf("%-34s %12.2f %12.2f %12.2f\n", "8-byte allreduce, 2 ranks, us", median(plain_us),
              median(secret_us), median(secret_us) - median(plain_us));
  return 0;
}
