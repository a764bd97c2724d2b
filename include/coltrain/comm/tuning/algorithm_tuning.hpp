#pragma once
// AlgorithmTuning: the pipelining knobs of the ring and tree schedules (Communicator::set_tuning),
// and the size up to which rank order's allreduce sends every input whole (which the cost model
// prices too). A header of its own so that the Communicator's declaration does not pull in the
// algorithms.

#include <cstddef>

namespace coltrain::comm {

struct AlgorithmTuning {
  // Largest pipelining unit of ring and tree: large enough that per-message costs vanish, small
  // enough that transfers, reductions and forwarding overlap.
  // 256 KB measured best for ring on the development machine over TCP and MPI (docs/benchmarks.md).
  std::size_t chunk_bytes = std::size_t{256} << 10;
  // Blocks are cut into at least this many chunks, down to min_chunk_bytes, so that mid-sized
  // vectors pipeline too.
  std::size_t min_chunks_per_block = 4;
  std::size_t min_chunk_bytes = std::size_t{64} << 10;
};

// The largest allreduce that rank_order sends to every rank whole, in one round
// (comm/algorithms/rank_order.hpp).
inline constexpr std::size_t kRankOrderDirectBytes = std::size_t{16} << 10;

}  // namespace coltrain::comm
