// Catch2 main for parity tests against PyTorch. The references come from a Python script that CTest
// runs first and that points COLTRAIN_PARITY_DIR at its output. When CMake found no PyTorch the
// variable is unset: the suite prints "skipped: PyTorch is not installed" and exits with
// kSkipReturnCode, which CTest reports as skipped, never as a pass.
#include "catch_session.hpp"

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace {
constexpr int kSkipReturnCode = 77;
}

int main(int argc, char** argv) {
  bool listing = false;  // CTest's test discovery lists the cases without references
  for (int i = 1; i < argc; ++i) listing |= std::string_view(argv[i]).starts_with("--list");
  if (!listing && std::getenv("COLTRAIN_PARITY_DIR") == nullptr) {
    std::printf("skipped: PyTorch is not installed (Debian: python3-torch), so there are no "
                "references to compare with\n");
    return kSkipReturnCode;
  }
  return coltrain::test::run_catch_session(argc, argv);
}
