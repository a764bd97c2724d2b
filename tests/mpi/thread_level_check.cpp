// MPI initialised below the thread level coltrain needs: building a communicator must fail with a
// ConfigError that names the level and the fix, on every rank, before any communication. No Catch
// main here: Catch's MPI main asks for MPI_THREAD_MULTIPLE, which is what this must not have.
#include <coltrain/comm/transport/mpi/mpi_transport.hpp>
#include <coltrain/core/error.hpp>

#include <mpi.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int status = 1;
  try {
    coltrain::comm::MpiTransport transport(MPI_COMM_WORLD, {});
    // A library may give more than was asked; then the communicator is right to work.
    status = provided >= MPI_THREAD_SERIALIZED ? 0 : 1;
    std::printf("rank %d: accepted at provided level %d\n", rank, provided);
  } catch (const coltrain::ConfigError& error) {
    const std::string message = error.what();
    const bool names_level = message.find("MPI_THREAD_FUNNELED") != std::string::npos;
    const bool names_fix = message.find("MPI_Init_thread") != std::string::npos;
    status = provided < MPI_THREAD_SERIALIZED && names_level && names_fix ? 0 : 1;
    std::printf("rank %d: refused: %s\n", rank, message.c_str());
  }
  int worst = 0;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf(worst == 0 ? "thread level checked on every rank\n" : "FAILED\n");
  MPI_Finalize();
  return worst;
}
