// ElasticGroup (coltrain/comm/elastic/elastic_group.hpp): ranks as threads of this process, each
// with a group of its own on a loopback port. A rank leaves by destroying its group (its
// connections close, as a killed process's do); the others' next collective fails naming it, they
// regroup, and their collectives on the new communicator are exact. Rank functions report failures
// by throwing.

#include "../support/thread_ranks.hpp"

#include <catch2/catch.hpp>
#include <coltrain/comm/elastic/elastic_group.hpp>
#include <coltrain/comm/rendezvous/auth.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/core/env.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace comm = coltrain::comm;
using coltrain::testing::expect;
using namespace std::chrono_literals;

struct Job {
  int port = coltrain::testing::free_tcp_port();
  int min_ranks = 1;
  std::shared_ptr<const comm::AuthSecret> secret;  // null: unauthenticated

  coltrain::LaunchEnv env(int rank, int world) const {
    return coltrain::testing::loopback_env(rank, world, port);
  }
  comm::CommOptions options() const {
    comm::CommOptions o;
    o.timeout = 5s;
    o.job_id = "elastic-" + std::to_string(port);
    o.auth.secret = secret;
    return o;
  }
  comm::ElasticOptions elastic(bool join = false) const {
    return {.min_ranks = min_ranks, .regroup_window = 3s, .join = join};
  }
};

// Runs body(rank) on `world` threads; returns their failures, one text ("" when all finished).
std::string run(int world, const std::function<void(int)>& body) {
  std::vector<std::string> failures(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(rank)] = "rank " + std::to_string(rank) + ": " + e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::string text;
  for (const std::string& f : failures)
    if (!f.empty()) text += f + "\n";
  return text;
}

// The sum over the group of (rank + 1), by allreduce.
std::int64_t rank_sum(comm::ElasticGroup& group) {
  std::int64_t value = group.rank() + 1;
  group.communicator().allreduce(std::span(&value, 1));
  return value;
}

// Until the collective fails (it must, with the rank gone); returns the rank it names.
int failed_rank(comm::ElasticGroup& group) {
  for (int call = 0; call < 1000; ++call) {
    try {
      rank_sum(group);
    } catch (const coltrain::CommError& e) {
      expect(e.context().peer.has_value(), std::string("the error names no rank: ") + e.what());
      return *e.context().peer;
    }
  }
  throw std::runtime_error("the collectives kept working without the lost rank");
}

// Until the leader sees a joiner at its door, agreed by all ranks; bounded: it knocks within a
// moment.
void wait_for_joiner(comm::ElasticGroup& group) {
  for (int round = 0; round < 500; ++round) {
    double waiting = group.joiners_waiting();
    group.communicator().allreduce(std::span(&waiting, 1), comm::ReduceOp::kMax);
    if (waiting > 0) return;
    std::this_thread::sleep_for(10ms);
  }
}

TEST_CASE("survivors regroup, whichever rank is lost, and their collectives are exact",
          "[elastic]") {
  const int lost = GENERATE(0, 1, 2);  // rank 0 hosts the rendezvous and leads
  Job job;
  const std::string failures = run(3, [&](int rank) {
    comm::ElasticGroup group(job.env(rank, 3), job.options(), job.elastic());
    expect(group.size() == 3 && group.rank() == rank && group.generation() == 1,
           "first generation");
    expect(rank_sum(group) == 6, "allreduce on 3 ranks");
    if (rank == lost) return;  // leaves: its connections close
    const int named = failed_rank(group);
    expect(named == lost,
           "the error names rank " + std::to_string(named) + ", not " + std::to_string(lost));
    const comm::MembershipChange change = group.regroup({named});
    expect(change.generation == 2 && change.previous_size == 3 && change.size == 2,
           "the second generation has 2 ranks");
    expect(change.departed == std::vector<int>{lost}, "the change names the lost rank");
    // New ranks follow the old order.
    expect(group.rank() == (rank < lost ? rank : rank - 1),
           "new rank " + std::to_string(group.rank()));
    for (int call = 0; call < 20; ++call) expect(rank_sum(group) == 3, "allreduce on 2 ranks");
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("below min_ranks the regroup throws, saying so", "[elastic]") {
  Job job;
  job.min_ranks = 2;
  const std::string failures = run(2, [&](int rank) {
    comm::ElasticGroup group(job.env(rank, 2), job.options(), job.elastic());
    if (rank == 1) return;
    const int named = failed_rank(group);
    try {
      group.regroup({named});
    } catch (const coltrain::CommError& e) {
      expect(
          std::string(e.what()).find("only 1 rank is left, fewer than the 2") != std::string::npos,
          std::string("the error: ") + e.what());
      expect(group.leading(), "the survivor led the failed regroup");
      return;
    }
    throw std::runtime_error("one rank regrouped although min_ranks is 2");
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("a joiner is admitted when the ranks agree, not at the launch", "[elastic]") {
  Job job;
  const std::string failures = run(3, [&](int thread) {
    if (thread == 2) {
      // A stranger's bytes at the door first: dropped, the job goes on.
      {
        const coltrain::comm::detail::Endpoint door{
            coltrain::comm::detail::resolve_address("127.0.0.1", "test", {}),
            static_cast<std::uint16_t>(job.port)};
        auto socket = coltrain::comm::detail::connect_with_retry(door, 0, coltrain::Deadline(5s),
                                                                 "the door", 5s, {});
        const std::string garbage(32, 'x');
        (void)coltrain::comm::detail::send_exact(socket.get(), std::as_bytes(std::span(garbage)),
                                                 coltrain::Deadline(1s));
      }
      comm::ElasticGroup joiner(job.env(0, 1), job.options(), job.elastic(true));
      expect(joiner.size() == 3 && joiner.rank() == 2, "the joiner is rank 2 of 3");
      expect(rank_sum(joiner) == 6, "allreduce with the joiner");
      return;
    }
    comm::ElasticGroup group(job.env(thread, 2), job.options(), job.elastic());
    expect(group.size() == 2, "the launch admits no joiner");
    wait_for_joiner(group);
    const comm::MembershipChange change = group.admit_joiners();
    expect(change.size == 3 && change.joined == 1 && change.departed.empty(), "one joined");
    expect(group.rank() == thread, "the members keep their order");
    expect(rank_sum(group) == 6, "allreduce with the joiner");
  });
  INFO(failures);
  CHECK(failures.empty());
}

#if COLTRAIN_WITH_OPENSSL
TEST_CASE("with a secret, regroups and joiners prove it, a joiner with another is refused",
          "[elastic][auth]") {
  Job job;
  job.secret = std::make_shared<const comm::AuthSecret>("0123456789abcdef0123456789abcdef", "test");
  Job impostor = job;
  impostor.secret =
      std::make_shared<const comm::AuthSecret>("fedcba9876543210fedcba9876543210", "test");
  const std::string failures = run(4, [&](int thread) {
    if (thread == 3) {
      try {
        comm::ElasticGroup refused(job.env(0, 1), impostor.options(), job.elastic(true));
        throw std::runtime_error("a joiner with another secret was admitted");
      } catch (const coltrain::CommError& e) {
        expect(std::string(e.what()).find("could not prove the job's secret") != std::string::npos,
               std::string("the impostor's error: ") + e.what());
      }
      comm::ElasticGroup joiner(job.env(0, 1), job.options(), job.elastic(true));
      expect(joiner.size() == 3 && joiner.rank() == 2, "the joiner is rank 2 of 3");
      expect(rank_sum(joiner) == 6, "allreduce with the joiner");
      return;
    }
    comm::ElasticGroup group(job.env(thread, 3), job.options(), job.elastic());
    expect(rank_sum(group) == 6, "allreduce on 3 ranks");
    if (thread == 2) return;  // leaves
    const int named = failed_rank(group);
    const comm::MembershipChange shrunk = group.regroup({named});
    expect(shrunk.size == 2 && rank_sum(group) == 3, "allreduce on the 2 survivors");
    wait_for_joiner(group);
    const comm::MembershipChange grown = group.admit_joiners();
    expect(grown.size == 3 && grown.joined == 1, "the joiner that proved the secret joined");
    expect(rank_sum(group) == 6, "allreduce with the joiner");
  });
  INFO(failures);
  CHECK(failures.empty());
}
#endif

}  // namespace
