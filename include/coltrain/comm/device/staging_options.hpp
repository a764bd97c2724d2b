#pragma once
// StagingOptions: how device buffers are staged through host memory on MPI and TCP
// (comm/device/staged_collectives.hpp), apart from the staging itself, for the Communicator's
// declarations. Every rank must use the same options.

#include <cstddef>

namespace coltrain::comm {

struct StagingOptions {
  // Largest host slot: one chunk of every rank's block (allgather, reduce_scatter) or of the array.
  // 4 MiB: TCP and MPI ring allreduce reach their large-message rate from 2 MiB on
  // (docs/benchmarks.md), and three slots stay small.
  std::size_t chunk_bytes = std::size_t{4} << 20;
  // Arrays are cut into at least this many chunks, down to min_chunk_bytes, so that mid-sized ones
  // overlap their copies too.
  std::size_t min_chunks = 4;
  std::size_t min_chunk_bytes = std::size_t{256} << 10;
};

}  // namespace coltrain::comm
