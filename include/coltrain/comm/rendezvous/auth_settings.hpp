#pragma once
// Whether a job's connections authenticate, and with which secret (comm/rendezvous/auth.hpp holds
// the secret and the proofs): what CommOptions carries, without OpenSSL's headers.

#include <memory>

namespace coltrain::comm {

class AuthSecret;

enum class AuthPolicy {
  kOptional,  // authenticate when a secret is set
  kRequired,  // COLTRAIN_AUTH=required: no secret is a ConfigError
};

struct AuthSettings {
  std::shared_ptr<const AuthSecret> secret;  // null: connections are not authenticated
  AuthPolicy policy = AuthPolicy::kOptional;
};

}  // namespace coltrain::comm
