// Authenticated TCP handshakes (comm/rendezvous/auth.hpp, comm/rendezvous/tcp_handshake.hpp): the
// settings from the environment, the proofs, both sides of one handshake over a socket pair (right
// secret, wrong secret, replay, tampering), and whole jobs whose ranks are child processes: a job
// with a secret works, a rank with another secret or none is turned away, and a stranger's thousand
// tries during the rendezvous are all refused while the job completes exactly.
#include <catch2/catch.hpp>

#include "../support/tcp_launch.hpp"
#include "../support/temp_dir.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/rendezvous/auth.hpp>
#include <coltrain/comm/rendezvous/tcp_handshake.hpp>
#include <coltrain/comm/rendezvous/tcp_rendezvous.hpp>
#include <coltrain/comm/transport/tcp/tcp_transport.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace comm = coltrain::comm;
namespace detail = coltrain::comm::detail;
using Catch::Matchers::Contains;
using coltrain::testing::expect;
using coltrain::testing::launch_ranks;
using coltrain::testing::LaunchOptions;
using namespace std::chrono_literals;

constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";
constexpr const char* kOtherSecret = "fedcba9876543210fedcba9876543210";

// Sets environment variables for one scope and restores what was there before.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::optional<std::string>>& variables) {
    for (const auto& [name, value] : variables) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old != nullptr ? std::optional<std::string>(old) : std::nullopt;
      set(name, value);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) set(name, value);
  }

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

std::string config_error_of(const std::map<std::string, std::optional<std::string>>& variables) {
  const ScopedEnv env(variables);
  try {
    (void)comm::auth_settings_from_env();
  } catch (const coltrain::ConfigError& e) {
    return e.message();
  }
  return "no error";
}

std::string hex(std::span<const unsigned char> bytes) {
  std::ostringstream out;
  for (const unsigned char b : bytes) {
    out << "0123456789abcdef"[b >> 4] << "0123456789abcdef"[b & 15];
  }
  return out.str();
}

}  // namespace

TEST_CASE("the secret comes from COLTRAIN_AUTH_TOKEN or a private COLTRAIN_AUTH_FILE", "[auth]") {
  const coltrain::testing::TempDir dir;
  SECTION("no secret: unauthenticated, optional by default; COLTRAIN_AUTH=required is kept") {
    const ScopedEnv env({{"COLTRAIN_AUTH_TOKEN", std::nullopt},
                         {"COLTRAIN_AUTH_FILE", std::nullopt},
                         {"COLTRAIN_AUTH", "required"}});
    const comm::AuthSettings settings = comm::auth_settings_from_env();
    CHECK(settings.secret == nullptr);
    CHECK(settings.policy == comm::AuthPolicy::kRequired);
    comm::CommOptions options;
    options.auth = settings;
    const coltrain::Logger logger(0, 1);
    CHECK_THROWS_WITH(detail::check_door_security(detail::IpAddress::ipv4(htonl(INADDR_LOOPBACK)),
                                                  options, logger, {}),
                      Contains("COLTRAIN_AUTH=required, but no secret is set"));
  }
  SECTION("the token") {
    const ScopedEnv env({{"COLTRAIN_AUTH_TOKEN", kSecret}, {"COLTRAIN_AUTH_FILE", std::nullopt}});
    const comm::AuthSettings settings = comm::auth_settings_from_env();
    REQUIRE(settings.secret != nullptr);
    const auto bytes = settings.secret->bytes();
    CHECK(std::string(bytes.begin(), bytes.end()) == kSecret);
  }
  SECTION("a private file; its trailing newline is not part of the secret") {
    const auto file = dir.path() / "secret";
    std::ofstream(file) << kSecret << "\n";
    ::chmod(file.c_str(), 0600);
    const ScopedEnv env(
        {{"COLTRAIN_AUTH_TOKEN", std::nullopt}, {"COLTRAIN_AUTH_FILE", file.string()}});
    const comm::AuthSettings settings = comm::auth_settings_from_env();
    REQUIRE(settings.secret != nullptr);
    const auto bytes = settings.secret->bytes();
    CHECK(std::string(bytes.begin(), bytes.end()) == kSecret);
  }
  SECTION("a file others can read is refused, naming its mode") {
    const auto file = dir.path() / "open-secret";
    std::ofstream(file) << kSecret;
    ::chmod(file.c_str(), 0644);
    const std::string error = config_error_of(
        {{"COLTRAIN_AUTH_TOKEN", std::nullopt}, {"COLTRAIN_AUTH_FILE", file.string()}});
    CHECK_THAT(error, Contains("readable or writable by others (mode 644)") &&
                          Contains("chmod 600") && Contains(file.string()));
  }
  SECTION("bad settings are errors that say what to do") {
    CHECK_THAT(config_error_of({{"COLTRAIN_AUTH_TOKEN", "short"}}),
               Contains("COLTRAIN_AUTH_TOKEN holds a secret of fewer than 16 bytes"));
    CHECK_THAT(config_error_of({{"COLTRAIN_AUTH_TOKEN", kSecret},
                                {"COLTRAIN_AUTH_FILE", (dir.path() / "x").string()}}),
               Contains("both COLTRAIN_AUTH_TOKEN and COLTRAIN_AUTH_FILE are set"));
    CHECK_THAT(config_error_of({{"COLTRAIN_AUTH_TOKEN", std::nullopt},
                                {"COLTRAIN_AUTH_FILE", (dir.path() / "missing").string()}}),
               Contains("cannot read it"));
    CHECK_THAT(config_error_of({{"COLTRAIN_AUTH_TOKEN", std::nullopt},
                                {"COLTRAIN_AUTH_FILE", std::nullopt},
                                {"COLTRAIN_AUTH", "yes"}}),
               Contains("COLTRAIN_AUTH=yes: expected 'required' or 'optional'"));
  }
}

TEST_CASE("a proof is HMAC-SHA256 over the role, the transcript and both nonces", "[auth]") {
  const comm::AuthSecret secret(kSecret, "test");
  std::array<std::byte, 16> hello{};
  for (std::size_t i = 0; i < hello.size(); ++i) hello[i] = std::byte(i);
  const detail::AcceptorFacts acceptor{3, 0x1122334455667788ull};
  const detail::AuthTranscript transcript{"mesh", "job-7", hello, detail::bytes_of_value(acceptor)};
  detail::AuthNonce connector{}, acceptor_nonce{};
  connector.fill(0xA5);
  acceptor_nonce.fill(0x5A);
  const detail::AuthProof proof = detail::auth_proof(secret, detail::AuthRole::kConnector,
                                                     transcript, connector, acceptor_nonce);
  // Computed independently with Python's hmac module over the same message layout
  // ("coltrain-auth-1", role, each field as a little-endian u32 length and its bytes).
  CHECK(hex(proof) == "3a9bb5a0f4b713c11addc68e1422799395e503d9f553e57eb739b93ae40568ae");

  // Every input changes the proof.
  const auto differs = [&](const detail::AuthProof& other) {
    return !detail::same_proof(proof, other);
  };
  CHECK(differs(detail::auth_proof(secret, detail::AuthRole::kAcceptor, transcript, connector,
                                   acceptor_nonce)));
  CHECK(differs(detail::auth_proof(comm::AuthSecret(kOtherSecret, "test"),
                                   detail::AuthRole::kConnector, transcript, connector,
                                   acceptor_nonce)));
  detail::AuthNonce fresh = acceptor_nonce;
  fresh[31] ^= 1;
  CHECK(differs(
      detail::auth_proof(secret, detail::AuthRole::kConnector, transcript, connector, fresh)));
  detail::AuthTranscript other_job = transcript;
  other_job.job_id = "job-8";
  CHECK(differs(detail::auth_proof(secret, detail::AuthRole::kConnector, other_job, connector,
                                   acceptor_nonce)));
  const detail::AcceptorFacts other_acceptor{4, acceptor.nonce};
  detail::AuthTranscript other_rank = transcript;
  other_rank.acceptor = detail::bytes_of_value(other_acceptor);
  CHECK(differs(detail::auth_proof(secret, detail::AuthRole::kConnector, other_rank, connector,
                                   acceptor_nonce)));
  CHECK(detail::fresh_auth_nonce() != detail::fresh_auth_nonce());
}

namespace {

// Both ends of one handshake over a socket pair: the connector in a thread (offer_hello), the
// acceptor here (IncomingHandshake), each with its own secret.
struct PairOutcome {
  detail::IncomingHandshake<detail::MeshHello>::Status acceptor;
  std::string acceptor_reason;
  std::string connector_error;  // empty: offer_hello returned kDone
};

detail::HandshakeSecurity security_with(const comm::AuthSecret* secret, std::uint64_t nonce = 7) {
  return {secret, "mesh", "job", {0, nonce}};
}

detail::MeshHello mesh_hello(int rank) {
  return {detail::kMeshMagic, detail::kTcpProtocolVersion, 2, rank, 99, 7};
}

// Runs the acceptor until it decides or 5 s pass.
template <class Hello>
void settle(detail::IncomingHandshake<Hello>& acceptor, const detail::HandshakeSecurity& security) {
  const auto judge = [](const Hello&) { return std::string(); };
  const coltrain::Deadline deadline(5s);
  while (acceptor.advance(judge, security) == detail::IncomingHandshake<Hello>::Status::kReading &&
         !deadline.expired()) {
    std::this_thread::sleep_for(1ms);
  }
}

std::array<detail::FileDescriptor, 2> socket_pair() {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
  return {detail::FileDescriptor(fds[0]), detail::FileDescriptor(fds[1])};
}

PairOutcome handshake(const comm::AuthSecret* connector_secret,
                      const comm::AuthSecret* acceptor_secret, std::uint64_t connector_nonce = 7) {
  auto [near, far] = socket_pair();
  // The connector closes its end when it stops, as a rank's socket closes when it throws.
  auto connector = std::async(std::launch::async, [&, end = std::move(far)]() mutable {
    const detail::FileDescriptor mine = std::move(end);
    try {
      const auto io = detail::offer_hello(mine.get(), mesh_hello(1),
                                          security_with(connector_secret, connector_nonce),
                                          coltrain::Deadline(5s), "rank 0", {});
      return io.status == detail::IoStatus::kDone ? std::string() : "not done: " + io.reason;
    } catch (const coltrain::CommError& e) {
      return e.message();
    }
  });
  detail::IncomingHandshake<detail::MeshHello> acceptor(std::move(near));
  settle(acceptor, security_with(acceptor_secret));
  acceptor.socket().reset();  // what a door does with a dropped connection; the connector sees EOF
  const std::string connector_error = connector.get();
  return {acceptor.status(), acceptor.reason(), connector_error};
}

}  // namespace

TEST_CASE("both ends of a handshake prove the secret to each other", "[auth]") {
  using Status = detail::IncomingHandshake<detail::MeshHello>::Status;
  const comm::AuthSecret secret(kSecret, "test");
  const comm::AuthSecret other(kOtherSecret, "test");

  SECTION("the same secret: admitted") {
    const PairOutcome outcome = handshake(&secret, &secret);
    CHECK(outcome.acceptor == Status::kAdmitted);
    CHECK(outcome.connector_error.empty());
  }
  SECTION("no secret on either side: admitted, as before") {
    const PairOutcome outcome = handshake(nullptr, nullptr);
    CHECK(outcome.acceptor == Status::kAdmitted);
  }
  SECTION("another secret: the connector finds the acceptor's proof wrong and stops") {
    const PairOutcome outcome = handshake(&other, &secret);
    CHECK(outcome.acceptor == Status::kDropped);
    CHECK_THAT(outcome.connector_error, Contains("rank 0 could not prove the job's secret"));
  }
  SECTION("a connector without a secret is dropped, naming why") {
    const PairOutcome outcome = handshake(nullptr, &secret);
    CHECK(outcome.acceptor == Status::kDropped);
    CHECK_THAT(outcome.acceptor_reason, Contains("offers no proof of the job's secret"));
  }
  SECTION("an acceptor without a secret drops a connector that has one") {
    const PairOutcome outcome = handshake(&secret, nullptr);
    CHECK(outcome.acceptor == Status::kDropped);
    CHECK_THAT(outcome.acceptor_reason, Contains("this rank has none"));
  }
  SECTION("the acceptor's facts are bound: another generation's nonce fails") {
    const PairOutcome outcome = handshake(&secret, &secret, 8);
    CHECK(outcome.acceptor == Status::kDropped);
    CHECK_THAT(outcome.connector_error, Contains("could not prove the job's secret"));
  }
}

TEST_CASE("a recorded handshake replayed, or a tampered hello, is refused", "[auth]") {
  using Incoming = detail::IncomingHandshake<detail::MeshHello>;
  const comm::AuthSecret secret(kSecret, "test");
  const detail::HandshakeSecurity security = security_with(&secret);

  // Record what an honest connector sends.
  auto [near, far] = socket_pair();
  std::vector<std::byte> recorded;
  auto connector = std::async(std::launch::async, [&, fd = far.get()] {
    return detail::offer_hello(fd, mesh_hello(1), security, coltrain::Deadline(5s), "rank 0", {});
  });
  {
    // A relay that keeps a copy: reads the opening, passes it to a real acceptor, and so on.
    auto [relay_in, acceptor_end] = socket_pair();
    Incoming acceptor(std::move(acceptor_end));
    std::array<std::byte, 256> buffer{};
    const coltrain::Deadline deadline(5s);
    while (acceptor.status() == Incoming::Status::kReading && !deadline.expired()) {
      const ssize_t from_connector = ::recv(near.get(), buffer.data(), buffer.size(), 0);
      if (from_connector > 0) {
        recorded.insert(recorded.end(), buffer.begin(), buffer.begin() + from_connector);
        REQUIRE(::send(relay_in.get(), buffer.data(), static_cast<std::size_t>(from_connector),
                       0) == from_connector);
      }
      acceptor.advance([](const detail::MeshHello&) { return std::string(); }, security);
      const ssize_t from_acceptor = ::recv(relay_in.get(), buffer.data(), buffer.size(), 0);
      if (from_acceptor > 0) {
        REQUIRE(::send(near.get(), buffer.data(), static_cast<std::size_t>(from_acceptor), 0) ==
                from_acceptor);
      }
      std::this_thread::sleep_for(1ms);
    }
    REQUIRE(acceptor.status() == Incoming::Status::kAdmitted);
  }
  REQUIRE(connector.get().status == detail::IoStatus::kDone);
  REQUIRE(recorded.size() == sizeof(detail::MeshHello) + 64);

  SECTION("replayed: the acceptor's fresh nonce makes the old proof wrong") {
    auto [attacker, acceptor_end] = socket_pair();
    REQUIRE(::send(attacker.get(), recorded.data(), recorded.size(), 0) ==
            static_cast<ssize_t>(recorded.size()));
    Incoming acceptor(std::move(acceptor_end));
    settle(acceptor, security);
    CHECK(acceptor.status() == Incoming::Status::kDropped);
    CHECK_THAT(acceptor.reason(), Contains("proof of the job's secret is wrong"));
  }
  SECTION("tampered: another rank in the hello, the recorded proof") {
    std::vector<std::byte> tampered = recorded;
    detail::MeshHello hello;
    std::memcpy(&hello, tampered.data(), sizeof hello);
    hello.rank = 0;
    std::memcpy(tampered.data(), &hello, sizeof hello);
    auto [attacker, acceptor_end] = socket_pair();
    REQUIRE(::send(attacker.get(), tampered.data(), tampered.size(), 0) ==
            static_cast<ssize_t>(tampered.size()));
    Incoming acceptor(std::move(acceptor_end));
    settle(acceptor, security);
    CHECK(acceptor.status() == Incoming::Status::kDropped);
  }
}

namespace {

// An allreduce of doubles over a communicator from the environment; exact: every element is a
// small integer sum.
void exact_allreduce(int rank, int world_size) {
  comm::Communicator communicator =
      comm::Communicator::tcp(coltrain::detect_launch_env(), comm::comm_options_from_env());
  std::vector<double> values(100'000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = double(i % 97) * (rank + 1);
  communicator.allreduce(std::span(values));
  const double ranks = world_size * (world_size + 1) / 2.0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    expect(values[i] == double(i % 97) * ranks, "allreduce element " + std::to_string(i));
  }
}

}  // namespace

TEST_CASE("a job whose ranks share the secret runs, a rank with another or none is refused",
          "[auth][tcp]") {
  LaunchOptions options;
  options.env["COLTRAIN_AUTH_TOKEN"] = kSecret;
  options.env["COLTRAIN_TIMEOUT"] = "3";
  SECTION("every rank has it") {
    const auto outcomes = launch_ranks(
        4, [](int rank) { exact_allreduce(rank, 4); }, options);
    for (const auto& outcome : outcomes) {
      INFO(outcome.output);
      CHECK(outcome.passed());
      CHECK_THAT(outcome.output, !Contains("dropped a connection"));
    }
  }
  SECTION("rank 2 has another secret, or none") {
    const bool none = GENERATE(false, true);
    CAPTURE(none);
    const auto outcomes = launch_ranks(
        3,
        [none](int rank) {
          if (rank == 2) {
            if (none) {
              ::unsetenv("COLTRAIN_AUTH_TOKEN");
            } else {
              ::setenv("COLTRAIN_AUTH_TOKEN", kOtherSecret, 1);
            }
          }
          exact_allreduce(rank, 3);
        },
        options);
    for (const auto& outcome : outcomes) CHECK_FALSE(outcome.passed());
    if (none) {
      CHECK_THAT(outcomes[0].output, Contains("offers no proof of the job's secret"));
      CHECK_THAT(outcomes[2].output, Contains("turned this rank away") && Contains("secret"));
    } else {
      CHECK_THAT(outcomes[2].output, Contains("rank 0's rendezvous at") &&
                                         Contains("could not prove the job's secret"));
    }
    // The others are told who never came, as for any rank that does not arrive.
    CHECK_THAT(outcomes[1].output, Contains("rank 2 never arrived"));
  }
}

TEST_CASE("a stranger with the job id is refused in all of 1000 tries during the rendezvous",
          "[auth][tcp]") {
  LaunchOptions options;
  options.env["COLTRAIN_AUTH_TOKEN"] = kSecret;
  options.env["COLTRAIN_JOB_ID"] = "job-with-a-secret";
  options.env["COLTRAIN_TIMEOUT"] = "60";
  options.hard_timeout = 90s;
  constexpr int kTries = 1000;
  const auto outcomes = launch_ranks(
      3,
      [](int rank) {
        if (rank == 2) {
          // Rank 2 arrives only after the stranger's tries, so they all fall inside the
          // rendezvous; the stranger claims rank 2, with no secret or with a wrong one.
          // Rank 0's port is the kernel's pick (MASTER_PORT=0), published in the port file.
          const int port = detail::await_published_port(std::getenv("COLTRAIN_PORT_FILE"),
                                                        detail::hash_job_id("job-with-a-secret"),
                                                        coltrain::Deadline(10s), 10s, {});
          const detail::Endpoint master{detail::IpAddress::ipv4(htonl(INADDR_LOOPBACK)),
                                        static_cast<std::uint16_t>(port)};
          const comm::AuthSecret wrong(kOtherSecret, "the stranger");
          detail::RendezvousHello hello{};
          hello.world_size = 3;
          hello.rank = 2;
          hello.job_hash = detail::hash_job_id("job-with-a-secret");
          int refused = 0;
          for (int attempt = 0; attempt < kTries; ++attempt) {
            const coltrain::Deadline deadline(10s);
            detail::FileDescriptor socket =
                detail::connect_with_retry(master, 0, deadline, "the rendezvous", 10s, {});
            const bool with_wrong_secret = attempt % 2 == 1;
            hello.auth =
                with_wrong_secret ? detail::kHelloHmacSha256 : detail::kHelloUnauthenticated;
            std::vector<std::byte> opening(sizeof hello + (with_wrong_secret ? 32 : 0));
            std::memcpy(opening.data(), &hello, sizeof hello);
            detail::send_exact(socket.get(), opening, deadline);
            if (with_wrong_secret) {
              // Takes the challenge and answers it with a proof made with the wrong secret.
              std::array<std::byte, 64> challenge{};
              expect(detail::recv_exact(socket.get(), challenge, deadline).status ==
                         detail::IoStatus::kDone,
                     "rank 0 challenges a hello that offers a proof");
              detail::AuthNonce connector{}, acceptor{};
              std::memcpy(acceptor.data(), challenge.data(), 32);
              const detail::AuthProof proof = detail::auth_proof(
                  wrong, detail::AuthRole::kConnector,
                  {"rendezvous", "job-with-a-secret", detail::bytes_of_value(hello),
                   detail::bytes_of_value(detail::AcceptorFacts{})},
                  connector, acceptor);
              detail::send_exact(socket.get(), std::as_bytes(std::span(proof)), deadline);
            }
            // Refused: the connection closes without a byte of the address table.
            std::array<std::byte, 1> table{};
            const detail::IoResult answer = detail::recv_exact(socket.get(), table, deadline);
            if (answer.status == detail::IoStatus::kClosed) ++refused;
          }
          expect(refused == kTries,
                 "refused " + std::to_string(refused) + " of " + std::to_string(kTries) + " tries");
          std::printf("stranger refused in %d of %d tries\n", refused, kTries);
        }
        exact_allreduce(rank, 3);
      },
      options);
  for (const auto& outcome : outcomes) {
    INFO("rank " << outcome.rank << ":\n" << outcome.output);
    CHECK(outcome.passed());
  }
  CHECK_THAT(outcomes[2].output, Contains("stranger refused in 1000 of 1000 tries"));
  // Five drops in full, then counted: a thousand tries do not flood the log.
  CHECK_THAT(outcomes[0].output, Contains("offers no proof of the job's secret") &&
                                     Contains("proof of the job's secret is wrong") &&
                                     Contains("(1000 in all)"));
  std::istringstream lines(outcomes[0].output);
  int warnings = 0;
  for (std::string line; std::getline(lines, line);)
    warnings += line.find("dropped") != std::string::npos;
  CHECK(warnings <= 5 + 1 + 60 / 10);
}
