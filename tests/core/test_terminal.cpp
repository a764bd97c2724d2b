// writes_to_terminal: yes for a pseudo-terminal, no for a pipe, and no under Open MPI's mpirun,
// which gives every rank a pseudo-terminal whatever its own output is.
#include <coltrain/core/terminal.hpp>

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

namespace {

// A pseudo-terminal's two ends, closed at the end of the scope.
struct PseudoTerminal {
  int controller = ::posix_openpt(O_RDWR | O_NOCTTY);
  int terminal = -1;
  PseudoTerminal() {
    if (controller >= 0 && ::grantpt(controller) == 0 && ::unlockpt(controller) == 0)
      terminal = ::open(::ptsname(controller), O_RDWR | O_NOCTTY);
  }
  ~PseudoTerminal() {
    if (terminal >= 0) ::close(terminal);
    if (controller >= 0) ::close(controller);
  }
};

}  // namespace

TEST_CASE("writes_to_terminal: a terminal, unless Open MPI's launcher made it", "[terminal]") {
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  int pipe_ends[2];
  REQUIRE(::pipe(pipe_ends) == 0);
  CHECK_FALSE(coltrain::writes_to_terminal(pipe_ends[1]));
  ::close(pipe_ends[0]);
  ::close(pipe_ends[1]);

  const PseudoTerminal pty;
  if (pty.terminal < 0) {
    WARN("skipped part: no pseudo-terminal could be opened here; the terminal half is not checked");
    return;
  }
  CHECK(coltrain::writes_to_terminal(pty.terminal));
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  CHECK_FALSE(coltrain::writes_to_terminal(pty.terminal));
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
}
