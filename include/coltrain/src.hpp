#pragma once
// The one translation unit of a program built with COLTRAIN_SEPARATE_COMPILATION that compiles
// coltrain's out-of-line definitions (core/config.hpp says how): include this file there, and
// only there. CMake users get it from the coltrain::separate target instead.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_SEPARATE_COMPILATION
#error "<coltrain/src.hpp> needs -DCOLTRAIN_SEPARATE_COMPILATION; header-only builds need no source"
#endif

#include <coltrain/comm/impl/call_checks.ipp>
#include <coltrain/comm/impl/communicator.ipp>
#include <coltrain/comm/impl/elastic_group.ipp>
#include <coltrain/comm/impl/options.ipp>
#include <coltrain/comm/impl/request.ipp>
#include <coltrain/comm/impl/store_rendezvous.ipp>
#include <coltrain/comm/impl/tuning_file.ipp>
#if COLTRAIN_WITH_MPI
#include <coltrain/comm/impl/tcp_over_mpi.ipp>
#endif
#include <coltrain/core/impl/error.ipp>
