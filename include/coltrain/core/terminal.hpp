#pragma once
// Whether this process writes to a person's terminal, for what only makes sense there (the
// trainer's progress bar, which rewrites one line with '\r').
//
// isatty() alone is not enough under Open MPI: its mpirun gives every rank a pseudo-terminal for
// standard output whatever mpirun's own output is (a log file, a pipe), so the bar would end up in
// logs as hundreds of '\r' lines. Under Open MPI's launcher (OMPI_COMM_WORLD_SIZE set) the answer
// is therefore no; ask for the bar explicitly there (the samples' --progress). MPICH's Hydra,
// srun and torchrun hand their ranks pipes, which isatty() already answers.

#include <unistd.h>

#include <cstdlib>

namespace coltrain {

inline bool writes_to_terminal(int fd = STDOUT_FILENO) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) return false;
  return ::isatty(fd) == 1;
}

}  // namespace coltrain
