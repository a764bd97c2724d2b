#pragma once
// Reductions in a fixed order, the deterministic ones: every element is reduced as the same
// binary tree over the ranks' copies in rank order, pairs first, then pairs of pairs:
//   ((x0 op x1) op (x2 op x3)) op ((x4 op x5) op (x6 op x7))
// (off powers of two the largest power of two on the left: ((x0 op x1) op x2) for three), on
// whichever rank computes it, so the result's bits depend on the inputs and the number of ranks
// alone, not on the chunk size, the message size, the transport or timing. Ring, tree and
// halving-doubling each add in an order of their own, which differs from element to element and
// with p's factors; floating-point addition is not associative. The tree, not a left fold, so that
// the sum over 2^k ranks of sums over 2^j aligned pieces each is the tree over all 2^(k+j)
// pieces: work cut into fixed pieces gives the same bits on 1, 2, 4 or 8 ranks.
// Each rank owns the ring's segment of its rank. Chunk by chunk, every rank sends each owner its
// copy of that owner's segment (p-1 messages from distinct peers), and the owner folds the p
// copies:
//   reduce-scatter: (p-1) a per chunk, (p-1)/p n bytes sent and received, (p-1)/p n reduced, as
//                   the ring's; the owner holds p chunks at a time
//   allreduce:      that, then the ring's allgather of the segments: (p-1)/p n bytes more each way
//   reduce:         that, then every owner sends its segment to the root
// An allreduce of at most kRankOrderDirectBytes instead sends every rank's whole input to every
// other rank at once, and each rank folds all p copies itself, in the same tree: one round of
// p-1 messages, (p-1) a + (p-1) n b, for the latency of small vectors; the same bits.
// Chosen by name ("rank_order"), by deterministic mode (CommOptions::deterministic), and by the
// cost model for that one-round exchange: on 2-4 ranks it took 0.5-0.9x the time of the best other
// algorithm up to 8 KiB (docs/benchmarks.md).

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/algorithms/ring.hpp>
#include <coltrain/comm/transport/transport.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace coltrain::comm {

namespace detail {

// Folds p copies of `bytes` bytes into `out` in the fixed tree above. `copy(i)` returns copy i
// (waiting for it if need be), called in rank order; `work(i)` is a buffer of `bytes` bytes this
// fold may overwrite, for the partial result of the subtree that starts at copy i. `out` may be
// one of the copies: it is written last, elementwise.
template <class Copy, class Work>
void fold_in_fixed_tree(int p, std::size_t bytes, const ElementReduction& reduction, std::byte* out,
                        Copy copy, Work work, std::vector<const std::byte*>& partial) {
  const auto at = [](int i) { return static_cast<std::size_t>(i); };
  if (p == 1) return copy_bytes(out, copy(0), bytes);
  // Each copy is asked for when the fold first needs it, so pairs are reduced while later copies
  // still arrive.
  partial.resize(at(p));
  int fetched = 0;
  const auto value = [&](int i) {
    for (; fetched <= i; ++fetched) partial[at(fetched)] = copy(fetched);
    return partial[at(i)];
  };
  for (int width = 1; width < p; width *= 2) {
    for (int i = 0; i + width < p; i += 2 * width) {
      std::byte* into = 2 * width >= p ? out : work(i);
      const std::byte* left = value(i);
      reduction.reduce(into, left, value(i + width), bytes);
      partial[at(i)] = into;
    }
  }
}

// Chunks in flight ahead of the one being reduced, each with its p - 1 receives and sends: with
// ranks that share cores, a rank that is off its core still has transfers to serve.
inline constexpr std::size_t kRankOrderDepth = 4;

// Reduces segment `ring.r` of `input` over all ranks in rank order into `result` (the segment's
// first element at result[0]), which may be that segment of `input` itself; the caller's finish()
// is left to do. `slots` holds kRankOrderDepth sets of p chunks.
template <Transport Tr>
void rank_order_reduce_segment(Tr& transport, const RingLayout& ring, const std::byte* input,
                               std::byte* result, const ElementReduction& reduction,
                               const MessageHeader& call, std::vector<std::byte>& slots) {
  const int p = ring.p;
  const int r = ring.r;
  const auto at = [](int i) { return static_cast<std::size_t>(i); };
  const std::size_t slot_bytes = ring.largest_chunk_bytes();
  std::byte* const slot_space = reserved_bytes(slots, kRankOrderDepth * at(p) * slot_bytes);
  const auto chunk = [&](int segment, std::size_t j) {
    return to_bytes(chunk_of(ring.segments, at(segment), ring.chunks, j), ring.element_bytes);
  };
  const auto slot = [&](std::size_t j, int from) {
    return slot_space + ((j % kRankOrderDepth) * at(p) + at(from)) * slot_bytes;
  };
  // Chunk j of this rank's segment from every other rank, and chunk j of every other rank's
  // segment to it.
  using Request = typename Tr::Request;
  std::vector<Request> receives(kRankOrderDepth * at(p));
  std::vector<Request> sends(kRankOrderDepth * at(p));
  const auto post = [&](std::size_t j) {
    const ByteRange mine = chunk(r, j);
    for (int step = 1; step < p; ++step) {
      const int from = (r - step + p) % p;
      const int to = (r + step) % p;
      receives[(j % kRankOrderDepth) * at(p) + at(from)] =
          transport.irecv(from, message(call, mine.size),
                          writable_bytes_of(slot(j, from), ByteRange{0, mine.size}));
      const ByteRange theirs = chunk(to, j);
      sends[(j % kRankOrderDepth) * at(p) + at(to)] =
          transport.isend(to, message(call, theirs.size), bytes_of(input, theirs));
    }
  };
  const std::size_t segment_begin = ring.segment_range(r).begin;
  std::vector<const std::byte*> partial;
  for (std::size_t j = 0; j < std::min(kRankOrderDepth - 1, ring.chunks); ++j) post(j);
  for (std::size_t j = 0; j < ring.chunks; ++j) {
    if (j + kRankOrderDepth - 1 < ring.chunks) post(j + kRankOrderDepth - 1);
    const ByteRange mine = chunk(r, j);
    // In place, `out` is this rank's own copy; the fold writes it last.
    fold_in_fixed_tree(
        p, mine.size, reduction, result + (mine.begin - segment_begin),
        [&](int from) {
          if (from == r) return input + mine.begin;
          transport.wait(receives[(j % kRankOrderDepth) * at(p) + at(from)]);
          return static_cast<const std::byte*>(slot(j, from));
        },
        [&](int from) { return slot(j, from); }, partial);
    // Chunk j's slots and sends are reused by chunk j + kRankOrderDepth, posted next.
    for (int from = 0; from < p; ++from) {
      if (from != r) transport.wait(sends[(j % kRankOrderDepth) * at(p) + at(from)]);
    }
  }
}

// Every rank's whole input to every other rank, then the fold of the p copies on each.
template <Transport Tr>
void rank_order_allreduce_direct(Tr& transport, const std::byte* input, std::byte* output,
                                 std::size_t count, const ElementReduction& reduction,
                                 const MessageHeader& call, std::vector<std::byte>& slots) {
  const int p = transport.size();
  const int r = transport.rank();
  const auto at = [](int i) { return static_cast<std::size_t>(i); };
  const std::size_t bytes = count * reduction.element_bytes();
  std::byte* const copies = reserved_bytes(slots, at(p) * bytes);
  const auto copy_of = [&](int rank) { return copies + at(rank) * bytes; };
  std::vector<typename Tr::Request> requests;
  requests.reserve(2 * at(p));
  for (int step = 1; step < p; ++step) {
    const int from = (r - step + p) % p;
    requests.push_back(
        transport.irecv(from, message(call, bytes), std::span<std::byte>(copy_of(from), bytes)));
    requests.push_back(transport.isend((r + step) % p, message(call, bytes),
                                       std::span<const std::byte>(input, bytes)));
  }
  wait_all(transport, std::span(requests));
  std::vector<const std::byte*> partial;
  fold_in_fixed_tree(
      p, bytes, reduction, output,
      [&](int from) { return from == r ? input : static_cast<const std::byte*>(copy_of(from)); },
      copy_of, partial);
  reduction.finish(output, bytes, p);
}

}  // namespace detail

// input: count elements; output: count elements of the reduction, on every rank. input may equal
// output.
template <Transport Tr>
void rank_order_allreduce(Tr& transport, const std::byte* input, std::byte* output,
                          std::size_t count, const ElementReduction& reduction,
                          const MessageHeader& call, const AlgorithmTuning& tuning,
                          AlgorithmScratch& scratch) {
  const int p = transport.size();
  const std::size_t bytes = count * reduction.element_bytes();
  if (p == 1) {
    detail::copy_bytes(output, input, bytes);
    return;
  }
  if (bytes <= kRankOrderDirectBytes) {
    detail::rank_order_allreduce_direct(transport, input, output, count, reduction, call,
                                        scratch.slots);
    return;
  }
  const detail::RingLayout ring(p, transport.rank(), count, reduction.element_bytes(), tuning);
  const detail::ByteRange mine = ring.segment_range(ring.r);
  // In place, the segment written is one no other rank's copy is sent from.
  detail::rank_order_reduce_segment(transport, ring, input, output + mine.begin, reduction, call,
                                    scratch.slots);
  reduction.finish(output + mine.begin, mine.size, p);
  ring_allgather_segments(transport, ring, output, call);
}

// input: count * p elements; output: this rank's count elements of the reduction.
template <Transport Tr>
void rank_order_reduce_scatter(Tr& transport, const std::byte* input, std::byte* output,
                               std::size_t count, const ElementReduction& reduction,
                               const MessageHeader& call, const AlgorithmTuning& tuning,
                               AlgorithmScratch& scratch) {
  const int p = transport.size();
  const std::size_t block_bytes = count * reduction.element_bytes();
  if (p == 1) {
    detail::copy_bytes(output, input, block_bytes);
    return;
  }
  // count * p elements in p segments of count each: segment r is this rank's block.
  const detail::RingLayout ring(p, transport.rank(), count * static_cast<std::size_t>(p),
                                reduction.element_bytes(), tuning);
  detail::rank_order_reduce_segment(transport, ring, input, output, reduction, call, scratch.slots);
  reduction.finish(output, block_bytes, p);
}

// input: count elements; output: the reduction, on the root only. Each owner sends its reduced
// segment to the root.
template <Transport Tr>
void rank_order_reduce(Tr& transport, const std::byte* input, std::byte* output, std::size_t count,
                       int root, const ElementReduction& reduction, const MessageHeader& call,
                       const AlgorithmTuning& tuning, AlgorithmScratch& scratch) {
  const int p = transport.size();
  const int r = transport.rank();
  const std::size_t bytes = count * reduction.element_bytes();
  if (p == 1) {
    detail::copy_bytes(output, input, bytes);
    return;
  }
  const detail::RingLayout ring(p, r, count, reduction.element_bytes(), tuning);
  const detail::ByteRange mine = ring.segment_range(r);
  std::byte* const reduced = detail::reserved_bytes(scratch.partial, mine.size);
  detail::rank_order_reduce_segment(transport, ring, input, reduced, reduction, call,
                                    scratch.slots);
  reduction.finish(reduced, mine.size, p);
  if (r != root) {
    auto sent = transport.isend(root, detail::message(call, mine.size),
                                std::span<const std::byte>(reduced, mine.size));
    transport.wait(sent);
    return;
  }
  std::vector<typename Tr::Request> receives;
  for (int owner = 0; owner < p; ++owner) {
    if (owner == r) continue;
    const detail::ByteRange range = ring.segment_range(owner);
    receives.push_back(transport.irecv(owner, detail::message(call, range.size),
                                       detail::writable_bytes_of(output, range)));
  }
  detail::copy_bytes(output + mine.begin, reduced, mine.size);
  wait_all(transport, std::span(receives));
}

}  // namespace coltrain::comm
