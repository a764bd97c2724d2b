// The TCP transport across real processes: every rank is a child process with torchrun's variables,
// so these tests go through the same rendezvous, sockets and failure paths as a job on a cluster.
#include <catch2/catch.hpp>

#include "../support/tcp_launch.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/rendezvous/descriptor_limit.hpp>
#include <coltrain/comm/rendezvous/port_file.hpp>
#include <coltrain/comm/transport/tcp/tcp_transport.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using Catch::Matchers::Contains;
using coltrain::comm::MessageHeader;
using coltrain::comm::TcpTransport;
using coltrain::testing::expect;
using coltrain::testing::launch_ranks;
using coltrain::testing::LaunchOptions;
using coltrain::testing::RankOutcome;
using namespace std::chrono_literals;

namespace {

TcpTransport connect_from_env() {
  return TcpTransport(coltrain::detect_launch_env(), coltrain::comm::comm_options_from_env());
}

MessageHeader header_of(std::uint64_t sequence, std::size_t bytes) {
  MessageHeader header;
  header.collective = coltrain::comm::Collective::kAllgather;
  header.dtype = coltrain::DataType::kUInt8;
  header.sequence = sequence;
  header.count = bytes;
  header.bytes = bytes;
  return header;
}

// The bytes `sender` sends as message `sequence`: different for every sender, message and offset.
std::vector<std::byte> payload_of(int sender, std::uint64_t sequence, std::size_t bytes) {
  std::vector<std::uint64_t> words((bytes + 7) / 8);
  for (std::size_t i = 0; i < words.size(); ++i) {
    words[i] = (i * 0x9E3779B97F4A7C15ull) ^ (sequence << 40) ^ static_cast<std::uint64_t>(sender);
  }
  std::vector<std::byte> payload(bytes);
  if (bytes > 0) std::memcpy(payload.data(), words.data(), bytes);
  return payload;
}

// Every rank sends `bytes` to the next rank and checks what the previous one sent it.
void expect_message_around_ring(TcpTransport& transport, std::size_t bytes,
                                const std::string& what) {
  const int rank = transport.rank(), size = transport.size();
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  const std::vector<std::byte> outgoing = payload_of(rank, 0, bytes);
  std::vector<std::byte> incoming(bytes);
  const auto send = transport.isend(next, header_of(0, bytes), outgoing);
  transport.wait(transport.irecv(previous, header_of(0, bytes), incoming));
  transport.wait(send);
  expect(incoming == payload_of(previous, 0, bytes), what);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs `body` and returns the text of the exception of type E it throws; anything else fails.
template <class E, class Body>
std::string expect_throws(const Body& body, const std::string& what) {
  try {
    body();
  } catch (const E& e) {
    return e.what();
  }
  throw std::runtime_error("expectation failed: " + what + " did not throw the expected error");
}

// The path between ranks of one host: shared memory with single copy for every large payload
// (COLTRAIN_SHM_SINGLE_COPY=always, where the host allows it, as this one does: by default only
// payloads where it pays take it, and these tests' buffers are not on huge pages), shared memory
// through the rings alone (COLTRAIN_SHM_SINGLE_COPY=0, as where single copy is refused), or
// loopback TCP (COLTRAIN_SHM=0). The tests of data and of failures run on all three.
// Whether ranks that are sibling processes may read each other's memory here: no Yama restriction,
// and process_vm_readv not refused (a seccomp profile). Elsewhere the transport keeps the rings.
bool host_allows_single_copy() {
  int scope = 0;
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  if (yama >> scope && scope != 0) return false;
  const auto& word = coltrain::comm::detail::single_copy_probe();
  return coltrain::comm::detail::reads_memory_of(::getpid(),
                                                 reinterpret_cast<std::uintptr_t>(&word), word);
}

LaunchOptions on_either_path(LaunchOptions options = {}) {
  const std::string path = GENERATE(as<std::string>{}, "single copy", "rings", "tcp");
  UNSCOPED_INFO("path: " << path);
  if (path == "single copy" && !host_allows_single_copy())
    WARN(
        "skipped part: this host refuses process_vm_readv between sibling processes (Yama "
        "ptrace_scope or seccomp): the single-copy path is not tested here, its cases run over "
        "the rings");
  options.env["COLTRAIN_SHM"] = path == "tcp" ? "0" : "1";
  options.env["COLTRAIN_SHM_SINGLE_COPY"] = path == "rings" ? "0" : "always";
  return options;
}

// Whether this rank's transport reaches every peer the way COLTRAIN_SHM and
// COLTRAIN_SHM_SINGLE_COPY ask for.
void expect_path(const TcpTransport& transport) {
  const bool shm = std::string(std::getenv("COLTRAIN_SHM")) == "1";
  const bool single = shm && std::string(std::getenv("COLTRAIN_SHM_SINGLE_COPY")) != "0" &&
                      host_allows_single_copy();
  for (int peer = 0; peer < transport.size(); ++peer) {
    if (peer == transport.rank()) continue;
    expect(transport.shares_memory_with(peer) == shm,
           "rank " + std::to_string(peer) +
               (shm ? " is reached through shared memory"
                    : " is reached through TCP (COLTRAIN_SHM=0)"));
    expect(transport.single_copy_with(peer) == single,
           "large payloads to rank " + std::to_string(peer) +
               (single ? " go by single copy" : " do not go by single copy"));
  }
}

void require_all_passed(const std::vector<RankOutcome>& outcomes) {
  INFO(coltrain::testing::describe(outcomes));
  for (const RankOutcome& outcome : outcomes) CHECK(outcome.passed());
}

}  // namespace

TEST_CASE("ring neighbours exchange messages of every size both ways at once", "[tcp]") {
  const int world_size = GENERATE(1, 2, 3, 4, 5);
  CAPTURE(world_size);
  LaunchOptions options = on_either_path();
  // 16 MiB is four times the largest buffer on either path (a shared-memory ring, a socket's
  // buffer: 4 MiB), so the ring wraps and the socket fills four times over; 64 MiB took 53 s of CI
  // in the sanitizer build.
  options.hard_timeout = std::chrono::seconds(120);
  const auto outcomes = launch_ranks(
      world_size,
      [](int rank) {
        TcpTransport transport = connect_from_env();
        expect_path(transport);
        const int n = transport.size();
        expect(transport.rank() == rank, "rank() is RANK");
        if (n == 1) {
          expect_throws<coltrain::InvalidArgument>([&] { transport.isend(0, header_of(0, 0), {}); },
                                                   "a send to oneself");
          return;
        }
        const int right = (rank + 1) % n;
        const int left = (rank + n - 1) % n;
        const std::vector<std::size_t> sizes = {0, 1, 40, 1 << 20, 16 << 20};
        for (std::uint64_t sequence = 0; sequence < sizes.size(); ++sequence) {
          const std::size_t bytes = sizes[sequence];
          const std::vector<std::byte> outgoing = payload_of(rank, sequence, bytes);
          std::vector<std::byte> incoming(bytes);
          const auto send = transport.isend(right, header_of(sequence, bytes), outgoing);
          const auto receive = transport.irecv(left, header_of(sequence, bytes), incoming);
          // Receive first: the send must progress while this waits, or ranks would deadlock.
          transport.wait(receive);
          transport.wait(send);
          transport.wait(send);  // a completed request returns at once
          expect(incoming == payload_of(left, sequence, bytes),
                 "the " + std::to_string(bytes) + "-byte message from rank " +
                     std::to_string(left) + " arrived intact");
        }
      },
      options);
  require_all_passed(outcomes);
}

TEST_CASE("many small messages arrive intact and in posting order", "[tcp]") {
  const LaunchOptions options = on_either_path();
  const auto outcomes = launch_ranks(
      3,
      [](int rank) {
        TcpTransport transport = connect_from_env();
        const int n = transport.size();
        constexpr std::uint64_t kMessages = 2000;
        auto size_of = [](std::uint64_t sequence) {
          return static_cast<std::size_t>(sequence % 97);
        };
        std::vector<std::vector<std::byte>> outgoing;
        std::vector<std::vector<std::byte>> incoming;
        std::vector<TcpTransport::Request> requests;
        for (int peer = 0; peer < n; ++peer) {
          if (peer == rank) continue;
          for (std::uint64_t sequence = 0; sequence < kMessages; ++sequence) {
            const std::size_t bytes = size_of(sequence);
            outgoing.push_back(payload_of(rank, sequence, bytes));
            incoming.emplace_back(bytes);
            requests.push_back(transport.isend(peer, header_of(sequence, bytes), outgoing.back()));
            requests.push_back(transport.irecv(peer, header_of(sequence, bytes), incoming.back()));
          }
        }
        // Newest first: waiting on a late request completes the earlier ones on the way.
        for (auto it = requests.rbegin(); it != requests.rend(); ++it) transport.wait(*it);
        std::size_t index = 0;
        for (int peer = 0; peer < n; ++peer) {
          if (peer == rank) continue;
          for (std::uint64_t sequence = 0; sequence < kMessages; ++sequence, ++index) {
            expect(incoming[index] == payload_of(peer, sequence, size_of(sequence)),
                   "message #" + std::to_string(sequence) + " from rank " + std::to_string(peer));
          }
        }

        // A receive posted after its message arrived.
        const int peer = rank == 0 ? 1 : 0;
        if (rank == 2) return;
        const std::vector<std::byte> late = payload_of(rank, kMessages, 1000);
        std::vector<std::byte> got(1000);
        const auto send = transport.isend(peer, header_of(kMessages, 1000), late);
        transport.wait(send);
        std::this_thread::sleep_for(100ms);
        transport.wait(transport.irecv(peer, header_of(kMessages, 1000), got));
        expect(got == payload_of(peer, kMessages, 1000), "the late receive got its message");
      },
      options);
  require_all_passed(outcomes);
}

TEST_CASE("messages that arrive while their receiver waits long on another rank stay intact",
          "[tcp]") {
  // Rank 1 waits on rank 2, which is slow to send (a straggler). Meanwhile rank 0's messages for
  // rank 1's later receives arrive: small ones, and large ones still on the way. A rank that waits
  // over 100 ms reads such messages ahead (parks them, to find failure notices behind them); its
  // later receives must get every byte, in order.
  constexpr std::uint64_t kMessages = 12;
  auto size_of = [](std::uint64_t sequence) {
    return sequence % 3 == 2 ? std::size_t{3} << 20 : static_cast<std::size_t>(sequence * 100);
  };
  const LaunchOptions options = on_either_path();
  const auto outcomes = launch_ranks(
      3,
      [&](int rank) {
        TcpTransport transport = connect_from_env();
        std::vector<std::byte> token(8);
        if (rank == 0) {
          std::vector<std::vector<std::byte>> outgoing;
          std::vector<TcpTransport::Request> sends;
          for (std::uint64_t sequence = 0; sequence < kMessages; ++sequence) {
            outgoing.push_back(payload_of(0, sequence, size_of(sequence)));
            sends.push_back(
                transport.isend(1, header_of(sequence, size_of(sequence)), outgoing.back()));
          }
          for (const auto& send : sends) transport.wait(send);
        } else if (rank == 2) {
          std::this_thread::sleep_for(600ms);
          transport.wait(transport.isend(1, header_of(0, 8), token));
        } else {
          transport.wait(transport.irecv(2, header_of(0, 8), token));
          for (std::uint64_t sequence = 0; sequence < kMessages; ++sequence) {
            std::vector<std::byte> incoming(size_of(sequence));
            transport.wait(transport.irecv(0, header_of(sequence, incoming.size()), incoming));
            expect(incoming == payload_of(0, sequence, incoming.size()),
                   "message #" + std::to_string(sequence) + " from rank 0");
          }
        }
      },
      options);
  require_all_passed(outcomes);
}

TEST_CASE("a count that differs between ranks is a MismatchError naming both", "[tcp]") {
  const LaunchOptions options = on_either_path();
  const auto outcomes = launch_ranks(
      2,
      [](int rank) {
        TcpTransport transport = connect_from_env();
        MessageHeader header = header_of(7, 40);
        header.collective = coltrain::comm::Collective::kAllreduce;
        header.dtype = coltrain::DataType::kFloat32;
        header.count = 10;
        std::vector<std::byte> buffer(40);
        if (rank == 1) {
          transport.wait(transport.isend(0, header, buffer));
          // Rank 0 breaks on the mismatch and tells this rank why: it hears of it at once.
          const auto start = std::chrono::steady_clock::now();
          const std::string lost = expect_throws<coltrain::MismatchError>(
              [&] { transport.wait(transport.irecv(0, header, buffer)); }, "waiting on rank 0");
          std::cerr << "rank 1 saw: " << lost << std::endl;
          expect(seconds_since(start) < 5, "rank 1 learned of the failure before its timeout");
          return;
        }
        header.count = 12;  // same bytes, different count: only the header check can tell
        const std::string mismatch = expect_throws<coltrain::MismatchError>(
            [&] { transport.wait(transport.irecv(1, header, buffer)); }, "a mismatched receive");
        std::cerr << "rank 0 saw: " << mismatch << std::endl;
        const std::string later = expect_throws<coltrain::CommError>(
            [&] { transport.isend(1, header, buffer); }, "a send after the error");
        std::cerr << "rank 0 then saw: " << later << std::endl;
      },
      options);
  require_all_passed(outcomes);
  CHECK_THAT(outcomes[0].output, Contains("count differs between ranks: rank 0 has 12, rank 1 has "
                                          "10") &&
                                     Contains("allreduce #7"));
  CHECK_THAT(outcomes[0].output, Contains("rank 0 then saw") &&
                                     Contains("unusable after an earlier error: count differs"));
  CHECK_THAT(outcomes[1].output,
             Contains("ranks called different collectives during allreduce #7; seen first by "
                      "rank 0: count differs between ranks: rank 0 has 12, rank 1 has 10"));
}

TEST_CASE("the survivors of a rank that dies mid-exchange fail fast, naming it", "[tcp]") {
  const bool killed = GENERATE(true, false);
  CAPTURE(killed);
  constexpr int kVictim = 3;
  LaunchOptions options = on_either_path();
  options.env["COLTRAIN_TIMEOUT"] = "10";
  const auto outcomes = launch_ranks(
      4,
      [killed](int rank) {
        TcpTransport transport = connect_from_env();
        constexpr std::size_t kBytes = 1 << 20;
        const std::vector<std::byte> outgoing = payload_of(rank, 0, kBytes);
        std::vector<std::byte> incoming(kBytes);
        if (rank == kVictim) {
          std::vector<std::vector<std::byte>> buffers(kVictim, std::vector<std::byte>(kBytes));
          for (std::uint64_t round = 0;; ++round) {
            std::vector<TcpTransport::Request> requests;
            for (int peer = 0; peer < kVictim; ++peer) {
              requests.push_back(transport.isend(peer, header_of(round, kBytes), outgoing));
              requests.push_back(transport.irecv(peer, header_of(round, kBytes),
                                                 buffers[static_cast<std::size_t>(peer)]));
            }
            if (round == 5) {
              transport.wait(requests[0]);  // mid-exchange: some messages out, others not
              if (killed) ::raise(SIGKILL);
              ::_exit(3);
            }
            for (const auto& request : requests) transport.wait(request);
          }
        }
        auto start = std::chrono::steady_clock::now();
        const std::string lost = expect_throws<coltrain::PeerLostError>(
            [&] {
              for (std::uint64_t round = 0;; ++round) {
                start = std::chrono::steady_clock::now();
                const auto send = transport.isend(kVictim, header_of(round, kBytes), outgoing);
                const auto receive = transport.irecv(kVictim, header_of(round, kBytes), incoming);
                transport.wait(send);
                transport.wait(receive);
              }
            },
            "exchanging with the dying rank");
        std::cerr << "rank " << rank << " saw: " << lost << std::endl;
        expect(seconds_since(start) < 3, "the loss was noticed well within COLTRAIN_TIMEOUT=10");
        expect(lost.find("lost its connection to rank 3") != std::string::npos, "names rank 3");
        expect_throws<coltrain::CommError>([&] { transport.irecv(kVictim, header_of(0, 0), {}); },
                                           "a call after the loss");
      },
      options);
  INFO(coltrain::testing::describe(outcomes));
  for (int rank = 0; rank < kVictim; ++rank) {
    CHECK(outcomes[static_cast<std::size_t>(rank)].passed());
    CHECK_THAT(outcomes[static_cast<std::size_t>(rank)].output,
               Contains("lost its connection to rank 3"));
  }
  if (killed) {
    CHECK(outcomes[kVictim].signal == SIGKILL);
  } else {
    CHECK(outcomes[kVictim].exit_code == 3);
  }
}

TEST_CASE("single copy: a send the peer leaves without copying fails at once, naming it", "[tcp]") {
  // The send is handed over by reference, and its sender awaits nothing else from the peer: only
  // the peer's copy could complete it, so the peer's end of stream must fail it. Rank 2 relays
  // "rank 1 has handed it over" to rank 0, as rank 0 cannot read past the message to hear it.
  const bool killed = GENERATE(true, false);
  CAPTURE(killed);
  if (!host_allows_single_copy()) {
    WARN("skipped part: this host refuses process_vm_readv between sibling processes");
    return;
  }
  LaunchOptions options;
  options.env["COLTRAIN_SHM"] = "1";
  options.env["COLTRAIN_SHM_SINGLE_COPY"] = "always";
  options.env["COLTRAIN_TIMEOUT"] = "10";
  const auto outcomes = launch_ranks(
      3,
      [killed](int rank) {
        TcpTransport transport = connect_from_env();
        expect(transport.single_copy_with((rank + 1) % 3), "single copy is on");
        std::vector<std::byte> token(8);
        if (rank == 0) {
          transport.wait(transport.irecv(2, header_of(1, token.size()), token));
          if (killed) ::raise(SIGKILL);
          ::_exit(3);
        }
        if (rank == 2) {
          transport.wait(transport.irecv(1, header_of(1, token.size()), token));
          transport.wait(transport.isend(0, header_of(1, token.size()), token));
          return;
        }
        const std::vector<std::byte> outgoing = payload_of(rank, 0, 1 << 20);
        const auto send = transport.isend(0, header_of(0, outgoing.size()), outgoing);
        // Its progress hands the large send over too, in the same pass or an earlier one.
        transport.wait(transport.isend(2, header_of(1, token.size()), token));
        const auto start = std::chrono::steady_clock::now();
        const std::string lost = expect_throws<coltrain::PeerLostError>(
            [&] { transport.wait(send); }, "waiting on the send rank 0 left without copying");
        std::cerr << "rank 1 saw: " << lost << std::endl;
        expect(seconds_since(start) < 3, "the loss was noticed well within COLTRAIN_TIMEOUT=10");
      },
      options);
  INFO(coltrain::testing::describe(outcomes));
  CHECK(outcomes[1].passed());
  CHECK_THAT(outcomes[1].output,
             Contains("lost its connection to rank 0 (peer closed the connection before copying "
                      "this rank's message) during allgather #0"));
  CHECK(outcomes[2].passed());
  if (killed) {
    CHECK(outcomes[0].signal == SIGKILL);
  } else {
    CHECK(outcomes[0].exit_code == 3);
  }
}

TEST_CASE("a receive that never gets its message times out, and the peer hears of it", "[tcp]") {
  const LaunchOptions options = on_either_path();
  const auto outcomes = launch_ranks(
      2,
      [](int rank) {
        coltrain::comm::CommOptions options = coltrain::comm::comm_options_from_env();
        options.timeout = rank == 0 ? 1s : 10s;
        TcpTransport transport(coltrain::detect_launch_env(), options);
        std::vector<std::byte> buffer(8);
        const int peer = 1 - rank;
        const auto start = std::chrono::steady_clock::now();
        if (rank == 0) {
          const std::string timeout = expect_throws<coltrain::TimeoutError>(
              [&] { transport.wait(transport.irecv(peer, header_of(3, 8), buffer)); }, "waiting");
          std::cerr << "rank 0 saw: " << timeout << std::endl;
          const double elapsed = seconds_since(start);
          expect(elapsed >= 0.95 && elapsed < 3,
                 "timed out after about 1 s, took " + std::to_string(elapsed) + " s");
          return;
        }
        // Rank 0 gives up after 1 s and says why; this rank must not wait out its 10 s.
        const std::string lost = expect_throws<coltrain::TimeoutError>(
            [&] { transport.wait(transport.irecv(peer, header_of(3, 8), buffer)); }, "waiting");
        std::cerr << "rank 1 saw: " << lost << std::endl;
        expect(seconds_since(start) < 4, "heard of rank 0's failure well before its own timeout");
      },
      options);
  require_all_passed(outcomes);
  CHECK_THAT(outcomes[0].output, Contains("made no progress for 1 s (COLTRAIN_TIMEOUT) waiting to "
                                          "receive allgather #3") &&
                                     Contains("from rank 1") &&
                                     Contains("its header has not arrived"));
  // Both ranks are alive and each waits to receive from the other: rank 0's inquiry finds the
  // cycle, and rank 1 hears rank 0's verdict.
  CHECK_THAT(outcomes[0].output, Contains("alive ranks wait on each other (rank 0 waits on rank 1, "
                                          "which waits on rank 0)"));
  CHECK_THAT(outcomes[1].output,
             Contains("seen first by rank 0") && Contains("alive ranks wait on each other"));
}

TEST_CASE("COLTRAIN_SPIN_US sets how long a wait polls before it sleeps, else the core count does",
          "[tcp]") {
  const auto outcomes = launch_ranks(
      2,
      [](int rank) {
        const coltrain::LaunchEnv env = coltrain::detect_launch_env();
        coltrain::comm::CommOptions options = coltrain::comm::comm_options_from_env();
        if (rank == 1) options.spin_before_sleep = std::chrono::microseconds(0);
        TcpTransport transport(env, options);
        const auto spin = transport.spin_before_sleep().count();
        const auto policy = coltrain::comm::detail::spin_before_sleep(env).count();
        expect(spin == (rank == 1 ? 0 : policy),
               "spins " + std::to_string(spin) + " us (policy " + std::to_string(policy) + ")");
        // It still works: a message each way.
        std::vector<std::byte> out(8, std::byte{static_cast<unsigned char>(rank)}), in(8);
        transport.wait(transport.isend(1 - rank, header_of(1, 8), out));
        transport.wait(transport.irecv(1 - rank, header_of(1, 8), in));
        expect(in[0] == std::byte{static_cast<unsigned char>(1 - rank)}, "the peer's byte arrived");
      },
      on_either_path());
  require_all_passed(outcomes);
}

TEST_CASE("a rank that stops taking part is named by every rank along the chain waiting on it",
          "[tcp]") {
  // A one-way ring: rank r receives from r - 1 and sends to r + 1. Rank 2 stops calling in (as a
  // stopped or busy process would): rank 3 waits on it, rank 0 on rank 3, rank 1 on rank 0. Each
  // would blame its own neighbour; the inquiry names rank 2 on every rank.
  constexpr int kRanks = 4, kStopped = 2;
  LaunchOptions options = on_either_path();
  options.env["COLTRAIN_TIMEOUT"] = "1";
  const auto outcomes = launch_ranks(
      kRanks,
      [](int rank) {
        TcpTransport transport = connect_from_env();
        std::vector<std::byte> outgoing(64), incoming(64);
        const int next = (rank + 1) % kRanks, previous = (rank + kRanks - 1) % kRanks;
        const auto start = std::chrono::steady_clock::now();
        const std::string error = expect_throws<coltrain::TimeoutError>(
            [&] {
              for (std::uint64_t round = 0; round < 1000; ++round) {
                if (rank == kStopped && round == 5) {
                  std::this_thread::sleep_for(4s);  // outside the transport: no answers
                  ::_exit(0);
                }
                const auto receive = transport.irecv(previous, header_of(round, 64), incoming);
                transport.wait(transport.isend(next, header_of(round, 64), outgoing));
                transport.wait(receive);
              }
            },
            "the ring with a silent rank");
        std::cerr << "rank " << rank << " saw: " << error << std::endl;
        expect(seconds_since(start) < 3, "failed within the timeout and the inquiry");
      },
      options);
  require_all_passed(outcomes);
  for (int rank = 0; rank < kRanks; ++rank) {
    if (rank == kStopped) continue;
    INFO("rank " << rank);
    CHECK_THAT(outcomes[static_cast<std::size_t>(rank)].output,
               Contains("rank 2 made no progress"));
  }
}

TEST_CASE("an error in the code of one rank between calls reaches the ranks waiting on it",
          "[tcp]") {
  LaunchOptions options = on_either_path();
  options.env["COLTRAIN_TIMEOUT"] = "20";
  const auto outcomes = launch_ranks(
      3,
      [](int rank) {
        std::vector<std::byte> buffer(16);
        if (rank == 1) {
          try {
            TcpTransport transport = connect_from_env();
            transport.wait(transport.isend(0, header_of(0, 16), buffer));
            throw std::runtime_error("the caller's own code failed");
          } catch (const std::runtime_error&) {
            return;  // the transport went while the exception propagated
          }
        }
        TcpTransport transport = connect_from_env();
        if (rank == 0) transport.wait(transport.irecv(1, header_of(0, 16), buffer));
        const auto start = std::chrono::steady_clock::now();
        const std::string error = expect_throws<coltrain::CommError>(
            [&] { transport.wait(transport.irecv(1, header_of(1, 16), buffer)); },
            "waiting on the rank that failed");
        std::cerr << "rank " << rank << " saw: " << error << std::endl;
        expect(seconds_since(start) < 5, "heard of it long before COLTRAIN_TIMEOUT=20");
      },
      options);
  require_all_passed(outcomes);
  for (const int rank : {0, 2}) {
    INFO("rank " << rank);
    CHECK_THAT(outcomes[static_cast<std::size_t>(rank)].output,
               Contains("rank 1 stopped with an error at or after allgather #0") &&
                   Contains("the process left while an exception was propagating"));
  }
}

TEST_CASE("a rank that dies fails every request outstanding on its peers", "[tcp][requests][p2p]") {
  LaunchOptions options = on_either_path();
  options.env["COLTRAIN_TIMEOUT"] = "20";
  const auto outcomes = launch_ranks(
      3,
      [](int rank) {
        auto comm = coltrain::comm::Communicator::tcp(coltrain::detect_launch_env());
        std::vector<float> warm(8, 1.0f);
        comm.allreduce(std::span(warm));
        if (rank == 2) ::raise(SIGKILL);
        constexpr int kRequests = 4;
        std::vector<std::vector<float>> data(kRequests, std::vector<float>(1 << 16, 1.0f));
        std::vector<coltrain::comm::Request> requests;
        const auto start = std::chrono::steady_clock::now();
        std::vector<double> message(1000);  // a receive of a message rank 2 was to send
        requests.push_back(comm.irecv(std::span(message), 2, 7));
        for (auto& buffer : data) requests.push_back(comm.iallreduce(std::span(buffer)));
        int failed = 0;
        for (const auto& request : requests) {
          const std::string error = expect_throws<coltrain::CommError>(
              [&] { request.wait(); }, "a request outstanding when rank 2 died");
          std::cerr << "rank " << rank << " request " << failed++ << ": " << error << std::endl;
        }
        expect(failed == kRequests + 1, "every outstanding request failed");
        expect(seconds_since(start) < 5, "long before COLTRAIN_TIMEOUT=20");
      },
      options);
  INFO(coltrain::testing::describe(outcomes));
  for (const int rank : {0, 1}) {
    CHECK(outcomes[static_cast<std::size_t>(rank)].passed());
    CHECK_THAT(outcomes[static_cast<std::size_t>(rank)].output, Contains("rank 2"));
  }
  CHECK(outcomes[2].signal == SIGKILL);
}

TEST_CASE("a receive whose send never comes times out with the tag and the rank", "[tcp][p2p]") {
  LaunchOptions options = on_either_path();
  options.env["COLTRAIN_TIMEOUT"] = "1";
  const auto outcomes = launch_ranks(
      2,
      [](int rank) {
        auto comm = coltrain::comm::Communicator::tcp(coltrain::detect_launch_env());
        // Each waits for the other's message, which never comes: whichever times out first names
        // its receive, and the other hears that verdict.
        std::vector<float> data(4);
        const std::string error = expect_throws<coltrain::CommError>(
            [&] { comm.recv(std::span(data), 1 - rank, 3); }, "a receive the peer never sends");
        std::cerr << "rank " << rank << ": " << error << std::endl;
        expect(error.find("send_recv #0 (tag 3, f32, count 4) from rank ") != std::string::npos,
               "the error names the message and the rank");
      },
      options);
  require_all_passed(outcomes);
}

TEST_CASE("strangers at the rendezvous port are turned away and the job goes on", "[tcp]") {
  using coltrain::comm::detail::RendezvousHello;
  LaunchOptions options;
  options.env["COLTRAIN_LOG_LEVEL"] = "warn";
  const auto outcomes = launch_ranks(
      3,
      [](int rank) {
        const coltrain::LaunchEnv env = coltrain::detect_launch_env();
        std::thread strangers;
        if (rank == 0) {
          strangers = std::thread([] {
            namespace detail = coltrain::comm::detail;
            const coltrain::Deadline deadline(5s);
            // Rank 0's port is the kernel's pick (MASTER_PORT=0), published in the port file.
            const coltrain::comm::CommOptions options = coltrain::comm::comm_options_from_env();
            const int port = detail::await_published_port(
                options.port_file, detail::hash_job_id(options.job_id), deadline, 5s, {});
            const detail::Endpoint master{detail::IpAddress::ipv4(htonl(INADDR_LOOPBACK)),
                                          static_cast<std::uint16_t>(port)};
            auto visit = [&](std::span<const std::byte> bytes) {
              detail::FileDescriptor socket =
                  detail::connect_with_retry(master, 0, deadline, "the rendezvous", 5s, {});
              detail::send_exact(socket.get(), bytes, deadline);
              return socket;
            };
            const std::string http =
                "GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: scanner\r\n\r\n";
            visit(std::as_bytes(std::span(http)));
            RendezvousHello other_job{};
            other_job.world_size = 3;
            other_job.rank = 1;
            other_job.job_hash = detail::hash_job_id("some other job");
            visit(detail::bytes_of_value(other_job));
            RendezvousHello out_of_range = other_job;
            out_of_range.rank = 9;
            out_of_range.job_hash =
                detail::hash_job_id(coltrain::comm::comm_options_from_env().job_id);
            visit(detail::bytes_of_value(out_of_range));
            visit(std::as_bytes(std::span("CTRV", 4)));  // closes after 4 of 56 bytes
            // Holds a silent connection open while the job bootstraps: it must block no one.
            const detail::FileDescriptor silent = visit({});
            std::this_thread::sleep_for(500ms);
          });
        } else {
          std::this_thread::sleep_for(200ms);  // the strangers come first
        }
        TcpTransport transport(env, coltrain::comm::comm_options_from_env());
        if (strangers.joinable()) strangers.join();
        expect_message_around_ring(transport, 4096, "the job works after the strangers left");
      },
      options);
  require_all_passed(outcomes);
  CHECK_THAT(outcomes[0].output, Contains("dropped a connection to the rendezvous") &&
                                     Contains("does not speak coltrain's rendezvous protocol") &&
                                     Contains("COLTRAIN_JOB_ID differs") &&
                                     Contains("claims rank 9") &&
                                     Contains("after 4 of 56 handshake bytes"));
}

TEST_CASE("a rank that never shows up makes the others time out, naming it", "[tcp]") {
  const int absent = GENERATE(2, 0);
  CAPTURE(absent);
  LaunchOptions options;
  options.env["COLTRAIN_TIMEOUT"] = "1";
  const auto outcomes = launch_ranks(
      3,
      [absent](int rank) {
        if (rank == absent) return;
        const auto start = std::chrono::steady_clock::now();
        const std::string timeout = expect_throws<coltrain::TimeoutError>(
            [] { connect_from_env(); }, "bootstrap without rank " + std::to_string(absent));
        std::cerr << "rank " << rank << " saw: " << timeout << std::endl;
        const double elapsed = seconds_since(start);
        expect(elapsed >= 0.95 && elapsed < 4,
               "gave up after about 1 s, took " + std::to_string(elapsed) + " s");
      },
      options);
  require_all_passed(outcomes);
  for (int rank = 0; rank < 3; ++rank) {
    if (rank == absent) continue;
    CHECK_THAT(outcomes[static_cast<std::size_t>(rank)].output,
               Contains("rank " + std::to_string(absent) + " never arrived"));
  }
}

TEST_CASE("the open-file limit a job needs: enough, a soft limit to raise, a hard limit to name",
          "[tcp][limits]") {
  using coltrain::comm::detail::plan_descriptor_limit;
  // 10 open, 255 peers: 10 + 255 + 16 = 281 needed.
  const auto enough = plan_descriptor_limit(10, 255, 281, 281);
  CHECK(enough.needed == 281);
  CHECK(enough.raise_to == 0);
  CHECK(enough.error.empty());
  CHECK(plan_descriptor_limit(10, 255, RLIM_INFINITY, RLIM_INFINITY).raise_to == 0);
  const auto soft = plan_descriptor_limit(10, 255, 280, 4096);
  CHECK(soft.raise_to == 4096);
  CHECK(soft.error.empty());
  CHECK(plan_descriptor_limit(10, 255, 280, RLIM_INFINITY).raise_to == RLIM_INFINITY);
  const auto hard = plan_descriptor_limit(10, 255, 256, 280);
  CHECK(hard.raise_to == 0);
  CHECK_THAT(hard.error, Contains("a job of 256 ranks needs about 281 open descriptors") &&
                             Contains("RLIMIT_NOFILE allows 256 (hard limit 280)") &&
                             Contains("ulimit -n 281") && Contains("--propagate=NOFILE"));
}

// Sets this process's open-file limits to `open + soft_room` and `open + hard_room`.
void limit_descriptors(std::uint64_t soft_room, std::uint64_t hard_room) {
  const std::uint64_t open = coltrain::comm::detail::open_descriptor_count();
  const rlimit limit{static_cast<rlim_t>(open + soft_room), static_cast<rlim_t>(open + hard_room)};
  expect(::setrlimit(RLIMIT_NOFILE, &limit) == 0, "setrlimit(RLIMIT_NOFILE)");
}

TEST_CASE(
    "a hard open-file limit below a socket per peer stops every rank at once, saying how to "
    "raise it",
    "[tcp][limits]") {
  // 8 ranks need 7 sockets and the headroom beyond what is open; the hard limit allows 12 more.
  LaunchOptions options;
  options.env["COLTRAIN_TIMEOUT"] = "3600";
  options.hard_timeout = 60s;
  const auto outcomes = launch_ranks(
      8,
      [](int) {
        limit_descriptors(12, 12);
        const auto start = std::chrono::steady_clock::now();
        const std::string error = expect_throws<coltrain::ConfigError>(
            [] { connect_from_env(); }, "a bootstrap beyond the open-file limit");
        std::cerr << error << std::endl;
        expect(seconds_since(start) < 5, "failed at once, not after a timeout");
      },
      options);
  INFO(coltrain::testing::describe(outcomes));
  require_all_passed(outcomes);
  for (const RankOutcome& outcome : outcomes)
    CHECK_THAT(outcome.output, Contains("a job of 8 ranks needs about") &&
                                   Contains("RLIMIT_NOFILE allows") && Contains("ulimit -n"));
}

TEST_CASE("a soft open-file limit below a socket per peer is raised to the hard limit",
          "[tcp][limits]") {
  const auto outcomes = launch_ranks(8, [](int) {
    limit_descriptors(4, 200);
    rlimit before{};
    ::getrlimit(RLIMIT_NOFILE, &before);
    TcpTransport transport = connect_from_env();
    rlimit after{};
    ::getrlimit(RLIMIT_NOFILE, &after);
    expect(after.rlim_cur == before.rlim_max && after.rlim_max == before.rlim_max,
           "the soft limit raised to the hard one: " + std::to_string(after.rlim_cur) + " of " +
               std::to_string(before.rlim_max));
    expect_message_around_ring(transport, 64, "the mesh works");
  });
  INFO(coltrain::testing::describe(outcomes));
  require_all_passed(outcomes);
}

TEST_CASE("the rendezvous port is free once bootstrap ends, for the next communicator", "[tcp]") {
  LaunchOptions options;  // a fixed port, as a launcher's MASTER_PORT is
  options.env["MASTER_PORT"] = std::to_string(coltrain::testing::free_tcp_port());
  const auto outcomes = launch_ranks(
      2,
      [](int rank) {
        const coltrain::LaunchEnv env = coltrain::detect_launch_env();
        for (std::uint64_t round = 0; round < 2; ++round) {
          TcpTransport transport = connect_from_env();
          if (rank == 0) {
            namespace detail = coltrain::comm::detail;
            const detail::FileDescriptor probe =
                detail::listen_tcp({detail::IpAddress::ipv4(htonl(INADDR_LOOPBACK)),
                                    static_cast<std::uint16_t>(env.master_port)},
                                   0, "the probe", {});
          }
          const std::vector<std::byte> outgoing = payload_of(rank, round, 100);
          std::vector<std::byte> incoming(100);
          const auto send = transport.isend(1 - rank, header_of(round, 100), outgoing);
          transport.wait(transport.irecv(1 - rank, header_of(round, 100), incoming));
          transport.wait(send);
          expect(incoming == payload_of(1 - rank, round, 100),
                 "exchange in round " + std::to_string(round));
        }
      },
      options);
  require_all_passed(outcomes);
}

TEST_CASE("COLTRAIN_SOCKET_IFNAME picks the data interface, an unknown one is named", "[tcp]") {
  LaunchOptions options;
  options.env["COLTRAIN_SOCKET_IFNAME"] = "lo";
  const auto outcomes = launch_ranks(
      2,
      [](int rank) {
        TcpTransport transport = connect_from_env();
        std::vector<std::byte> byte(1);
        const auto send = transport.isend(1 - rank, header_of(0, 1), byte);
        transport.wait(transport.irecv(1 - rank, header_of(0, 1), byte));
        transport.wait(send);
      },
      options);
  require_all_passed(outcomes);

  coltrain::LaunchEnv env;
  env.world_size = 2;
  env.master_port = coltrain::testing::free_tcp_port();
  coltrain::comm::CommOptions bad;
  bad.socket_ifname = "nosuchif0";
  CHECK_THROWS_AS(TcpTransport(env, bad), coltrain::ConfigError);
  CHECK_THROWS_WITH(TcpTransport(env, bad),
                    Contains("COLTRAIN_SOCKET_IFNAME=nosuchif0") && Contains("lo (127.0.0.1)"));
}

TEST_CASE("a MASTER_ADDR that names a host is reachable from other hosts", "[tcp]") {
  namespace detail = coltrain::comm::detail;
  CHECK(detail::names_loopback_only("localhost"));
  CHECK(detail::names_loopback_only("127.0.0.1"));
  CHECK(detail::names_loopback_only("127.0.1.1"));
  CHECK_FALSE(detail::names_loopback_only("node7"));
  CHECK_FALSE(detail::names_loopback_only("10.1.2.3"));

  // Debian maps the machine's own name to 127.0.1.1: rank 0 must not listen there only.
  const detail::Endpoint master{detail::IpAddress::ipv4(htonl(0x7F000101u)), 29500};
  CHECK(detail::rendezvous_listen_endpoint("node7", master) ==
        detail::Endpoint{detail::IpAddress::any(AF_INET), 29500});
  CHECK(detail::rendezvous_listen_endpoint("127.0.1.1", master) == master);

  // Nor announce a loopback data address to the other hosts, when this host has another.
  const detail::IpAddress announced =
      detail::data_address_for("node7", master, coltrain::comm::CommOptions{}, {});
  const std::optional<detail::IpAddress> outward = detail::outward_address(AF_INET);
  CAPTURE(announced.text());
  if (outward) {
    CHECK(announced == *outward);
  } else {
    CHECK(announced.is_loopback());
  }
  CHECK(detail::data_address_for("127.0.1.1", master, coltrain::comm::CommOptions{}, {})
            .is_loopback());
}

TEST_CASE("an IPv6 MASTER_ADDR works, with or without brackets", "[tcp]") {
  const std::string master = GENERATE(std::string("::1"), std::string("[::1]"));
  CAPTURE(master);
  LaunchOptions options;
  options.env["MASTER_ADDR"] = master;
  options.env["COLTRAIN_LOG_LEVEL"] = "info";
  const auto outcomes = launch_ranks(
      3,
      [](int rank) {
        TcpTransport transport = connect_from_env();
        const int right = (rank + 1) % 3;
        const int left = (rank + 2) % 3;
        const std::vector<std::byte> outgoing = payload_of(rank, 0, 1 << 20);
        std::vector<std::byte> incoming(1 << 20);
        const auto send = transport.isend(right, header_of(0, 1 << 20), outgoing);
        transport.wait(transport.irecv(left, header_of(0, 1 << 20), incoming));
        transport.wait(send);
        expect(incoming == payload_of(left, 0, 1 << 20), "1 MiB around the ring over IPv6");
      },
      options);
  require_all_passed(outcomes);
  for (const RankOutcome& outcome : outcomes) {
    CHECK_THAT(outcome.output, Contains("this rank's data listener was [::1]:"));
  }
  namespace detail = coltrain::comm::detail;
  CHECK(detail::resolve_address(master, "MASTER_ADDR", {}).is_v6());
  CHECK(detail::names_loopback_only(master));
}

namespace {

// A rank's first line, so that the test can tell its segments from other jobs' (a segment's name
// holds its creator's process id; tests running beside this one make segments too).
void print_pid() { std::cout << "pid " << ::getpid() << std::endl; }

// The names in /dev/shm of segments that the ranks of `outcomes` (each began with print_pid) made.
std::vector<std::string> segments_of(const std::vector<RankOutcome>& outcomes) {
  std::vector<std::string> prefixes;
  for (const RankOutcome& outcome : outcomes) {
    const std::size_t at = outcome.output.find("pid ");
    if (at == std::string::npos)
      throw std::runtime_error("rank " + std::to_string(outcome.rank) + " printed no pid");
    prefixes.push_back(std::string(coltrain::comm::detail::kShmNamePrefix) +
                       std::to_string(std::stol(outcome.output.substr(at + 4))) + ".");
  }
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const std::string name = entry.path().filename().string();
    for (const std::string& prefix : prefixes)
      if (name.starts_with(prefix)) names.push_back(name);
  }
  return names;
}

bool segment_exists(const std::string& name) {
  return std::filesystem::exists(std::filesystem::path("/dev/shm") / name);
}

void create_segment_file(const std::string& name) {
  const int fd = ::shm_open(("/" + name).c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
}

}  // namespace

TEST_CASE("shared memory: a dead creator's segment is removed, a live one's is left alone",
          "[tcp][shm]") {
  // A previous job's creator killed between creating a segment and its peer's unlink leaves the
  // name behind; the next job on the host removes it. A process that still exists may be another
  // job's rank in the middle of its setup: its names stay.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  REQUIRE(::waitpid(child, nullptr, 0) == child);  // its process id now names no process
  const std::string stale =
      std::string(coltrain::comm::detail::kShmNamePrefix) + std::to_string(child) + ".00000000";
  const std::string live = std::string(coltrain::comm::detail::kShmNamePrefix) +
                           std::to_string(::getpid()) + ".00000001";
  create_segment_file(stale);
  create_segment_file(live);
  const auto outcomes = launch_ranks(2, [](int) {
    TcpTransport transport = connect_from_env();
    for (int peer = 0; peer < transport.size(); ++peer) {
      if (peer != transport.rank())
        expect(transport.shares_memory_with(peer), "the ranks share memory");
    }
  });
  require_all_passed(outcomes);
  CHECK_FALSE(segment_exists(stale));
  CHECK(segment_exists(live));
  ::shm_unlink(("/" + live).c_str());
}

TEST_CASE("shared memory: two jobs on one host at once keep their bytes apart", "[tcp][shm]") {
  // Ranks 0-1 are one job, ranks 2-3 another (their own rendezvous port, job id and ranks), both
  // at once.
  const auto outcomes = launch_ranks(4, [](int launched) {
    print_pid();
    const int job = launched / 2;
    if (job == 1) {
      for (const char* name : {"COLTRAIN_PORT_FILE", "COLTRAIN_JOB_ID"}) {
        const std::string second = std::string(std::getenv(name)) + ".second";
        ::setenv(name, second.c_str(), 1);
      }
    }
    for (const char* name : {"RANK", "LOCAL_RANK"})
      ::setenv(name, std::to_string(launched % 2).c_str(), 1);
    for (const char* name : {"WORLD_SIZE", "LOCAL_WORLD_SIZE"}) ::setenv(name, "2", 1);
    TcpTransport transport = connect_from_env();
    const int rank = transport.rank(), peer = 1 - rank;
    expect(transport.shares_memory_with(peer), "the job's two ranks share memory");
    for (std::uint64_t sequence = 0; sequence < 20; ++sequence) {
      const std::size_t bytes = (sequence * 7919) % (3 << 20);
      const auto outgoing = payload_of(10 * job + rank, sequence, bytes);
      std::vector<std::byte> incoming(bytes);
      const auto send = transport.isend(peer, header_of(sequence, bytes), outgoing);
      transport.wait(transport.irecv(peer, header_of(sequence, bytes), incoming));
      transport.wait(send);
      expect(incoming == payload_of(10 * job + peer, sequence, bytes),
             "job " + std::to_string(job) + "'s message " + std::to_string(sequence) +
                 " came from its own peer, intact");
    }
  });
  require_all_passed(outcomes);
  // Every segment was unlinked once both ranks had it mapped.
  CHECK(segments_of(outcomes).empty());
}

TEST_CASE("shared memory: a killed rank is named at once and leaves no segment behind",
          "[tcp][shm]") {
  LaunchOptions options;
  options.env["COLTRAIN_TIMEOUT"] = "20";
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = launch_ranks(
      3,
      [](int rank) {
        print_pid();
        TcpTransport transport = connect_from_env();
        if (rank == 2) ::raise(SIGKILL);
        std::vector<std::byte> incoming(1 << 20);
        const auto error = expect_throws<coltrain::PeerLostError>(
            [&] { transport.wait(transport.irecv(2, header_of(0, incoming.size()), incoming)); },
            "a receive from the killed rank");
        expect(error.find("rank 2") != std::string::npos, "the error names rank 2: " + error);
      },
      options);
  CHECK(seconds_since(start) < 10);  // well within COLTRAIN_TIMEOUT
  INFO(coltrain::testing::describe(outcomes));
  CHECK(outcomes[0].passed());
  CHECK(outcomes[1].passed());
  CHECK(outcomes[2].signal == SIGKILL);
  CHECK(segments_of(outcomes).empty());
}

TEST_CASE(
    "shared memory: a job over two 'hosts' (COLTRAIN_HOST_ID) mixes both paths, every "
    "message intact",
    "[tcp][shm]") {
  // Ranks 0, 2, 4 claim host "a", ranks 1, 3 host "b": pairs on one host share memory, the others
  // talk over TCP, and a ring of messages crosses both kinds of link at every step.
  const auto outcomes = launch_ranks(5, [](int rank) {
    ::setenv("COLTRAIN_HOST_ID", rank % 2 == 0 ? "a" : "b", 1);
    TcpTransport transport = connect_from_env();
    const int n = transport.size();
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank) continue;
      expect(transport.shares_memory_with(peer) == (peer % 2 == rank % 2),
             "rank " + std::to_string(peer) + " is reached through " +
                 (peer % 2 == rank % 2 ? "shared memory" : "TCP"));
    }
    for (std::uint64_t sequence = 0; sequence < 12; ++sequence) {
      const int step = 1 + static_cast<int>(sequence % (n - 1));
      const int to = (rank + step) % n, from = (rank + n - step) % n;
      const std::size_t bytes = (sequence * 300007) % (5 << 20);
      const auto outgoing = payload_of(rank, sequence, bytes);
      std::vector<std::byte> incoming(bytes);
      const auto send = transport.isend(to, header_of(sequence, bytes), outgoing);
      transport.wait(transport.irecv(from, header_of(sequence, bytes), incoming));
      transport.wait(send);
      expect(incoming == payload_of(from, sequence, bytes),
             "message " + std::to_string(sequence) + " from rank " + std::to_string(from) +
                 " arrived intact");
    }
  });
  require_all_passed(outcomes);
}

TEST_CASE("MASTER_PORT=0: rank 0 publishes the port it was given, the others find it there",
          "[tcp][port_file]") {
  // Every launch_ranks job runs this way; here the file itself is checked: it names this job and
  // a port while the rendezvous is open, and is gone once every rank has the address table.
  const auto outcomes = launch_ranks(3, [](int rank) {
    const std::string file = std::getenv("COLTRAIN_PORT_FILE");
    expect(std::string(std::getenv("MASTER_PORT")) == "0", "the launcher sets MASTER_PORT=0");
    TcpTransport transport = connect_from_env();
    expect(transport.size() == 3 && transport.rank() == rank, "a job of 3 ranks formed");
    std::vector<std::byte> byte(1);
    const int next = (rank + 1) % 3, previous = (rank + 2) % 3;
    const auto send = transport.isend(next, header_of(0, 1), byte);
    transport.wait(transport.irecv(previous, header_of(0, 1), byte));
    transport.wait(send);
    if (rank == 0) expect(!std::filesystem::exists(file), "rank 0 removed the port file");
  });
  require_all_passed(outcomes);

  coltrain::LaunchEnv env;
  env.world_size = 2;
  env.master_port = 0;
  CHECK_THROWS_WITH(TcpTransport(env, coltrain::comm::CommOptions{}),
                    Contains("MASTER_PORT=0") && Contains("COLTRAIN_PORT_FILE"));
}

TEST_CASE("a port file is read for this job only, and whole", "[tcp][port_file]") {
  namespace detail = coltrain::comm::detail;
  coltrain::testing::TempDir dir("coltrain_port_file");
  const auto file = dir / "port";
  using State = detail::PublishedPort::State;
  CHECK(detail::read_port_file(file, 7, {}).state == State::kAbsent);
  detail::publish_port(file, 7, 41234, {});
  CHECK(detail::read_port_file(file, 8, {}).state == State::kAbsent);  // another job's line
  const detail::PublishedPort mine = detail::read_port_file(file, 7, {});
  CHECK(mine.state == State::kPort);
  CHECK(mine.port == 41234);
  detail::publish_rendezvous_failure(file, 7, "listen: Address already in use\nat line 2", {});
  const detail::PublishedPort failed = detail::read_port_file(file, 7, {});
  CHECK(failed.state == State::kFailure);
  CHECK(failed.failure == "listen: Address already in use at line 2");
  {
    std::ofstream partial(file, std::ios::trunc);
    partial << "coltrain-port 1 0000000000000007 port 412";  // no newline: still being written
  }
  CHECK(detail::read_port_file(file, 7, {}).state == State::kAbsent);
  {
    std::ofstream other(file, std::ios::trunc);
    other << "29500\n";
  }
  CHECK_THROWS_WITH(detail::read_port_file(file, 7, {}),
                    Contains("not a coltrain port file") && Contains("29500"));
  {
    std::ofstream bad(file, std::ios::trunc);
    bad << "coltrain-port 1 0000000000000007 port 70000\n";
  }
  CHECK_THROWS_WITH(detail::read_port_file(file, 7, {}), Contains("malformed"));
  detail::withdraw_port_file(file);
  CHECK_FALSE(std::filesystem::exists(file));
}

TEST_CASE("a rank 0 that cannot start the rendezvous tells the other ranks at once, with why",
          "[tcp][port_file]") {
  // The port is held by this test, so rank 0's listen fails. Without the port file the others
  // would retry their connection until COLTRAIN_TIMEOUT (an hour here) and then say only that rank
  // 0 never came; with it they fail with rank 0's own reason.
  namespace detail = coltrain::comm::detail;
  const detail::FileDescriptor holder = detail::listen_tcp(
      {detail::IpAddress::ipv4(htonl(INADDR_LOOPBACK)), 0}, 0, "a port this test holds", {});
  const int held = detail::local_endpoint(holder.get()).port;
  LaunchOptions options;
  options.env["MASTER_PORT"] = std::to_string(held);
  options.env["COLTRAIN_TIMEOUT"] = "3600";
  options.hard_timeout = 60s;
  const auto outcomes = launch_ranks(
      3, [](int) { TcpTransport transport = connect_from_env(); }, options);
  INFO(coltrain::testing::describe(outcomes));
  for (const RankOutcome& outcome : outcomes) {
    CHECK_FALSE(outcome.timed_out);
    CHECK(outcome.exit_code == 1);
    CHECK_THAT(outcome.output, Contains("Address already in use"));
  }
  for (std::size_t rank = 1; rank < outcomes.size(); ++rank) {
    CHECK_THAT(outcomes[rank].output,
               Contains("rank 0 could not start the rendezvous") && Contains("COLTRAIN_PORT_FILE"));
  }
}
