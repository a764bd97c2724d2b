#pragma once
// The header every coltrain message carries. It names the collective call the message belongs to,
// so a rank whose peers called a different collective, count, dtype, op, root or algorithm gets an
// error naming both ranks and both values instead of a hang or silently corrupted data.

#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

namespace coltrain::comm {

// "CTRN" in little-endian byte order; a message that does not start with it is not ours.
inline constexpr std::uint32_t kMessageMagic = 0x4e525443u;

// Sent as raw bytes in host byte order: a job's ranks share one architecture.
struct MessageHeader {
  std::uint32_t magic = kMessageMagic;
  Collective collective = Collective::kAllreduce;
  Algorithm algorithm = Algorithm::kRing;
  DataType dtype = DataType::kFloat32;  // the caller's element type (f16/bf16 travel as f32)
  ReduceOp op = ReduceOp::kSum;
  std::int32_t root = 0;                                 // the root rank; a send/recv message's tag
  WireCompression compression = WireCompression::kNone;  // what an f32 allreduce travels as
  std::array<std::uint8_t, 3> reserved{};
  std::uint64_t sequence = 0;  // the collective's number on its communicator, from 0;
                               // a send/recv's number between its two ranks with its tag
  std::uint64_t count = 0;     // the element count the caller passed
  std::uint64_t bytes = 0;     // payload bytes that follow this header
};
static_assert(sizeof(MessageHeader) == 40 && std::is_trivially_copyable_v<MessageHeader>);

namespace detail {

inline std::string describe_call(const MessageHeader& h) {
  std::string text(name_of(h.collective));
  if (h.collective == Collective::kSendRecv) {  // root carries the tag; no algorithm
    return text + " #" + std::to_string(h.sequence) + " (tag " + std::to_string(h.root) + ", " +
           std::string(name_of(h.dtype)) + ", count " + std::to_string(h.count) + ")";
  }
  text += " #" + std::to_string(h.sequence) + " (" + std::string(name_of(h.algorithm)) + ", " +
          std::string(name_of(h.dtype)) + ", count " + std::to_string(h.count);
  if (h.collective == Collective::kAllreduce || h.collective == Collective::kReduce ||
      h.collective == Collective::kReduceScatter) {
    text += ", op " + std::string(name_of(h.op));
  }
  if (h.compression != WireCompression::kNone)
    text += ", wire " + std::string(name_of(h.compression));
  if (h.collective == Collective::kBroadcast || h.collective == Collective::kReduce ||
      h.collective == Collective::kGather || h.collective == Collective::kScatter) {
    text += ", root " + std::to_string(h.root);
  }
  return text + ")";
}

}  // namespace detail

// Throws MismatchError unless `received` (from `peer`) belongs to the same call as `expected` (this
// rank's). The message names the first field that differs, both ranks and both values.
inline void check_header(const MessageHeader& expected, const MessageHeader& received, int rank,
                         int peer) {
  ErrorContext context;
  context.rank = rank;
  context.peer = peer;
  context.operation = std::string(name_of(expected.collective));
  context.sequence = expected.sequence;
  if (received.magic != kMessageMagic) {
    throw MismatchError("message from rank " + std::to_string(peer) +
                            " does not start with coltrain's magic number: not a coltrain peer, or "
                            "the stream lost its framing",
                        context);
  }
  auto differ = [&](const char* field, const std::string& mine, const std::string& theirs) {
    throw MismatchError(
        std::string(field) + " differs between ranks: rank " + std::to_string(rank) + " has " +
            mine + ", rank " + std::to_string(peer) + " has " + theirs + "; rank " +
            std::to_string(rank) + " called " + detail::describe_call(expected) + ", rank " +
            std::to_string(peer) + " called " + detail::describe_call(received),
        context);
  };
  if (received.sequence != expected.sequence) {
    differ("collective sequence number", std::to_string(expected.sequence),
           std::to_string(received.sequence));
  }
  if (received.collective != expected.collective) {
    differ("collective", std::string(name_of(expected.collective)),
           std::string(name_of(received.collective)));
  }
  if (received.count != expected.count) {
    differ("count", std::to_string(expected.count), std::to_string(received.count));
  }
  if (received.dtype != expected.dtype) {
    differ("dtype", std::string(name_of(expected.dtype)), std::string(name_of(received.dtype)));
  }
  if (received.op != expected.op) {
    differ("reduction op", std::string(name_of(expected.op)), std::string(name_of(received.op)));
  }
  if (received.root != expected.root) {
    differ(expected.collective == Collective::kSendRecv ? "tag" : "root",
           std::to_string(expected.root), std::to_string(received.root));
  }
  if (received.compression != expected.compression) {
    differ("wire compression", std::string(name_of(expected.compression)),
           std::string(name_of(received.compression)));
  }
  if (received.algorithm != expected.algorithm) {
    differ("algorithm", std::string(name_of(expected.algorithm)),
           std::string(name_of(received.algorithm)));
  }
  if (received.bytes != expected.bytes) {
    differ("message size in bytes", std::to_string(expected.bytes), std::to_string(received.bytes));
  }
}

// Throws MismatchError unless `theirs` (the call `peer` is in, as it told this rank) is the call
// `mine` describes, field by field as check_header compares messages. The payload size is left
// out: it belongs to one message of a call, not to the call.
inline void check_same_call(const MessageHeader& mine, MessageHeader theirs, int rank, int peer) {
  theirs.bytes = mine.bytes;
  check_header(mine, theirs, rank, peer);
}

}  // namespace coltrain::comm
