#pragma once
// MpiSession: MPI's initialisation and finalisation on behalf of the communicators that need it
// (Communicator::from_env and mpi_world), shared by a communicator and the ones split from it.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_MPI
#error "coltrain/comm/transport/mpi/mpi_session.hpp needs MPI: compile with mpicxx or link MPI"
#endif

#include <coltrain/core/error.hpp>

#include <mpi.h>

namespace coltrain::comm::detail {

// Initialises MPI when nobody has, and then finalises it when the last communicator using it goes.
// MULTIPLE: a communicator's non-blocking calls run on its progress thread while the caller's
// thread may use another communicator (or MPI itself).
class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    COLTRAIN_CHECK_MPI(MPI_Initialized(&initialized));
    if (!initialized) {
      int provided = 0;
      COLTRAIN_CHECK_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      owns_mpi_ = true;
    }
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && !finalized) MPI_Finalize();
  }

 private:
  bool owns_mpi_ = false;
};

}  // namespace coltrain::comm::detail
