#pragma once
// The schedules of the NCCL backend's own allreduce algorithms (comm/device/nccl/nccl_backend.hpp),
// apart from the data movement that runs them: the chunked ring and the pipelined double binary
// tree over ncclSend/ncclRecv, as plain lists of rounds. They need neither NCCL nor a GPU, so the
// tests run every rank's plan on host arrays for many world sizes (one GPU holds only one NCCL
// rank).

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/algorithms/tree.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace coltrain::comm::detail {

// One round of the chunked ring allreduce on rank r of p (ring_allreduce_plan): `count` elements
// cut into p segments (Blocks), each segment into `chunks` chunks (Blocks again); every rank sends
// one chunk to r + 1 and receives one from r - 1 per round, in one NCCL group.
struct RingRound {
  int send_segment = 0;
  int receive_segment = 0;
  int chunk = 0;                   // the same chunk of both segments
  bool send_from_input = false;    // the first step sends this rank's own input
  bool reduce = false;             // received into scratch `slot`; output = input op slot after
  bool completes_segment = false;  // this reduction finishes segment r's chunk: kAvg divides here
  int slot = 0;                    // the scratch slot a reduced chunk lands in
  // Before this round's transfers, the reductions of every round up to this one (-1: none) must
  // have finished. Reductions run on a stream of their own, so later ones may still be running.
  int after_reductions = -1;
};

// Reductions run at most this many rounds behind the transfers, and a round receives into one of
// this many scratch slots: round t's transfer overlaps round t-1's reduction.
inline constexpr int kRingLag = 2;
inline constexpr int kRingSlots = 2;

// Reduce-scatter, steps s < p-1: chunk j of segment r-1-s travels right while chunk j of segment
// r-2-s arrives from the left and is reduced with this rank's input; after p-1 steps segment r
// holds the reduction of all ranks. Allgather, steps s < p-1: segment r-s travels and r-s-1
// arrives, stored as received. Round t is step t / chunks, chunk t % chunks, so what a round sends
// was reduced `chunks` rounds earlier; with a lag of min(kRingLag, chunks) rounds, that reduction
// and the one that last read the round's scratch slot are done before the round. Each rank sends
// 2(p-1)/p of the array in 2(p-1) x chunks rounds.
inline std::vector<RingRound> ring_allreduce_plan(int p, int r, int chunks) {
  std::vector<RingRound> rounds;
  if (p < 2 || chunks < 1) return rounds;
  const int steps = p - 1;
  const int lag = std::min(kRingLag, chunks);
  rounds.reserve(2 * static_cast<std::size_t>(steps) * static_cast<std::size_t>(chunks));
  for (int t = 0; t < 2 * steps * chunks; ++t) {
    const int step = t / chunks;
    RingRound round;
    round.chunk = t % chunks;
    round.after_reductions = t - lag;
    if (step < steps) {
      round.send_segment = modulo(r - 1 - step, p);
      round.receive_segment = modulo(r - 2 - step, p);
      round.send_from_input = step == 0;
      round.reduce = true;
      round.completes_segment = step == steps - 1;
      round.slot = t % kRingSlots;
    } else {
      round.send_segment = modulo(r - (step - steps), p);
      round.receive_segment = modulo(r - (step - steps) - 1, p);
    }
    rounds.push_back(round);
  }
  return rounds;
}

// The ring's chunks per segment: about a quarter of the segment, within 256 KiB and 1 MiB, so that
// the pipeline fills and a round's transfer outweighs its group launch and kernel.
inline constexpr std::size_t kRingChunkBytes = std::size_t{1} << 20;
inline constexpr std::size_t kRingMinChunkBytes = std::size_t{256} << 10;

inline int ring_chunks(std::size_t segment_elements, std::size_t element_bytes) {
  const std::size_t bytes = segment_elements * element_bytes;
  const std::size_t chunk_bytes = std::clamp(bytes / 4, kRingMinChunkBytes, kRingChunkBytes);
  const std::size_t chunk_elements = std::max<std::size_t>(1, chunk_bytes / element_bytes);
  return static_cast<int>(
      std::max<std::size_t>(1, (segment_elements + chunk_elements - 1) / chunk_elements));
}

// The pipelined double binary tree allreduce (Algorithm::kTree) over ncclSend/ncclRecv: the data's
// two halves travel on two heap-shaped trees, the second the first mirrored (virtual rank p-1-r,
// as the host tree in algorithms/tree.hpp), each half cut into `chunks` chunks. The plan runs in
// lockstep rounds, one NCCL group each: with H the trees' height, chunk c reaches a node at depth d
// from its children in round c + H - d - 1 and is reduced into that node's output after the
// round; the node sends it to its parent in round c + H - d (a leaf sends its input), so the root
// completes it after round c + H - 1 (kAvg divides there). It comes back down in the next rounds:
// a node at depth d receives it in round c + H + d - 1 and passes it to its children in the next.
// Both ends of every link therefore post their messages in the same round and, within a round, in
// the same order (tree 0's before tree 1's), which is how NCCL pairs sends with receives. k
// chunks take k + 2H rounds.
struct TreeTransfer {
  enum class Buffer : std::uint8_t { kInput, kOutput, kScratch };
  bool send = false;
  int peer = 0;
  int tree = 0;   // which half of the data
  int chunk = 0;  // within that half
  Buffer buffer = Buffer::kOutput;
  int slot = 0;  // kScratch: one per child, holding what it sent up
};
// After a round: output[chunk] = (first ? input : output)[chunk] op scratch[slot], divided by p
// under kAvg when `completes` (the root's last reduction of the chunk).
struct TreeReduction {
  int tree = 0;
  int chunk = 0;
  int slot = 0;
  bool first = false;
  bool completes = false;
};
struct TreeRoundPlan {
  std::vector<TreeTransfer> transfers;  // in posting order
  std::vector<TreeReduction> reductions;
};

// The tree's chunk: large enough that a round's transfers outweigh its group launch and reduction
// kernel, small enough that the pipeline fills quickly (NCCL's own trees use 128-512 KiB).
inline constexpr std::size_t kTreeChunkBytes = std::size_t{1} << 20;

inline std::vector<TreeRoundPlan> tree_allreduce_plan(int p, int r, int chunks) {
  std::vector<TreeRoundPlan> rounds;
  if (p < 2 || chunks < 1) return rounds;
  const auto depth = [](int v) {
    int d = 0;
    while ((2 << d) - 1 <= v) ++d;
    return d;
  };
  const int height = depth(p - 1);
  rounds.resize(static_cast<std::size_t>(chunks + 2 * height));
  using Buffer = TreeTransfer::Buffer;
  for (int tree = 0; tree < 2; ++tree) {
    const auto to_virtual = [&](int rank) { return tree == 0 ? rank : p - 1 - rank; };
    const TreeNode node = tree_node(r, p, to_virtual, to_virtual);  // the mirror is its own inverse
    const int d = depth(to_virtual(r));
    const auto round = [&](int index) -> TreeRoundPlan& {
      return rounds[static_cast<std::size_t>(index)];
    };
    const auto children = [&](int slot) { return node.children[static_cast<std::size_t>(slot)]; };
    for (int c = 0; c < chunks; ++c) {
      for (int slot = 0; slot < node.child_count; ++slot) {
        round(c + height - d - 1)
            .transfers.push_back({false, children(slot), tree, c, Buffer::kScratch, slot});
        round(c + height - d - 1)
            .reductions.push_back(
                {tree, c, slot, slot == 0, node.parent < 0 && slot == node.child_count - 1});
      }
      if (node.parent >= 0) {
        const Buffer source = node.child_count == 0 ? Buffer::kInput : Buffer::kOutput;
        round(c + height - d).transfers.push_back({true, node.parent, tree, c, source, 0});
        round(c + height + d - 1)
            .transfers.push_back({false, node.parent, tree, c, Buffer::kOutput, 0});
      }
      for (int slot = 0; slot < node.child_count; ++slot) {
        round(c + height + d)
            .transfers.push_back({true, children(slot), tree, c, Buffer::kOutput, 0});
      }
    }
  }
  return rounds;
}

}  // namespace coltrain::comm::detail
