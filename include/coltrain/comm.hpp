#pragma once
// coltrain's collectives: include this to create a Communicator and call allreduce and friends.

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/elastic/elastic_group.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/store_rendezvous.hpp>
#include <coltrain/comm/tuning/cost_model.hpp>
#include <coltrain/comm/tuning/tuning_file.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>

#if COLTRAIN_WITH_MPI
#include <coltrain/comm/rendezvous/tcp_over_mpi.hpp>
#endif
