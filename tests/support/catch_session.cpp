// Catch2's implementation (15-30 s to compile), once for all the test mains; they call it through
// run_catch_session.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.hpp"

int coltrain::test::run_catch_session(int argc, char** argv) {
  return Catch::Session().run(argc, argv);
}
