#pragma once
// Ring algorithms. Allreduce is a reduce-scatter followed by an allgather around the ring, each cut
// into p segments and every segment into chunks; a chunk is forwarded as soon as it is reduced (or
// received), so receiving, reducing and sending overlap. With p ranks and n bytes:
//   allreduce:      2(p-1) steps, each rank sends 2(p-1)/p n bytes, reduces (p-1)/p n bytes
//   reduce-scatter: p-1 steps, (p-1)/p of the input sent;  allgather: p-1 steps, (p-1)/p of the output
//   broadcast, reduce: a pipelined chain from or to the root: n bytes per link, p-1 + chunks steps
// Bandwidth-optimal; the latency term grows with p, so small messages prefer tree or
// halving-doubling.

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/reduce_kernels.hpp>
#include <coltrain/comm/transport.hpp>

#include <cstddef>
#include <vector>

namespace coltrain::comm {

// Reduce-scatter phase over `count` elements cut into p segments: afterwards work[segment r] holds
// the reduction over all ranks of their input[segment r], the other segments of work hold partial
// results. Step s sends segment r-1-s and receives segment r-2-s. `input` may equal `work`.
template <Transport Tr, ReducibleElement T>
void ring_reduce_scatter_phase(Tr& transport, const T* input, T* work, std::size_t count,
                               ReduceOp op, const MessageHeader& call,
                               const AlgorithmTuning& tuning) {
  const int p = transport.size();
  const int r = transport.rank();
  const detail::Blocks segments(count, static_cast<std::size_t>(p));
  const std::size_t chunks = detail::chunks_per_block<T>(segments, tuning);
  const std::size_t units = static_cast<std::size_t>(p - 1) * chunks;
  auto unit_range = [&](std::size_t u, int offset) {
    const int segment = detail::modulo(r - offset - static_cast<long long>(u / chunks), p);
    return detail::chunk_of(segments, static_cast<std::size_t>(segment), chunks, u % chunks);
  };
  auto sent_range = [&](std::size_t u) { return unit_range(u, 1); };
  auto received_range = [&](std::size_t u) { return unit_range(u, 2); };

  const int right = (r + 1) % p;
  const int left = (r + p - 1) % p;
  detail::ReceivePipeline<Tr, T> receives(transport, left, call, units,
                                          (segments.size(0) + chunks - 1) / chunks, received_range);
  std::vector<typename Tr::Request> sends;
  sends.reserve(units);
  auto post_send = [&](std::size_t u) {
    const detail::Range range = sent_range(u);
    const T* source = u < chunks ? input : work;  // step 0 sends this rank's own contribution
    sends.push_back(transport.isend(right, detail::message<T>(call, range.size),
                                    detail::bytes_of(source, range)));
  };
  for (std::size_t j = 0; j < chunks; ++j) post_send(j);
  for (std::size_t u = 0; u < units; ++u) {
    const T* received = receives.wait(u);
    const detail::Range range = received_range(u);
    reduce_into(work + range.begin, input + range.begin, received, range.size, op);
    receives.release(u);
    if (u + chunks < units) post_send(u + chunks);  // the chunk just reduced travels on next step
  }
  wait_all(transport, std::span(sends));
}

// Allgather phase: on entry data[segment r] holds this rank's block; afterwards every segment holds
// its owner's block. Step s sends segment r-s and receives segment r-s-1, straight into `data`.
template <Transport Tr, class T>
void ring_allgather_phase(Tr& transport, T* data, std::size_t count, const MessageHeader& call,
                          const AlgorithmTuning& tuning) {
  const int p = transport.size();
  const int r = transport.rank();
  const detail::Blocks segments(count, static_cast<std::size_t>(p));
  const std::size_t chunks = detail::chunks_per_block<T>(segments, tuning);
  const std::size_t units = static_cast<std::size_t>(p - 1) * chunks;
  auto unit_range = [&](std::size_t u, int offset) {
    const int segment = detail::modulo(r - offset - static_cast<long long>(u / chunks), p);
    return detail::chunk_of(segments, static_cast<std::size_t>(segment), chunks, u % chunks);
  };
  const int right = (r + 1) % p;
  const int left = (r + p - 1) % p;

  std::vector<typename Tr::Request> receives(units);
  for (std::size_t u = 0; u < units; ++u) {
    const detail::Range range = unit_range(u, 1);
    receives[u] = transport.irecv(left, detail::message<T>(call, range.size),
                                  detail::writable_bytes_of(data, range));
  }
  std::vector<typename Tr::Request> sends;
  sends.reserve(units);
  auto post_send = [&](std::size_t u) {
    const detail::Range range = unit_range(u, 0);
    sends.push_back(transport.isend(right, detail::message<T>(call, range.size),
                                    detail::bytes_of(data, range)));
  };
  for (std::size_t j = 0; j < chunks; ++j) post_send(j);
  for (std::size_t u = 0; u < units; ++u) {
    transport.wait(receives[u]);
    if (u + chunks < units) post_send(u + chunks);  // forward what just arrived
  }
  wait_all(transport, std::span(sends));
}

template <Transport Tr, ReducibleElement T>
void ring_allreduce(Tr& transport, const T* input, T* output, std::size_t count, ReduceOp op,
                    const MessageHeader& call, const AlgorithmTuning& tuning) {
  const int p = transport.size();
  if (p == 1) {
    detail::copy_elements(output, input, count);
    return;
  }
  ring_reduce_scatter_phase(transport, input, output, count, op, call, tuning);
  if (op == ReduceOp::kAvg) {
    const detail::Blocks segments(count, static_cast<std::size_t>(p));
    const auto mine = static_cast<std::size_t>(transport.rank());
    divide_by_ranks(output + segments.begin(mine), segments.size(mine), p);
  }
  ring_allgather_phase(transport, output, count, call, tuning);
}

// input: count * p elements; output: this rank's count elements of the reduction. `scratch` is reused
// across calls to hold the partial results.
template <Transport Tr, ReducibleElement T>
void ring_reduce_scatter(Tr& transport, const T* input, T* output, std::size_t count, ReduceOp op,
                         const MessageHeader& call, const AlgorithmTuning& tuning,
                         std::vector<T>& scratch) {
  const int p = transport.size();
  if (p == 1) {
    detail::copy_elements(output, input, count);
    return;
  }
  const std::size_t total = count * static_cast<std::size_t>(p);
  scratch.resize(total);
  ring_reduce_scatter_phase(transport, input, scratch.data(), total, op, call, tuning);
  detail::copy_elements(output, scratch.data() + count * static_cast<std::size_t>(transport.rank()),
                        count);
  if (op == ReduceOp::kAvg) divide_by_ranks(output, count, p);
}

// input: count elements; output: count * p elements, rank i's block at i * count.
template <Transport Tr, class T>
void ring_allgather(Tr& transport, const T* input, T* output, std::size_t count,
                    const MessageHeader& call, const AlgorithmTuning& tuning) {
  const std::size_t p = static_cast<std::size_t>(transport.size());
  detail::copy_elements(output + count * static_cast<std::size_t>(transport.rank()), input, count);
  if (p > 1) ring_allgather_phase(transport, output, count * p, call, tuning);
}

// A pipelined chain from the root: rank root+v receives each chunk from root+v-1 and forwards it to
// root+v+1 at once.
template <Transport Tr, class T>
void ring_broadcast(Tr& transport, T* data, std::size_t count, int root, const MessageHeader& call,
                    const AlgorithmTuning& tuning) {
  const int p = transport.size();
  if (p == 1) return;
  const int v = detail::modulo(transport.rank() - root, p);
  const int previous = detail::modulo(transport.rank() - 1, p);
  const int next = (transport.rank() + 1) % p;
  const detail::Blocks whole(count, 1);
  const std::size_t chunks = detail::chunks_per_block<T>(whole, tuning);
  const detail::Blocks pieces(count, chunks);

  std::vector<typename Tr::Request> receives;
  if (v > 0) {
    for (std::size_t j = 0; j < chunks; ++j) {
      const detail::Range range{pieces.begin(j), pieces.size(j)};
      receives.push_back(transport.irecv(previous, detail::message<T>(call, range.size),
                                         detail::writable_bytes_of(data, range)));
    }
  }
  std::vector<typename Tr::Request> sends;
  for (std::size_t j = 0; j < chunks; ++j) {
    if (v > 0) transport.wait(receives[j]);
    if (v < p - 1) {
      const detail::Range range{pieces.begin(j), pieces.size(j)};
      sends.push_back(transport.isend(next, detail::message<T>(call, range.size),
                                      detail::bytes_of(data, range)));
    }
  }
  wait_all(transport, std::span(sends));
}

// A pipelined chain to the root: rank root+p-1 starts, every rank adds its input to each chunk and
// passes it on toward the root. output is written on the root only; `scratch` holds the partial
// results elsewhere.
template <Transport Tr, ReducibleElement T>
void ring_reduce(Tr& transport, const T* input, T* output, std::size_t count, int root, ReduceOp op,
                 const MessageHeader& call, const AlgorithmTuning& tuning,
                 std::vector<T>& scratch) {
  const int p = transport.size();
  const int r = transport.rank();
  const int v = detail::modulo(r - root, p);
  if (p == 1) {
    detail::copy_elements(output, input, count);
    return;
  }
  const detail::Blocks whole(count, 1);
  const std::size_t chunks = detail::chunks_per_block<T>(whole, tuning);
  const detail::Blocks pieces(count, chunks);
  auto range_of = [&](std::size_t j) { return detail::Range{pieces.begin(j), pieces.size(j)}; };
  const int toward_root = detail::modulo(r - 1, p);
  const int away_from_root = (r + 1) % p;

  std::vector<typename Tr::Request> sends;
  if (v == p - 1) {  // the chain's far end sends its input as it is
    for (std::size_t j = 0; j < chunks; ++j) {
      sends.push_back(transport.isend(toward_root, detail::message<T>(call, pieces.size(j)),
                                      detail::bytes_of(input, range_of(j))));
    }
    wait_all(transport, std::span(sends));
    return;
  }
  T* work = output;
  if (v != 0) {
    scratch.resize(count);
    work = scratch.data();
  }
  detail::ReceivePipeline<Tr, T> receives(transport, away_from_root, call, chunks,
                                          pieces.size(0), range_of);
  for (std::size_t j = 0; j < chunks; ++j) {
    const detail::Range range = range_of(j);
    reduce_into(work + range.begin, input + range.begin, receives.wait(j), range.size, op);
    receives.release(j);
    if (v != 0) {
      sends.push_back(transport.isend(toward_root, detail::message<T>(call, range.size),
                                      detail::bytes_of(work, range)));
    } else if (op == ReduceOp::kAvg) {
      divide_by_ranks(work + range.begin, range.size, p);
    }
  }
  wait_all(transport, std::span(sends));
}

}  // namespace coltrain::comm
