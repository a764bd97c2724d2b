// Runs Catch2's session. Catch's implementation is compiled once, in catch_session.cpp, and linked
// into every kind of test main (plain, MPI, GPU, parity), which then includes no Catch at all.
#pragma once

namespace coltrain::test {

// Catch::Session().run(argc, argv): the number of failed test cases (0 when all passed).
int run_catch_session(int argc, char** argv);

}  // namespace coltrain::test
