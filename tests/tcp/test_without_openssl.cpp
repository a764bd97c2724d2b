// A build without libcrypto (COLTRAIN_WITH_OPENSSL=0, the default of a bare compile line): a secret
// is refused with an error that says how to build with it, never ignored. Its own executable, so
// that no other translation unit sees the libcrypto versions of the same inline functions.

#undef COLTRAIN_WITH_OPENSSL
#define COLTRAIN_WITH_OPENSSL 0

#include <catch2/catch.hpp>
#include <coltrain/comm/rendezvous/auth.hpp>
#include <coltrain/core/error.hpp>

#include <cstdlib>

TEST_CASE("without libcrypto a secret is a ConfigError naming the build flags", "[auth]") {
  ::unsetenv("COLTRAIN_AUTH_FILE");
  ::setenv("COLTRAIN_AUTH_TOKEN", "0123456789abcdef0123456789abcdef", 1);
  CHECK_THROWS_MATCHES(
      coltrain::comm::auth_settings_from_env(), coltrain::ConfigError,
      Catch::Matchers::Message("coltrain: COLTRAIN_AUTH_TOKEN is set, but this program was built "
                               "without OpenSSL's libcrypto, which authentication needs: install "
                               "libssl-dev and rebuild (CMake finds it; a bare compile line adds "
                               "-DCOLTRAIN_WITH_OPENSSL=1 -lcrypto)"));
  ::unsetenv("COLTRAIN_AUTH_TOKEN");
  CHECK(coltrain::comm::auth_settings_from_env().secret == nullptr);
}
