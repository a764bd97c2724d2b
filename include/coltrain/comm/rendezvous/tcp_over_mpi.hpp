#pragma once
// A TCP communicator over the ranks of an MPI communicator: for a code that runs under mpiexec
// and wants coltrain's TCP transport beside (or to compare with) MPI's own. Ranks and the world
// size come from MPI, and MPI carries what the rendezvous needs, so no launcher variables are set.
//
// On one host, rank 0 listens on a port the kernel picks (MASTER_PORT=0) and publishes it in a
// port file of this communicator's own under the temporary directory, whose name it broadcasts:
// nothing (another job, an outgoing connection) can take the port between a pick and the bind.
// Across hosts, where no file is shared, rank 0 listens on MASTER_PORT (or on the port published in
// COLTRAIN_PORT_FILE on a shared file system, with MASTER_PORT=0), at MASTER_ADDR or else at the
// host name MPI gives for rank 0. Collective over `comm`: every rank calls it.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_MPI
#error "coltrain/comm/rendezvous/tcp_over_mpi.hpp needs MPI: compile with mpicxx or link MPI"
#endif

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/options.hpp>

#include <mpi.h>

namespace coltrain::comm {

COLTRAIN_DECL Communicator tcp_over_mpi(MPI_Comm comm,
                                        CommOptions options = comm_options_from_env());

}  // namespace coltrain::comm

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/comm/impl/tcp_over_mpi.ipp>
#endif
