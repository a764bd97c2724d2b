#pragma once
// Allreduce of f32 data that travels as bf16 or f16 (wire compression, as Horovod's
// Compression.fp16), still reduced in f32:
// 1. each rank rounds its input to the 16-bit format once, padded to p equal segments;
// 2. the segments go straight to their owners (a pairwise alltoall): rank j gets every rank's
//    segment j, widens them and reduces them in f32, in rank order;
// 3. each owner rounds its reduced segment once more, and an allgather around the ring brings
//    every segment to every rank, which widens them into its output.
// Every rank ends with the same values: the f32 reduction of the rounded inputs, rounded once. Half
// the bytes of an f32 ring allreduce, (p-1)/p n each way, in 2(p-1) messages as the ring; the cost
// is two roundings, and the f16 format's range (65504: scale gradients as mixed precision does).

#include <coltrain/comm/algorithms/alltoall.hpp>
#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/algorithms/ring.hpp>
#include <coltrain/comm/transport/transport.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace coltrain::comm {
namespace detail {

// Rounds `n` floats to the 16-bit wire format `F` (half or bfloat16), as raw 16-bit words.
template <class F>
void encode_wire(const float* from, std::uint16_t* to, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) to[i] = F(from[i]).bits();
}

template <class F>
void decode_wire(const std::uint16_t* from, float* to, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) to[i] = static_cast<float>(F::from_bits(from[i]));
}

template <class F, Transport Tr>
void compressed_allreduce_as(Tr& transport, const float* input, float* output, std::size_t count,
                             ReduceOp op, const MessageHeader& call, const AlgorithmTuning& tuning,
                             std::vector<std::byte>& scratch) {
  const int p = transport.size();
  const auto ranks = static_cast<std::size_t>(p);
  const std::size_t segment = (count + ranks - 1) / ranks;
  const std::size_t words = segment * ranks;
  const std::size_t wire_bytes = words * sizeof(std::uint16_t);
  const std::size_t float_bytes = 2 * segment * sizeof(float);
  if (scratch.size() < float_bytes + 3 * wire_bytes) scratch.resize(float_bytes + 3 * wire_bytes);
  // The floats first, where the allocation is aligned; the 16-bit words after them.
  auto* reduced = reinterpret_cast<float*>(scratch.data());
  float* widened = reduced + segment;
  auto* packed = reinterpret_cast<std::uint16_t*>(scratch.data() + float_bytes);
  auto* received = packed + words;
  auto* gathered = received + words;

  encode_wire<F>(input, packed, count);
  // No memset of nothing: with count 0 the scratch may be empty, its data() null.
  if (words > count) std::memset(packed + count, 0, (words - count) * sizeof(std::uint16_t));
  pairwise_alltoall(transport, reinterpret_cast<const std::byte*>(packed),
                    reinterpret_cast<std::byte*>(received), segment * sizeof(std::uint16_t), call);
  decode_wire<F>(received, reduced, segment);
  for (std::size_t from = 1; from < ranks; ++from) {
    decode_wire<F>(received + from * segment, widened, segment);
    reduce_into(reduced, reduced, widened, segment, op);
  }
  if (op == ReduceOp::kAvg) divide_by_ranks(reduced, segment, p);
  encode_wire<F>(reduced, received, segment);  // the alltoall's blocks are used up
  ring_allgather(transport, reinterpret_cast<const std::byte*>(received),
                 reinterpret_cast<std::byte*>(gathered), segment, sizeof(std::uint16_t), call,
                 tuning);
  decode_wire<F>(gathered, output, count);
}

}  // namespace detail

// `call.compression` says the wire format (bf16 or f16). `input` may equal `output`.
template <Transport Tr>
void compressed_allreduce(Tr& transport, const float* input, float* output, std::size_t count,
                          ReduceOp op, const MessageHeader& call, const AlgorithmTuning& tuning,
                          std::vector<std::byte>& scratch) {
  if (call.compression == WireCompression::kFloat16) {
    detail::compressed_allreduce_as<half>(transport, input, output, count, op, call, tuning,
                                          scratch);
  } else {
    detail::compressed_allreduce_as<bfloat16>(transport, input, output, count, op, call, tuning,
                                              scratch);
  }
}

}  // namespace coltrain::comm
