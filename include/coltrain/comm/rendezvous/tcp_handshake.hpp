#pragma once
// One TCP connection's handshake, both sides, for every door a job keeps (the rendezvous, the data
// listeners of the mesh, the elastic doors). The connecting side sends a hello; the accepting side
// judges it. With the job's secret (comm/rendezvous/auth.hpp) the hello is followed by a mutual
// challenge-response:
//
//   connector -> acceptor   hello (auth = HMAC-SHA256), connector nonce Nc (32 random bytes)
//   acceptor  -> connector  acceptor nonce Na, proof_A = HMAC(secret, "A", transcript, Nc, Na)
//   connector -> acceptor   proof_C = HMAC(secret, "C", transcript, Nc, Na), sent only after
//                           proof_A checked out
//
// The transcript binds the step, the job id, the hello's bytes (rank, world size, addresses) and
// the acceptor's own facts (its rank, the mesh nonce), so a proof is good for one connection only:
// replaying a recorded handshake fails on the fresh Na, and a stranger without the secret can
// produce neither proof. Proofs are compared in constant time.

#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/auth.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/log.hpp>
#include <coltrain/core/timer.hpp>

#include <arpa/inet.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace coltrain::comm::detail {

// A hello's `auth` field: how the connector will prove the job's secret.
inline constexpr std::uint32_t kHelloUnauthenticated = 0;
inline constexpr std::uint32_t kHelloHmacSha256 = 1;

template <class T>
std::span<const std::byte> bytes_of_value(const T& value) {
  return std::as_bytes(std::span<const T, 1>(&value, 1));
}

template <class T>
std::span<std::byte> writable_bytes_of_value(T& value) {
  return std::as_writable_bytes(std::span<T, 1>(&value, 1));
}

// Facts about the accepting end that both ends know: in the mesh, its rank and the generation's
// nonce; at a rendezvous, none (the defaults).
struct AcceptorFacts {
  std::int64_t rank = -1;
  std::uint64_t nonce = 0;
};

// What both ends of one connection bind into their proofs besides the hello.
struct HandshakeSecurity {
  const AuthSecret* secret = nullptr;  // null: no challenge-response
  std::string_view step;               // "rendezvous", "mesh", "elastic"
  std::string_view job_id;
  AcceptorFacts acceptor;
};

inline HandshakeSecurity handshake_security(const CommOptions& options, std::string_view step,
                                            AcceptorFacts acceptor = {}) {
  return {options.auth.secret.get(), step, options.job_id, acceptor};
}

// Why `hello_auth` does not fit this rank's settings, or empty.
inline std::string auth_mismatch(std::uint32_t hello_auth, const HandshakeSecurity& security) {
  if (security.secret != nullptr && hello_auth != kHelloHmacSha256) {
    return "it offers no proof of the job's secret (COLTRAIN_AUTH_TOKEN or COLTRAIN_AUTH_FILE "
           "unset there?)";
  }
  if (security.secret == nullptr && hello_auth != kHelloUnauthenticated) {
    return "it proves a secret, and this rank has none (set the same COLTRAIN_AUTH_TOKEN or "
           "COLTRAIN_AUTH_FILE here)";
  }
  return {};
}

// The acceptor's side of one connection, advanced without blocking as bytes arrive, so a stranger
// that sends nothing holds up no one.
template <class Hello>
class IncomingHandshake {
 public:
  enum class Status { kReading, kAdmitted, kDropped };

  explicit IncomingHandshake(FileDescriptor socket) : socket_(std::move(socket)) {}

  // Reads what has arrived and answers the challenge. `judge(hello)` says why a complete hello is
  // not one this door admits (another job, protocol or version), or returns an empty string.
  template <class Judge>
  Status advance(const Judge& judge, const HandshakeSecurity& security) {
    while (status_ == Status::kReading) {
      switch (stage_) {
        case Stage::kHello: {
          if (!fill(writable_bytes_of_value(hello_))) return status_;
          std::string reason = judge(hello_);
          if (reason.empty()) reason = auth_mismatch(hello_.auth, security);
          if (!reason.empty()) return drop(std::move(reason));
          if (security.secret == nullptr) return status_ = Status::kAdmitted;
          stage_ = Stage::kConnectorNonce;
          break;
        }
        case Stage::kConnectorNonce: {
          if (!fill(std::as_writable_bytes(std::span(connector_nonce_)))) return status_;
          acceptor_nonce_ = fresh_auth_nonce();
          const AuthProof proof =
              auth_proof(*security.secret, AuthRole::kAcceptor, transcript(security),
                         connector_nonce_, acceptor_nonce_);
          std::array<unsigned char, kAuthNonceBytes + kAuthProofBytes> challenge{};
          std::memcpy(challenge.data(), acceptor_nonce_.data(), kAuthNonceBytes);
          std::memcpy(challenge.data() + kAuthNonceBytes, proof.data(), kAuthProofBytes);
          // 64 bytes on a connection that has sent nothing yet fit its socket buffer.
          if (::send(socket_.get(), challenge.data(), challenge.size(), MSG_NOSIGNAL) !=
              static_cast<ssize_t>(challenge.size())) {
            return drop("it did not take the challenge");
          }
          stage_ = Stage::kConnectorProof;
          break;
        }
        case Stage::kConnectorProof: {
          if (!fill(std::as_writable_bytes(std::span(connector_proof_)))) return status_;
          const AuthProof expected =
              auth_proof(*security.secret, AuthRole::kConnector, transcript(security),
                         connector_nonce_, acceptor_nonce_);
          if (!same_proof(connector_proof_, expected)) {
            return drop(
                "its proof of the job's secret is wrong (another COLTRAIN_AUTH_TOKEN, or a "
                "forged or replayed handshake)");
          }
          return status_ = Status::kAdmitted;
        }
      }
    }
    return status_;
  }

  Status status() const { return status_; }
  // The challenge is out and the connector's proof not yet in: it comes within a round trip.
  bool challenged() const {
    return status_ == Status::kReading && stage_ == Stage::kConnectorProof;
  }
  const Hello& hello() const { return hello_; }
  FileDescriptor& socket() { return socket_; }
  const std::string& reason() const { return reason_; }

 private:
  enum class Stage { kHello, kConnectorNonce, kConnectorProof };

  AuthTranscript transcript(const HandshakeSecurity& security) const {
    return {security.step, security.job_id, bytes_of_value(hello_),
            bytes_of_value(security.acceptor)};
  }

  // Reads into `target` from where the last call stopped; true once it is full.
  bool fill(std::span<std::byte> target) {
    const std::span<std::byte> rest = target.subspan(filled_);
    const ssize_t received = ::recv(socket_.get(), rest.data(), rest.size(), 0);
    if (received == 0) {
      drop("it closed the connection after " + std::to_string(total_ + filled_) + " of " +
           std::to_string(total_ + target.size()) + " handshake bytes");
      return false;
    }
    if (received < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) drop(errno_text(errno));
      return false;
    }
    filled_ += static_cast<std::size_t>(received);
    if (filled_ < target.size()) return false;
    total_ += filled_;
    filled_ = 0;
    return true;
  }

  Status drop(std::string reason) {
    reason_ = std::move(reason);
    return status_ = Status::kDropped;
  }

  FileDescriptor socket_;
  Status status_ = Status::kReading;
  Stage stage_ = Stage::kHello;
  std::size_t filled_ = 0;  // bytes of the current stage's message
  std::size_t total_ = 0;   // bytes of the finished stages
  Hello hello_{};
  AuthNonce connector_nonce_{};
  AuthNonce acceptor_nonce_{};
  AuthProof connector_proof_{};
  std::string reason_;
};

// The connector's side: sends `hello` (its `auth` field set here) and, with a secret, checks the
// acceptor's proof before proving its own. Returns how the exchange ended; throws CommError when
// the acceptor's proof is wrong: it does not hold this job's secret.
template <class Hello>
IoResult offer_hello(int fd, Hello hello, const HandshakeSecurity& security,
                     const Deadline& deadline, const std::string& acceptor,
                     const ErrorContext& context) {
  hello.auth = security.secret != nullptr ? kHelloHmacSha256 : kHelloUnauthenticated;
  if (security.secret == nullptr) return send_exact(fd, bytes_of_value(hello), deadline);

  const AuthNonce connector_nonce = fresh_auth_nonce();
  std::array<std::byte, sizeof(Hello) + kAuthNonceBytes> opening{};
  std::memcpy(opening.data(), &hello, sizeof hello);
  std::memcpy(opening.data() + sizeof hello, connector_nonce.data(), kAuthNonceBytes);
  IoResult io = send_exact(fd, opening, deadline);
  std::array<unsigned char, kAuthNonceBytes + kAuthProofBytes> challenge{};
  if (io.status == IoStatus::kDone) {
    io = recv_exact(fd, std::as_writable_bytes(std::span(challenge)), deadline);
  }
  if (io.status != IoStatus::kDone) return io;
  AuthNonce acceptor_nonce{};
  AuthProof acceptor_proof{};
  std::memcpy(acceptor_nonce.data(), challenge.data(), kAuthNonceBytes);
  std::memcpy(acceptor_proof.data(), challenge.data() + kAuthNonceBytes, kAuthProofBytes);
  const AuthTranscript transcript{security.step, security.job_id, bytes_of_value(hello),
                                  bytes_of_value(security.acceptor)};
  if (!same_proof(acceptor_proof, auth_proof(*security.secret, AuthRole::kAcceptor, transcript,
                                             connector_nonce, acceptor_nonce))) {
    throw CommError(acceptor +
                        " could not prove the job's secret: its COLTRAIN_AUTH_TOKEN (or "
                        "COLTRAIN_AUTH_FILE) differs from this rank's, or it is not "
                        "part of this job",
                    context);
  }
  const AuthProof proof = auth_proof(*security.secret, AuthRole::kConnector, transcript,
                                     connector_nonce, acceptor_nonce);
  return send_exact(fd, std::as_bytes(std::span(proof)), deadline);
}

// Logs the connections a door turns away: the first few in full, then one line per period with
// the count, so that a port scan (or an attacker's thousand tries) cannot flood the job's log. The
// door calls summarise() when it stops waiting.
class DroppedConnections {
  static constexpr int kInFull = 5;
  static constexpr auto kPeriod = std::chrono::seconds(10);

 public:
  DroppedConnections(const Logger& logger, std::string place)
      : logger_(logger), place_(std::move(place)) {}

  void report(const std::string& peer, const std::string& reason) {
    ++total_;
    if (total_ <= kInFull) {
      logger_.warn("dropped a connection to ", place_, " from ", peer, ": ", reason,
                   total_ == kInFull ? "; further ones are counted and summarised" : "");
      last_summary_ = Clock::now();
      return;
    }
    ++unreported_;
    latest_ = peer + ": " + reason;
    if (Clock::now() - last_summary_ >= kPeriod) summarise();
  }

  int total() const { return total_; }

  // Logs the drops not logged yet, if any.
  void summarise() {
    if (unreported_ == 0) return;
    logger_.warn("dropped ", unreported_, " more connection", unreported_ == 1 ? "" : "s", " to ",
                 place_, " (", total_, " in all); the latest from ", latest_);
    unreported_ = 0;
    last_summary_ = Clock::now();
  }

 private:
  Logger logger_;
  std::string place_;
  int total_ = 0;
  int unreported_ = 0;
  std::string latest_;
  Clock::time_point last_summary_{};
};

// COLTRAIN_AUTH=required without a secret stops here; a listener other hosts can reach without
// one gets a warning, once per process.
inline void check_door_security(const IpAddress& address, const CommOptions& options,
                                const Logger& logger, const ErrorContext& context) {
  if (options.auth.secret != nullptr) return;
  if (options.auth.policy == AuthPolicy::kRequired) {
    throw ConfigError(
        "COLTRAIN_AUTH=required, but no secret is set: give every rank the same "
        "COLTRAIN_AUTH_FILE (a file only its owner can read) or COLTRAIN_AUTH_TOKEN",
        context);
  }
  static std::atomic<bool> warned{false};
  if (!address.is_loopback() && !warned.exchange(true)) {
    logger.warn("listening on ", address.text(),
                " without a shared secret: any process that can reach this port and knows the "
                "job id can join the job; set COLTRAIN_AUTH_FILE or COLTRAIN_AUTH_TOKEN "
                "(docs/security.md)");
  }
}

}  // namespace coltrain::comm::detail
