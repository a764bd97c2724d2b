#pragma once
// Pipelined binary-tree algorithms. Ranks form a heap-shaped binary tree (virtual rank v has
// children 2v+1 and 2v+2); data is cut into chunks that flow up the tree (reduce), down it
// (broadcast), or up and then down (allreduce). Allreduce uses two trees, NCCL-style: the second is
// the first mirrored (v = p-1-r), so a rank that is a leaf in one is inside the other, each tree
// carries half the data, and no rank's links idle. With p ranks, n bytes and k chunks: about 2(lg p
// + k) steps for allreduce, each rank sending at most 2n bytes over its busiest link; latency grows
// with lg p, not p.
//
// Every iteration handles one chunk going up and, lag chunks behind it, one chunk coming down, so
// the two directions overlap. Both ends of every link post their messages in the same (iteration,
// stage) order, which is what keeps messages matched without tags.

#include <array>
#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/transport/transport.hpp>
#include <cstddef>
#include <vector>

namespace coltrain::comm {
namespace detail {

// This rank's place in a heap-shaped tree over virtual ranks (v = 0 is the root).
struct TreeNode {
  int parent = -1;  // real rank, or -1 at the root
  std::array<int, 2> children{-1, -1};
  int child_count = 0;
};

// `to_virtual` and `to_real` map ranks to positions in the heap and back.
template <class ToVirtual, class ToReal>
TreeNode tree_node(int rank, int p, ToVirtual to_virtual, ToReal to_real) {
  TreeNode node;
  const int v = to_virtual(rank);
  if (v > 0) node.parent = to_real((v - 1) / 2);
  for (int c : {2 * v + 1, 2 * v + 2}) {
    if (c < p) node.children[static_cast<std::size_t>(node.child_count++)] = to_real(c);
  }
  return node;
}

// One pipeline unit: a chunk and the tree it travels on.
struct TreeUnit {
  ByteRange range;
  const TreeNode* node;
};

enum class TreeFlow { kUp, kDown, kUpAndDown };

// Runs the units through their trees. kUp leaves the reduction in `output` on each tree's root
// (interior ranks use `output` for partial sums); kDown broadcasts `output` from the root;
// kUpAndDown does both, so every rank ends with the reduction. kAvg divides at the root.
// `reduction` is null for kDown, which only moves bytes. The children's chunks wait in `slots`, two
// of `slot_bytes` (the largest unit) each; kDown receives in place and needs none.
template <Transport Tr>
void run_tree_pipeline(Tr& transport, const std::byte* input, std::byte* output,
                       const std::vector<TreeUnit>& units, TreeFlow flow,
                       const ElementReduction* reduction, const MessageHeader& call,
                       std::byte* slots, std::size_t slot_bytes) {
  const bool up = flow != TreeFlow::kDown;
  const bool down = flow != TreeFlow::kUp;
  // A chunk starts down two iterations after it went up, so the next chunks' ascent overlaps it.
  const std::size_t lag = (up && down) ? 2 : 0;
  const std::size_t iterations = units.size() + (down ? lag : 0);
  std::vector<typename Tr::Request> up_sends(units.size());
  std::vector<typename Tr::Request> down_sends;
  const int p = transport.size();

  for (std::size_t i = 0; i < iterations; ++i) {
    if (up && i < units.size()) {
      const TreeUnit& unit = units[i];
      const TreeNode& node = *unit.node;
      const MessageHeader header = message(call, unit.range.size);
      // at(): g++ cannot see that a node has at most two children, and warns of an overflow.
      std::array<typename Tr::Request, 2> child_requests{};
      for (int c = 0; c < node.child_count; ++c) {
        child_requests.at(static_cast<std::size_t>(c)) =
            transport.irecv(node.children[static_cast<std::size_t>(c)], header,
                            writable_bytes_of(slots + static_cast<std::size_t>(c) * slot_bytes,
                                              ByteRange{0, unit.range.size}));
      }
      const std::byte* mine = input + unit.range.begin;  // a leaf sends its input as it is
      for (int c = 0; c < node.child_count; ++c) {
        transport.wait(child_requests[static_cast<std::size_t>(c)]);
        reduction->reduce(output + unit.range.begin, mine,
                          slots + static_cast<std::size_t>(c) * slot_bytes, unit.range.size);
        mine = output + unit.range.begin;
      }
      if (node.parent >= 0) {
        up_sends[i] =
            transport.isend(node.parent, header, bytes_of(mine - unit.range.begin, unit.range));
      } else {
        copy_bytes(output + unit.range.begin, mine, unit.range.size);  // a root without children
        reduction->finish(output + unit.range.begin, unit.range.size, p);
      }
    }
    if (down && i >= lag) {
      const TreeUnit& unit = units[i - lag];
      const TreeNode& node = *unit.node;
      const MessageHeader header = message(call, unit.range.size);
      if (node.parent >= 0) {
        // The result lands where this rank's partial sum was sent from: that send must be done.
        if (up) transport.wait(up_sends[i - lag]);
        auto request = transport.irecv(node.parent, header, writable_bytes_of(output, unit.range));
        transport.wait(request);
      }
      for (int c = 0; c < node.child_count; ++c) {
        down_sends.push_back(transport.isend(node.children[static_cast<std::size_t>(c)], header,
                                             bytes_of(output, unit.range)));
      }
    }
  }
  if (!down) wait_all(transport, std::span(up_sends));
  wait_all(transport, std::span(down_sends));
}

}  // namespace detail

// Allreduce over two mirrored trees, each carrying half of the chunks.
template <Transport Tr>
void tree_allreduce(Tr& transport, const std::byte* input, std::byte* output, std::size_t count,
                    const ElementReduction& reduction, const MessageHeader& call,
                    const AlgorithmTuning& tuning, AlgorithmScratch& scratch) {
  const int p = transport.size();
  const int r = transport.rank();
  const std::size_t element_bytes = reduction.element_bytes();
  if (p == 1) {
    detail::copy_bytes(output, input, count * element_bytes);
    return;
  }
  const std::array<detail::TreeNode, 2> nodes{
      detail::tree_node(
          r, p, [](int x) { return x; }, [](int x) { return x; }),
      detail::tree_node(
          r, p, [p](int x) { return p - 1 - x; }, [p](int x) { return p - 1 - x; })};
  const detail::Blocks halves(count, 2);
  const std::size_t chunks = detail::chunks_per_block(halves, element_bytes, tuning);
  std::vector<detail::TreeUnit> units;
  for (std::size_t j = 0; j < chunks; ++j) {
    for (std::size_t tree = 0; tree < 2; ++tree) {
      units.push_back({detail::to_bytes(detail::chunk_of(halves, tree, chunks, j), element_bytes),
                       &nodes[tree]});
    }
  }
  const std::size_t slot_bytes = (halves.size(0) + chunks - 1) / chunks * element_bytes;
  detail::run_tree_pipeline(transport, input, output, units, detail::TreeFlow::kUpAndDown,
                            &reduction, call, detail::reserved_bytes(scratch.slots, 2 * slot_bytes),
                            slot_bytes);
}

namespace detail {

// The units of a single tree rooted at `root`, for broadcast and reduce.
inline std::vector<TreeUnit> rooted_tree_units(const TreeNode& node, std::size_t count,
                                               std::size_t element_bytes,
                                               const AlgorithmTuning& tuning,
                                               std::size_t& slot_bytes) {
  const ChunkedRange whole({0, count * element_bytes}, element_bytes, tuning);
  std::vector<TreeUnit> units;
  for (std::size_t j = 0; j < whole.chunks(); ++j) units.push_back({whole.chunk(j), &node});
  slot_bytes = whole.largest_chunk_bytes();
  return units;
}

inline TreeNode rooted_tree_node(int rank, int p, int root) {
  return tree_node(
      rank, p, [=](int x) { return modulo(x - root, p); }, [=](int x) { return (x + root) % p; });
}

}  // namespace detail

template <Transport Tr>
void tree_broadcast(Tr& transport, std::byte* data, std::size_t count, std::size_t element_bytes,
                    int root, const MessageHeader& call, const AlgorithmTuning& tuning) {
  const int p = transport.size();
  if (p == 1) return;
  const detail::TreeNode node = detail::rooted_tree_node(transport.rank(), p, root);
  std::size_t slot_bytes = 0;
  const auto units = detail::rooted_tree_units(node, count, element_bytes, tuning, slot_bytes);
  // Every rank but the root tells its parent it has everything with an empty message. Every rank
  // then receives from a neighbour whichever root it takes, so ranks that disagree on the root
  // read each other's headers (a MismatchError naming both roots) instead of finishing silently.
  const MessageHeader closing = detail::message(call, 0);
  std::array<typename Tr::Request, 2> closed{};
  for (int c = 0; c < node.child_count; ++c) {
    closed.at(static_cast<std::size_t>(c)) =  // at(): as in run_tree_pipeline
        transport.irecv(node.children[static_cast<std::size_t>(c)], closing, {});
  }
  detail::run_tree_pipeline(transport, data, data, units, detail::TreeFlow::kDown, nullptr, call,
                            nullptr, 0);
  if (node.parent >= 0) {
    auto done = transport.isend(node.parent, closing, {});
    transport.wait(done);
  }
  wait_all(transport, std::span(closed.data(), static_cast<std::size_t>(node.child_count)));
}

// output is written on the root only; other ranks keep partial sums in `scratch`.
template <Transport Tr>
void tree_reduce(Tr& transport, const std::byte* input, std::byte* output, std::size_t count,
                 int root, const ElementReduction& reduction, const MessageHeader& call,
                 const AlgorithmTuning& tuning, AlgorithmScratch& scratch) {
  const int p = transport.size();
  const std::size_t element_bytes = reduction.element_bytes();
  if (p == 1) {
    detail::copy_bytes(output, input, count * element_bytes);
    return;
  }
  const detail::TreeNode node = detail::rooted_tree_node(transport.rank(), p, root);
  std::byte* work = output;
  if (transport.rank() != root)
    work = detail::reserved_bytes(scratch.partial, count * element_bytes);
  std::size_t slot_bytes = 0;
  const auto units = detail::rooted_tree_units(node, count, element_bytes, tuning, slot_bytes);
  detail::run_tree_pipeline(transport, input, work, units, detail::TreeFlow::kUp, &reduction, call,
                            detail::reserved_bytes(scratch.slots, 2 * slot_bytes), slot_bytes);
}

}  // namespace coltrain::comm
