// Compiled with nothing but `pkg-config --cflags --libs coltrain`: the include path, C++20, Eigen
// (through the .pc's Requires) and the host build's macros must all come from there.
#include <coltrain/core/config.hpp>
#include <coltrain/tensor/eigen.hpp>
#include <coltrain/version.hpp>

#include <cstdio>

static_assert(COLTRAIN_VERSION >= COLTRAIN_MAKE_VERSION(0, 1, 0));

int main() {
  std::printf("coltrain %s via pkg-config, zlib %d, OpenSSL %d\n", COLTRAIN_VERSION_STRING,
              COLTRAIN_WITH_ZLIB, COLTRAIN_WITH_OPENSSL);
  return 0;
}
