#pragma once
// The job's shared secret, and the HMAC-SHA256 proofs that TCP handshakes exchange with it
// (docs/security.md). Settings, read once by comm_options_from_env():
//
//   COLTRAIN_AUTH_TOKEN  the secret itself (at least 16 bytes; `openssl rand -hex 32` makes one)
//   COLTRAIN_AUTH_FILE   a file holding the secret (a trailing newline is dropped); it must not be
//                        readable or writable by others, as ssh insists for its keys
//   COLTRAIN_AUTH        `required`: refuse to start without a secret; `optional` (the default)
//
// The cryptography is OpenSSL's libcrypto (HMAC, RAND_bytes, CRYPTO_memcmp): CMake finds it like
// the optional backends; a bare compile line opts in with -DCOLTRAIN_WITH_OPENSSL=1 -lcrypto
// (core/config.hpp says why). A build without it refuses a secret with a ConfigError instead of
// running unauthenticated.

#include <coltrain/comm/rendezvous/auth_settings.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <sys/stat.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#if COLTRAIN_WITH_OPENSSL
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#endif

namespace coltrain::comm {

// Shorter secrets can be guessed offline from one recorded handshake.
inline constexpr std::size_t kMinAuthSecretBytes = 16;

// The secret every rank of a job holds. Wiped from memory when destroyed; never printed.
class AuthSecret {
 public:
  // `origin` says where it came from ("COLTRAIN_AUTH_TOKEN", "COLTRAIN_AUTH_FILE=/run/secret"),
  // for errors.
  AuthSecret(std::string bytes, const std::string& origin) : bytes_(std::move(bytes)) {
    if (bytes_.size() < kMinAuthSecretBytes) {
      wipe();
      throw ConfigError(origin + " holds a secret of fewer than " +
                        std::to_string(kMinAuthSecretBytes) +
                        " bytes, which could be guessed; make one with `openssl rand -hex 32`");
    }
#if !COLTRAIN_WITH_OPENSSL
    wipe();
    throw ConfigError(
        origin +
        " is set, but this program was built without OpenSSL's libcrypto, which "
        "authentication needs: install libssl-dev and rebuild (CMake finds it; a bare "
        "compile line adds -DCOLTRAIN_WITH_OPENSSL=1 -lcrypto)");
#endif
  }
  AuthSecret(const AuthSecret&) = delete;
  AuthSecret& operator=(const AuthSecret&) = delete;
  ~AuthSecret() { wipe(); }

  std::span<const unsigned char> bytes() const {
    return {reinterpret_cast<const unsigned char*>(bytes_.data()), bytes_.size()};
  }

 private:
  void wipe() noexcept {
#if COLTRAIN_WITH_OPENSSL
    OPENSSL_cleanse(bytes_.data(), bytes_.size());
#else
    volatile char* p = bytes_.data();
    for (std::size_t i = 0; i < bytes_.size(); ++i) p[i] = 0;
#endif
  }

  std::string bytes_;
};

namespace detail {

// The secret in `file`, which must be a regular file that others can neither read nor write.
inline std::string read_secret_file(const std::filesystem::path& file) {
  const std::string origin = "COLTRAIN_AUTH_FILE=" + file.string();
  struct stat status {};
  if (::stat(file.c_str(), &status) != 0) {
    throw ConfigError(origin + ": cannot read it: " + std::strerror(errno));
  }
  if (!S_ISREG(status.st_mode)) throw ConfigError(origin + " is not a regular file");
  if ((status.st_mode & (S_IRWXO | S_IWGRP)) != 0) {
    throw ConfigError(origin + " is readable or writable by others (mode " +
                      std::to_string((status.st_mode >> 6) & 7) +
                      std::to_string((status.st_mode >> 3) & 7) +
                      std::to_string(status.st_mode & 7) +
                      "); allow its owner only: chmod 600 (Kubernetes: defaultMode 0400)");
  }
  std::ifstream in(file, std::ios::binary);
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw ConfigError(origin + ": reading it failed");
  if (secret.ends_with('\n')) secret.pop_back();
  if (secret.ends_with('\r')) secret.pop_back();
  return secret;
}

}  // namespace detail

// The secret and policy from the environment (see the top of this header). Throws ConfigError for
// a bad value, an unsafe file, both variables at once, or a secret in a build without libcrypto.
inline AuthSettings auth_settings_from_env() {
  auto variable = [](const char* name) -> const char* {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? value : nullptr;
  };
  AuthSettings settings;
  if (const char* policy = variable("COLTRAIN_AUTH")) {
    const std::string_view text = policy;
    if (text == "required") {
      settings.policy = AuthPolicy::kRequired;
    } else if (text != "optional") {
      throw ConfigError("COLTRAIN_AUTH=" + std::string(text) +
                        ": expected 'required' or 'optional'");
    }
  }
  const char* token = variable("COLTRAIN_AUTH_TOKEN");
  const char* file = variable("COLTRAIN_AUTH_FILE");
  if (token != nullptr && file != nullptr) {
    throw ConfigError(
        "both COLTRAIN_AUTH_TOKEN and COLTRAIN_AUTH_FILE are set; set one (the file keeps the "
        "secret out of the process's environment)");
  }
  if (token != nullptr) {
    settings.secret = std::make_shared<const AuthSecret>(token, "COLTRAIN_AUTH_TOKEN");
  } else if (file != nullptr) {
    settings.secret = std::make_shared<const AuthSecret>(detail::read_secret_file(file),
                                                         "COLTRAIN_AUTH_FILE=" + std::string(file));
  }
  return settings;
}

namespace detail {

inline constexpr std::size_t kAuthNonceBytes = 32;
inline constexpr std::size_t kAuthProofBytes = 32;  // HMAC-SHA256
using AuthNonce = std::array<unsigned char, kAuthNonceBytes>;
using AuthProof = std::array<unsigned char, kAuthProofBytes>;

// Which side of a connection a proof comes from: the two proofs of one handshake differ, so one
// side's proof cannot be sent back as the other's.
enum class AuthRole : unsigned char { kAcceptor = 'A', kConnector = 'C' };

// What a handshake's proofs bind besides the nonces: the step (rendezvous, mesh, elastic), the
// job id, the connector's hello (its rank, world size, addresses) and the acceptor's own facts
// (its rank, the mesh nonce).
struct AuthTranscript {
  std::string_view step;
  std::string_view job_id;
  std::span<const std::byte> hello;
  std::span<const std::byte> acceptor;
};

// Without libcrypto no AuthSecret exists, so the two functions below are never reached there.
inline constexpr const char* kNoLibcrypto = "authentication needs OpenSSL's libcrypto";

inline AuthNonce fresh_auth_nonce() {
  AuthNonce nonce{};
#if COLTRAIN_WITH_OPENSSL
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw CommError("OpenSSL's RAND_bytes could not draw a handshake nonce");
  }
#else
  throw ConfigError(kNoLibcrypto);
#endif
  return nonce;
}

// HMAC-SHA256(secret, "coltrain-auth-1" | role | each field with its length | nonces).
inline AuthProof auth_proof(const AuthSecret& secret, AuthRole role,
                            const AuthTranscript& transcript, const AuthNonce& connector_nonce,
                            const AuthNonce& acceptor_nonce) {
  std::string message = "coltrain-auth-1";
  message.push_back(static_cast<char>(role));
  auto field = [&](const void* data, std::size_t size) {
    const auto length = static_cast<std::uint32_t>(size);
    message.append(reinterpret_cast<const char*>(&length), sizeof length);
    message.append(static_cast<const char*>(data), size);
  };
  field(transcript.step.data(), transcript.step.size());
  field(transcript.job_id.data(), transcript.job_id.size());
  field(transcript.hello.data(), transcript.hello.size());
  field(transcript.acceptor.data(), transcript.acceptor.size());
  field(connector_nonce.data(), connector_nonce.size());
  field(acceptor_nonce.data(), acceptor_nonce.size());
  AuthProof proof{};
#if COLTRAIN_WITH_OPENSSL
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.bytes().data(), static_cast<int>(secret.bytes().size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), proof.data(),
           &length) == nullptr ||
      length != proof.size()) {
    throw CommError("OpenSSL's HMAC-SHA256 failed while proving the job's secret");
  }
#else
  (void)secret;
  throw ConfigError(kNoLibcrypto);
#endif
  return proof;
}

// Constant time, so the time a comparison takes tells an attacker nothing about the proof.
inline bool same_proof(const AuthProof& a, const AuthProof& b) {
#if COLTRAIN_WITH_OPENSSL
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
#else
  unsigned char difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) difference |= a[i] ^ b[i];
  return difference == 0;
#endif
}

}  // namespace detail
}  // namespace coltrain::comm
