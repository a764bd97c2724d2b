#pragma once
// The vocabulary of coltrain's collectives: which collective, which reduction, which algorithm,
// which backend, which memory. Each enum has a name for messages and a parser for command lines
// and environment variables.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace coltrain::comm {

enum class Collective : std::uint8_t {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kReduce,
  kBarrier,
  kAlltoall,
  kGather,
  kScatter,
  kAllgatherv,
  kAlltoallv,
  kSendRecv,  // a point-to-point message (Communicator::send/recv), not a collective
};

enum class ReduceOp : std::uint8_t {
  kSum,
  kProd,
  kMin,
  kMax,
  kAvg,  // sum, then divided by the number of ranks (integers: truncated, as NCCL does)
};

// How a collective is carried out. The trade-offs, with p ranks, n bytes, latency a, time per byte
// b and reduction time per byte g (docs/collectives.md derives them):
enum class Algorithm : std::uint8_t {
  kNative,           // the backend's own collective (MPI_Allreduce, ncclAllReduce); MPI and NCCL
  kRing,             // 2(p-1)a + 2(p-1)/p nb + (p-1)/p ng: bandwidth-optimal, latency grows with p
  kTree,             // pipelined double binary tree: about 2(lg p + k) a + 2nb, k chunks: mid sizes
  kHalvingDoubling,  // Rabenseifner: 2 lg(p) a + 2(p-1)/p nb + (p-1)/p ng; extra steps off 2^k
  kAutomatic,        // picks one of the above from the cost model (comm/tuning/cost_model.hpp)
  kPairwise,         // alltoall: p-1 exchanges, one block each: (p-1)a + (p-1)/p nb
  kBruck,            // alltoall: lg p exchanges of about half the blocks: lg(p) a + lg(p)/2 nb
  kHierarchical,     // allreduce over hosts of L ranks: reduce-scatter and allgather inside each
                     // host (shared memory), a ring across hosts on 1/L of the data each
  kRankOrder,        // allreduce, reduce_scatter, reduce with every element reduced in one fixed
                     // tree over the ranks in rank order: the same bits whatever the sizes and
                     // timing (deterministic mode)
};

// kNccl runs device buffers over NCCL and host buffers over the host backend that bootstrapped it.
enum class Backend : std::uint8_t { kMpi, kTcp, kNccl };

// Where a collective's buffers live: host memory (pageable or pinned) or CUDA device memory.
enum class Memory : std::uint8_t { kHost, kDevice };

// How an f32 allreduce travels (Horovod's Compression.fp16): as f32, or rounded to bf16 or f16 on
// the wire, half the bytes, and still reduced in f32 (algorithms/compressed_allreduce.hpp).
enum class WireCompression : std::uint8_t { kNone, kBFloat16, kFloat16 };

namespace detail {

template <class Enum, std::size_t N>
Enum parse_enum(std::string_view text,
                const std::array<std::pair<std::string_view, Enum>, N>& names,
                std::string_view what) {
  std::string valid;
  for (const auto& [name, value] : names) {
    if (text == name) return value;
    valid += valid.empty() ? "" : ", ";
    valid += name;
  }
  throw InvalidArgument("unknown " + std::string(what) + " '" + std::string(text) +
                        "' (expected one of: " + valid + ")");
}

template <class Enum, std::size_t N>
constexpr std::string_view enum_name(
    Enum value, const std::array<std::pair<std::string_view, Enum>, N>& names) {
  for (const auto& [name, candidate] : names) {
    if (candidate == value) return name;
  }
  return "invalid";
}

inline constexpr std::array<std::pair<std::string_view, Collective>, 12> kCollectiveNames{{
    {"allreduce", Collective::kAllreduce},
    {"broadcast", Collective::kBroadcast},
    {"allgather", Collective::kAllgather},
    {"reduce_scatter", Collective::kReduceScatter},
    {"reduce", Collective::kReduce},
    {"barrier", Collective::kBarrier},
    {"alltoall", Collective::kAlltoall},
    {"gather", Collective::kGather},
    {"scatter", Collective::kScatter},
    {"allgatherv", Collective::kAllgatherv},
    {"alltoallv", Collective::kAlltoallv},
    {"send_recv", Collective::kSendRecv},
}};

inline constexpr std::array<std::pair<std::string_view, ReduceOp>, 5> kReduceOpNames{{
    {"sum", ReduceOp::kSum},
    {"prod", ReduceOp::kProd},
    {"min", ReduceOp::kMin},
    {"max", ReduceOp::kMax},
    {"avg", ReduceOp::kAvg},
}};

inline constexpr std::array<std::pair<std::string_view, Algorithm>, 9> kAlgorithmNames{{
    {"native", Algorithm::kNative},
    {"ring", Algorithm::kRing},
    {"tree", Algorithm::kTree},
    {"halving_doubling", Algorithm::kHalvingDoubling},
    {"automatic", Algorithm::kAutomatic},
    {"pairwise", Algorithm::kPairwise},
    {"bruck", Algorithm::kBruck},
    {"hierarchical", Algorithm::kHierarchical},
    {"rank_order", Algorithm::kRankOrder},
}};

inline constexpr std::array<std::pair<std::string_view, Backend>, 3> kBackendNames{{
    {"mpi", Backend::kMpi},
    {"tcp", Backend::kTcp},
    {"nccl", Backend::kNccl},
}};

inline constexpr std::array<std::pair<std::string_view, Memory>, 2> kMemoryNames{{
    {"host", Memory::kHost},
    {"device", Memory::kDevice},
}};

inline constexpr std::array<std::pair<std::string_view, WireCompression>, 3> kCompressionNames{{
    {"none", WireCompression::kNone},
    {"bf16", WireCompression::kBFloat16},
    {"fp16", WireCompression::kFloat16},
}};

}  // namespace detail

constexpr std::string_view name_of(Collective c) {
  return detail::enum_name(c, detail::kCollectiveNames);
}
constexpr std::string_view name_of(ReduceOp op) {
  return detail::enum_name(op, detail::kReduceOpNames);
}
constexpr std::string_view name_of(Algorithm a) {
  return detail::enum_name(a, detail::kAlgorithmNames);
}
constexpr std::string_view name_of(Backend b) {
  return detail::enum_name(b, detail::kBackendNames);
}
constexpr std::string_view name_of(Memory m) { return detail::enum_name(m, detail::kMemoryNames); }
constexpr std::string_view name_of(WireCompression c) {
  return detail::enum_name(c, detail::kCompressionNames);
}

inline Collective parse_collective(std::string_view text) {
  return detail::parse_enum(text, detail::kCollectiveNames, "collective");
}
inline ReduceOp parse_reduce_op(std::string_view text) {
  return detail::parse_enum(text, detail::kReduceOpNames, "reduction op");
}
inline Algorithm parse_algorithm(std::string_view text) {
  return detail::parse_enum(text, detail::kAlgorithmNames, "algorithm");
}
inline Backend parse_backend(std::string_view text) {
  return detail::parse_enum(text, detail::kBackendNames, "backend");
}
inline Memory parse_memory(std::string_view text) {
  return detail::parse_enum(text, detail::kMemoryNames, "memory");
}
inline WireCompression parse_wire_compression(std::string_view text) {
  return detail::parse_enum(text, detail::kCompressionNames, "wire compression");
}

}  // namespace coltrain::comm
