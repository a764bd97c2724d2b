// Catch2 main for tests launched with mpiexec. Every rank runs every test case; a test fails when
// it fails on any rank. Rank 0's report goes to stdout as usual; the other ranks' reports are held
// back and printed to stderr, under a rank header, only when that rank failed, so a passing run
// reads like a single-process run.
#include <mpi.h>
#include "catch_session.hpp"

#include <coltrain/core/error.hpp>

#include <iostream>
#include <sstream>

// Under AddressSanitizer (COLTRAIN_SANITIZE_TESTS): a communicator that failed keeps its MPI
// communicator on purpose (~MpiTransport says why), and abandon_pending keeps the frames of
// requests MPI may still complete; LeakSanitizer would report both. The communicator is allocated
// inside libmpich, which has no frame pointers: only the slow unwinder reaches the coltrain frame
// that its suppression names. MPI_Init leaks in hwloc's topology plugins, which Debian's
// libhwloc-plugins (installed with Open MPI) adds to MPICH's start. Unused in other builds.
extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }
extern "C" const char* __lsan_default_suppressions() {
  return "leak:coltrain::comm::MpiTransport::MpiTransport\n"
         "leak:coltrain::comm::MpiTransport::abandon_pending\n"
         "leak:hwloc_topology_load\n";
}

int main(int argc, char** argv) {
  // MULTIPLE: a communicator's progress thread calls MPI while the test's thread may too.
  int provided = 0;
  COLTRAIN_CHECK_MPI(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided));
  int rank = 0;
  int size = 1;
  COLTRAIN_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  COLTRAIN_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));

  std::ostringstream held_back;
  std::streambuf* stdout_buffer = std::cout.rdbuf();
  if (rank != 0) std::cout.rdbuf(held_back.rdbuf());
  const int failed = coltrain::test::run_catch_session(argc, argv);
  std::cout.rdbuf(stdout_buffer);
  if (rank != 0 && failed != 0) {
    std::cerr << "---- rank " << rank << " of " << size << " failed ----\n" << held_back.str();
  }

  int any_failed = 0;
  COLTRAIN_CHECK_MPI(MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (rank == 0 && failed == 0 && any_failed != 0) {
    std::cerr << "---- rank 0 passed, but other ranks failed: see their reports ----\n";
  }
  COLTRAIN_CHECK_MPI(MPI_Finalize());
  return any_failed != 0 ? 1 : 0;
}
