#pragma once
// coltrain's collectives: include this to create a Communicator and call allreduce and friends.

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/cost_model.hpp>
#include <coltrain/comm/elastic_group.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/types.hpp>
