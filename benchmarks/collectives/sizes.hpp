#pragma once
// The sizes a sweep runs, as nccl-tests counts them: the full array, in whole elements and whole
// blocks of one per rank.

#include "options.hpp"
#include "world.hpp"

#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>

#include <cstddef>
#include <vector>

namespace coltrain::bench {

inline bool reduces(Collective collective) {
  return collective != Collective::kAllgather && collective != Collective::kBroadcast &&
         collective != Collective::kAlltoall;
}

inline bool per_rank_blocks(Collective collective) {
  return collective == Collective::kAllgather || collective == Collective::kReduceScatter ||
         collective == Collective::kAlltoall;
}

// One size of a sweep. Sizes count the full array, as nccl-tests does: the allgather output, the
// reduce_scatter input, each rank's alltoall input (p blocks).
struct Case {
  Collective collective;
  DataType dtype;
  ReduceOp op;
  int root;
  int ranks;
  int rank;
  std::size_t count;  // elements of the full array
  std::size_t block;  // elements per rank for allgather, reduce_scatter and alltoall; else count
  std::size_t bytes() const { return count * coltrain::size_of(dtype); }
};

// The sizes from -b to -e, stepping by -f, rounded down to whole elements (whole blocks of one per
// rank for allgather and reduce_scatter); sizes that round to nothing, or to the previous size, go.
inline std::vector<Case> sweep(const Options& options, const World& world) {
  std::vector<Case> cases;
  const std::size_t element = coltrain::size_of(options.dtype);
  const std::size_t ranks = per_rank_blocks(options.collective) ? world.size : 1;
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
    const std::size_t block = bytes / (element * ranks);
    if (block > 0 && (cases.empty() || cases.back().block != block)) {
      cases.push_back({options.collective, options.dtype, options.op, options.root, world.size,
                       world.rank, block * ranks, block});
    }
    if (bytes > options.max_bytes / options.factor) break;
    bytes *= options.factor;
  }
  return cases;
}

}  // namespace coltrain::bench
