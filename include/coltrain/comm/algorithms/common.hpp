#pragma once
// What the algorithms share: how an array is cut into blocks and chunks by the tuning knobs, and
// byte ranges of buffers as a Transport moves them. The algorithms see bytes only: element counts
// and sizes decide where chunks are cut, an ElementReduction (reduce_kernels.hpp) reduces them.

#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/transport/transport.hpp>
#include <coltrain/comm/tuning/algorithm_tuning.hpp>
#include <coltrain/core/config.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

namespace coltrain::comm {

// Buffers the host algorithms reuse from call to call (one set per communicator, whose calls run
// one at a time), so that a call neither allocates nor zeroes memory: allocating its receive slots
// on every call cost a ring allreduce of 128 KiB 13-19% of its time (2 ranks, MPI and TCP).
//   partial: partial results;
//   slots:   what is received before it is reduced (chunks; rank order's small inputs whole).
struct AlgorithmScratch {
  std::vector<std::byte> partial;
  std::vector<std::byte> slots;
};

namespace detail {

// `count` elements cut into `parts` contiguous blocks whose sizes differ by at most one.
class Blocks {
 public:
  Blocks(std::size_t count, std::size_t parts)
      : base_(count / parts), extra_(count % parts), parts_(parts) {}

  std::size_t begin(std::size_t i) const { return i * base_ + std::min(i, extra_); }
  std::size_t size(std::size_t i) const { return base_ + (i < extra_ ? 1 : 0); }
  std::size_t parts() const { return parts_; }

 private:
  std::size_t base_;
  std::size_t extra_;
  std::size_t parts_;
};

// How many chunks each of the blocks of `blocks` (elements of `element_bytes` bytes) is cut into:
// the same number for every block, so that chunk j of any block is one pipeline unit; at least one,
// so empty blocks still carry a header.
inline std::size_t chunks_per_block(const Blocks& blocks, std::size_t element_bytes,
                                    const AlgorithmTuning& tuning) {
  const std::size_t largest_bytes = blocks.size(0) * element_bytes;
  const std::size_t floor_bytes = std::min(tuning.min_chunk_bytes, tuning.chunk_bytes);
  const std::size_t chunk_bytes =
      std::clamp(largest_bytes / std::max<std::size_t>(1, tuning.min_chunks_per_block), floor_bytes,
                 tuning.chunk_bytes);
  const std::size_t chunk_elements = std::max<std::size_t>(1, chunk_bytes / element_bytes);
  return std::max<std::size_t>(1, (blocks.size(0) + chunk_elements - 1) / chunk_elements);
}

// An element range [begin, begin + size).
struct Range {
  std::size_t begin = 0;
  std::size_t size = 0;
};

// Chunk `j` of block `i`, both cut as evenly as Blocks does.
inline Range chunk_of(const Blocks& blocks, std::size_t i, std::size_t chunks, std::size_t j) {
  const Blocks pieces(blocks.size(i), chunks);
  return {blocks.begin(i) + pieces.begin(j), pieces.size(j)};
}

// A byte range [begin, begin + size) of a buffer, always whole elements: what the host algorithms
// send, receive and reduce.
struct ByteRange {
  std::size_t begin = 0;
  std::size_t size = 0;
};

inline ByteRange to_bytes(Range elements, std::size_t element_bytes) {
  return {elements.begin * element_bytes, elements.size * element_bytes};
}

inline std::span<const std::byte> bytes_of(const std::byte* data, ByteRange range) {
  return {data + range.begin, range.size};
}

inline std::span<std::byte> writable_bytes_of(std::byte* data, ByteRange range) {
  return {data + range.begin, range.size};
}

// The header of one message of the call `call` carrying `bytes` bytes.
inline MessageHeader message(const MessageHeader& call, std::size_t bytes) {
  MessageHeader header = call;
  header.bytes = bytes;
  return header;
}

// A byte range cut into chunks by its own size, as chunks_per_block cuts one block: the two ends of
// a transfer know the same range, so they cut it alike.
class ChunkedRange {
 public:
  ChunkedRange(ByteRange range, std::size_t element_bytes, const AlgorithmTuning& tuning)
      : begin_(range.begin),
        element_bytes_(element_bytes),
        elements_(range.size / element_bytes, 1),
        chunks_(chunks_per_block(elements_, element_bytes, tuning)) {}

  std::size_t chunks() const { return chunks_; }
  ByteRange chunk(std::size_t j) const {
    const ByteRange piece = to_bytes(chunk_of(elements_, 0, chunks_, j), element_bytes_);
    return {begin_ + piece.begin, piece.size};
  }
  std::size_t largest_chunk_bytes() const {
    return (elements_.size(0) + chunks_ - 1) / chunks_ * element_bytes_;
  }

 private:
  std::size_t begin_;
  std::size_t element_bytes_;
  Blocks elements_;
  std::size_t chunks_;
};

inline void copy_bytes(std::byte* destination, const std::byte* source, std::size_t bytes) {
  if (destination != source && bytes != 0) std::memcpy(destination, source, bytes);
}

}  // namespace detail
}  // namespace coltrain::comm

namespace coltrain::comm::detail {

// The first `bytes` bytes of `buffer`, which grows to hold them and never shrinks: a buffer
// reused from call to call is allocated (and zeroed) once, not on every call.
inline std::byte* reserved_bytes(std::vector<std::byte>& buffer, std::size_t bytes) {
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

// Receives a numbered stream of chunks from one peer into a small ring of buffers, keeping the next
// kSlots receives posted so that data keeps arriving while the caller reduces the current chunk.
template <Transport Tr>
class ReceivePipeline {
 public:
  static constexpr std::size_t kSlots = 4;

  // `range_of(u)` is the byte range of unit u; every unit fits in `slot_bytes`. The slots live in
  // `slots` (AlgorithmScratch::slots), which no other pipeline may use while this one runs.
  template <class RangeOf>
  ReceivePipeline(Tr& transport, int peer, const MessageHeader& call, std::size_t units,
                  std::size_t slot_bytes, RangeOf range_of, std::vector<std::byte>& slots)
      : transport_(transport),
        peer_(peer),
        call_(call),
        units_(units),
        slot_bytes_(slot_bytes),
        buffer_(reserved_bytes(slots, std::min(kSlots, units) * slot_bytes)),
        range_of_(range_of) {
    for (std::size_t u = 0; u < std::min(kSlots, units_); ++u) post(u);
  }

  // Waits for unit u (units are taken in order) and returns its data, valid until release(u).
  const std::byte* wait(std::size_t u) {
    transport_.wait(requests_[u % kSlots]);
    return slot(u);
  }

  // The caller is done with unit u's data: its buffer receives unit u + kSlots.
  void release(std::size_t u) {
    if (u + kSlots < units_) post(u + kSlots);
  }

 private:
  std::byte* slot(std::size_t u) { return buffer_ + (u % kSlots) * slot_bytes_; }

  void post(std::size_t u) {
    const std::size_t bytes = range_of_(u).size;
    requests_[u % kSlots] = transport_.irecv(peer_, message(call_, bytes),
                                             writable_bytes_of(slot(u), ByteRange{0, bytes}));
  }

  Tr& transport_;
  int peer_;
  MessageHeader call_;
  std::size_t units_;
  std::size_t slot_bytes_;
  std::byte* buffer_;
  std::function<ByteRange(std::size_t)> range_of_;
  typename Tr::Request requests_[kSlots]{};
};

inline int modulo(long long value, int divisor) {
  const long long m = value % divisor;
  return static_cast<int>(m < 0 ? m + divisor : m);
}

}  // namespace coltrain::comm::detail
