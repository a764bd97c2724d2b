#pragma once
// Ring algorithms. Allreduce is a reduce-scatter followed by an allgather around the ring, each cut
// into p segments and every segment into chunks; a chunk is forwarded as soon as it is reduced (or
// received), so receiving, reducing and sending overlap. With p ranks and n bytes:
//   allreduce:      2(p-1) steps, each rank sends 2(p-1)/p n bytes, reduces (p-1)/p n bytes
//   reduce-scatter: p-1 steps, (p-1)/p of the input sent;  allgather: p-1 steps, (p-1)/p of the
//   output broadcast, reduce: a pipelined chain from or to the root: n bytes per link, p-1 + chunks
//   steps
// Bandwidth-optimal; the latency term grows with p, so small messages prefer tree or
// halving-doubling.

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/transport/transport.hpp>

#include <array>
#include <cstddef>
#include <vector>

namespace coltrain::comm {

namespace detail {

// The ring's layout: `count` elements of `element_bytes` bytes in p segments, each cut into the
// same number of chunks. A unit u is chunk u % chunks of the segment that moves at step u / chunks.
struct RingLayout {
  RingLayout(int p, int r, std::size_t count, std::size_t element_bytes,
             const AlgorithmTuning& tuning)
      : p(p),
        r(r),
        right((r + 1) % p),
        left((r + p - 1) % p),
        element_bytes(element_bytes),
        segments(count, static_cast<std::size_t>(p)),
        chunks(chunks_per_block(segments, element_bytes, tuning)),
        units(static_cast<std::size_t>(p - 1) * chunks) {}

  // The bytes of unit u's chunk in segment r - offset - step.
  ByteRange unit_range(std::size_t u, int offset) const {
    const int segment = modulo(r - offset - static_cast<long long>(u / chunks), p);
    return to_bytes(chunk_of(segments, static_cast<std::size_t>(segment), chunks, u % chunks),
                    element_bytes);
  }
  // The bytes of segment `owner`, the one rank `owner` reduces.
  ByteRange segment_range(int owner) const {
    const auto o = static_cast<std::size_t>(owner);
    return {segments.begin(o) * element_bytes, segments.size(o) * element_bytes};
  }
  std::size_t largest_chunk_bytes() const {
    return (segments.size(0) + chunks - 1) / chunks * element_bytes;
  }

  int p;
  int r;
  int right;
  int left;
  std::size_t element_bytes;
  Blocks segments;
  std::size_t chunks;
  std::size_t units;
};

// Reduce-scatter steps: step s sends segment r-1-s and receives segment r-2-s, so that afterwards
// work[segment r] holds the reduction over all ranks, and the other segments of work hold partial
// results. `input` may equal `work`. Each chunk of segment r is handed to `on_final(range)` as soon
// as it is complete. Returns the sends, still in flight: unit u's send reads the chunk that the
// allgather's unit u later receives into. The received chunks wait in `slots`.
template <Transport Tr, class OnFinal>
std::vector<typename Tr::Request> ring_reduce_scatter_steps(Tr& transport, const RingLayout& ring,
                                                            const std::byte* input, std::byte* work,
                                                            const ElementReduction& reduction,
                                                            const MessageHeader& call,
                                                            std::vector<std::byte>& slots,
                                                            OnFinal on_final) {
  auto received_range = [&](std::size_t u) { return ring.unit_range(u, 2); };
  ReceivePipeline<Tr> receives(transport, ring.left, call, ring.units, ring.largest_chunk_bytes(),
                               received_range, slots);
  std::vector<typename Tr::Request> sends;
  sends.reserve(ring.units);
  auto post_send = [&](std::size_t u) {
    const ByteRange range = ring.unit_range(u, 1);
    const std::byte* source = u < ring.chunks ? input : work;  // step 0: this rank's own input
    sends.push_back(
        transport.isend(ring.right, message(call, range.size), bytes_of(source, range)));
  };
  for (std::size_t j = 0; j < ring.chunks; ++j) post_send(j);
  for (std::size_t u = 0; u < ring.units; ++u) {
    const std::byte* received = receives.wait(u);
    const ByteRange range = received_range(u);
    reduction.reduce(work + range.begin, input + range.begin, received, range.size);
    receives.release(u);
    if (u + ring.chunks < ring.units) {
      post_send(u + ring.chunks);  // the chunk just reduced travels on next step
    } else {
      on_final(range);
    }
  }
  return sends;
}

// Allgather steps: on entry the chunks of data[segment r] are being sent (`sends` holds them, in
// order, possibly after earlier sends); step s sends segment r-s and receives segment r-s-1
// straight into `data`. Before a receive lands in a chunk, the earlier send `reads[u]` from that
// chunk, if any, must be done.
template <Transport Tr>
void ring_allgather_steps(Tr& transport, const RingLayout& ring, std::byte* data,
                          const MessageHeader& call, std::vector<typename Tr::Request>& sends,
                          std::vector<typename Tr::Request>& reads) {
  std::vector<typename Tr::Request> receives(ring.units);
  for (std::size_t u = 0; u < ring.units; ++u) {
    if (u < reads.size()) transport.wait(reads[u]);
    const ByteRange range = ring.unit_range(u, 1);
    receives[u] =
        transport.irecv(ring.left, message(call, range.size), writable_bytes_of(data, range));
  }
  for (std::size_t u = 0; u < ring.units; ++u) {
    transport.wait(receives[u]);
    if (u + ring.chunks < ring.units) {  // forward what just arrived
      const ByteRange range = ring.unit_range(u + ring.chunks, 0);
      sends.push_back(
          transport.isend(ring.right, message(call, range.size), bytes_of(data, range)));
    }
  }
  wait_all(transport, std::span(sends));
  wait_all(transport, std::span(reads));
}

}  // namespace detail

// Reduce-scatter phase over `count` elements: afterwards work[segment r] holds the reduction over
// all ranks of their input[segment r]; the other segments hold partial results.
template <Transport Tr>
void ring_reduce_scatter_phase(Tr& transport, const std::byte* input, std::byte* work,
                               std::size_t count, const ElementReduction& reduction,
                               const MessageHeader& call, const AlgorithmTuning& tuning,
                               std::vector<std::byte>& slots) {
  const detail::RingLayout ring(transport.size(), transport.rank(), count,
                                reduction.element_bytes(), tuning);
  auto sends = detail::ring_reduce_scatter_steps(transport, ring, input, work, reduction, call,
                                                 slots, [](detail::ByteRange) {});
  wait_all(transport, std::span(sends));
}

// The allgather starts on each chunk of this rank's segment as soon as the reduce-scatter has
// finished it, so the two phases overlap.
template <Transport Tr>
void ring_allreduce(Tr& transport, const std::byte* input, std::byte* output, std::size_t count,
                    const ElementReduction& reduction, const MessageHeader& call,
                    const AlgorithmTuning& tuning, AlgorithmScratch& scratch) {
  const int p = transport.size();
  if (p == 1) {
    detail::copy_bytes(output, input, count * reduction.element_bytes());
    return;
  }
  const detail::RingLayout ring(p, transport.rank(), count, reduction.element_bytes(), tuning);
  std::vector<typename Tr::Request> allgather_sends;
  allgather_sends.reserve(ring.units);
  auto reduce_scatter_sends = detail::ring_reduce_scatter_steps(
      transport, ring, input, output, reduction, call, scratch.slots, [&](detail::ByteRange range) {
        reduction.finish(output + range.begin, range.size, p);
        allgather_sends.push_back(transport.isend(ring.right, detail::message(call, range.size),
                                                  detail::bytes_of(output, range)));
      });
  detail::ring_allgather_steps(transport, ring, output, call, allgather_sends,
                               reduce_scatter_sends);
}

// input: count * p elements; output: this rank's count elements of the reduction. The partial
// results live in `scratch`.
template <Transport Tr>
void ring_reduce_scatter(Tr& transport, const std::byte* input, std::byte* output,
                         std::size_t count, const ElementReduction& reduction,
                         const MessageHeader& call, const AlgorithmTuning& tuning,
                         AlgorithmScratch& scratch) {
  const int p = transport.size();
  const std::size_t block_bytes = count * reduction.element_bytes();
  if (p == 1) {
    detail::copy_bytes(output, input, block_bytes);
    return;
  }
  const std::size_t total = count * static_cast<std::size_t>(p);
  std::byte* work = detail::reserved_bytes(scratch.partial, total * reduction.element_bytes());
  ring_reduce_scatter_phase(transport, input, work, total, reduction, call, tuning, scratch.slots);
  detail::copy_bytes(output, work + block_bytes * static_cast<std::size_t>(transport.rank()),
                     block_bytes);
  reduction.finish(output, block_bytes, p);
}

// `data` cut into `ring`'s segments, of which this rank's (segment ring.r) is complete: afterwards
// every segment is, on every rank.
template <Transport Tr>
void ring_allgather_segments(Tr& transport, const detail::RingLayout& ring, std::byte* data,
                             const MessageHeader& call) {
  std::vector<typename Tr::Request> sends;
  sends.reserve(ring.units);
  for (std::size_t j = 0; j < ring.chunks; ++j) {
    const detail::ByteRange range = ring.unit_range(j, 0);
    sends.push_back(transport.isend(ring.right, detail::message(call, range.size),
                                    detail::bytes_of(data, range)));
  }
  std::vector<typename Tr::Request> no_earlier_reads;
  detail::ring_allgather_steps(transport, ring, data, call, sends, no_earlier_reads);
}

// input: count elements of `element_bytes` bytes; output: count * p elements, rank i's block at
// i * count.
template <Transport Tr>
void ring_allgather(Tr& transport, const std::byte* input, std::byte* output, std::size_t count,
                    std::size_t element_bytes, const MessageHeader& call,
                    const AlgorithmTuning& tuning) {
  const int p = transport.size();
  const std::size_t block_bytes = count * element_bytes;
  detail::copy_bytes(output + block_bytes * static_cast<std::size_t>(transport.rank()), input,
                     block_bytes);
  if (p == 1) return;
  const detail::RingLayout ring(p, transport.rank(), count * static_cast<std::size_t>(p),
                                element_bytes, tuning);
  ring_allgather_segments(transport, ring, output, call);
}

// allgatherv: rank i's `block_bytes[i]` bytes land at output + offsets[i] on every rank. Block
// rank - s travels one link per step s, whole (not chunked: blocks differ in size); each message's
// header counts that block's elements, so the ranks' counts are checked pairwise.
template <Transport Tr>
void ring_allgatherv(Tr& transport, const std::byte* input, std::byte* output,
                     std::span<const std::size_t> block_bytes, std::span<const std::size_t> offsets,
                     std::size_t element_bytes, const MessageHeader& call) {
  const int p = transport.size();
  const int rank = transport.rank();
  const auto at = [](int i) { return static_cast<std::size_t>(i); };
  detail::copy_bytes(output + offsets[at(rank)], input, block_bytes[at(rank)]);
  const auto header = [&](int block) {
    MessageHeader h = detail::message(call, block_bytes[at(block)]);
    h.count = block_bytes[at(block)] / element_bytes;
    return h;
  };
  const int right = (rank + 1) % p;
  const int left = (rank - 1 + p) % p;
  for (int step = 0; step + 1 < p; ++step) {
    const int sent = detail::modulo(rank - step, p);
    const int received = detail::modulo(rank - step - 1, p);
    std::array<typename Tr::Request, 2> requests{
        transport.irecv(
            left, header(received),
            std::span<std::byte>(output + offsets[at(received)], block_bytes[at(received)])),
        transport.isend(
            right, header(sent),
            std::span<const std::byte>(output + offsets[at(sent)], block_bytes[at(sent)]))};
    wait_all(transport, std::span(requests));
  }
}

// A pipelined chain from the root: rank root+v receives each chunk from root+v-1 and forwards it to
// root+v+1 at once.
template <Transport Tr>
void ring_broadcast(Tr& transport, std::byte* data, std::size_t count, std::size_t element_bytes,
                    int root, const MessageHeader& call, const AlgorithmTuning& tuning) {
  const int p = transport.size();
  if (p == 1) return;
  const int v = detail::modulo(transport.rank() - root, p);
  const int previous = detail::modulo(transport.rank() - 1, p);
  const int next = (transport.rank() + 1) % p;
  const detail::ChunkedRange whole({0, count * element_bytes}, element_bytes, tuning);
  const std::size_t chunks = whole.chunks();

  std::vector<typename Tr::Request> receives;
  if (v > 0) {
    for (std::size_t j = 0; j < chunks; ++j) {
      const detail::ByteRange range = whole.chunk(j);
      receives.push_back(transport.irecv(previous, detail::message(call, range.size),
                                         detail::writable_bytes_of(data, range)));
    }
  }
  std::vector<typename Tr::Request> sends;
  for (std::size_t j = 0; j < chunks; ++j) {
    if (v > 0) transport.wait(receives[j]);
    if (v < p - 1) {
      const detail::ByteRange range = whole.chunk(j);
      sends.push_back(
          transport.isend(next, detail::message(call, range.size), detail::bytes_of(data, range)));
    }
  }
  // The chain's end closes it with an empty message to the root. Every rank then receives from
  // its left neighbour whichever root it takes, so ranks that disagree on the root read each
  // other's headers (a MismatchError naming both roots) instead of finishing silently.
  const MessageHeader closing = detail::message(call, 0);
  if (v == p - 1) sends.push_back(transport.isend(next, closing, {}));
  if (v == 0) {
    auto closed = transport.irecv(previous, closing, {});
    transport.wait(closed);
  }
  wait_all(transport, std::span(sends));
}

// A pipelined chain to the root: rank root+p-1 starts, every rank adds its input to each chunk and
// passes it on toward the root. output is written on the root only; `scratch` holds the partial
// results elsewhere.
template <Transport Tr>
void ring_reduce(Tr& transport, const std::byte* input, std::byte* output, std::size_t count,
                 int root, const ElementReduction& reduction, const MessageHeader& call,
                 const AlgorithmTuning& tuning, AlgorithmScratch& scratch) {
  const int p = transport.size();
  const int r = transport.rank();
  const int v = detail::modulo(r - root, p);
  const std::size_t element_bytes = reduction.element_bytes();
  if (p == 1) {
    detail::copy_bytes(output, input, count * element_bytes);
    return;
  }
  const detail::ChunkedRange whole({0, count * element_bytes}, element_bytes, tuning);
  const std::size_t chunks = whole.chunks();
  const int toward_root = detail::modulo(r - 1, p);
  const int away_from_root = (r + 1) % p;

  std::vector<typename Tr::Request> sends;
  if (v == p - 1) {  // the chain's far end sends its input as it is
    for (std::size_t j = 0; j < chunks; ++j) {
      const detail::ByteRange range = whole.chunk(j);
      sends.push_back(transport.isend(toward_root, detail::message(call, range.size),
                                      detail::bytes_of(input, range)));
    }
    wait_all(transport, std::span(sends));
    return;
  }
  std::byte* work = output;
  if (v != 0) work = detail::reserved_bytes(scratch.partial, count * element_bytes);
  detail::ReceivePipeline<Tr> receives(
      transport, away_from_root, call, chunks, whole.largest_chunk_bytes(),
      [&whole](std::size_t j) { return whole.chunk(j); }, scratch.slots);
  for (std::size_t j = 0; j < chunks; ++j) {
    const detail::ByteRange range = whole.chunk(j);
    reduction.reduce(work + range.begin, input + range.begin, receives.wait(j), range.size);
    receives.release(j);
    if (v != 0) {
      sends.push_back(transport.isend(toward_root, detail::message(call, range.size),
                                      detail::bytes_of(work, range)));
    } else {
      reduction.finish(work + range.begin, range.size, p);
    }
  }
  wait_all(transport, std::span(sends));
}

}  // namespace coltrain::comm
