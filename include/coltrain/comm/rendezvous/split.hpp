#pragma once
// Communicator::split's pieces: what every rank tells the others, who belongs to each new
// communicator, and (over TCP) the new communicator's own connections.
//
// Over TCP a new communicator gets connections of its own, made without a new rendezvous: each
// member opens a data listener on the address its existing connections use, the parent's
// allgather carries that address to the others, and the members connect as the first mesh did
// (tcp_rendezvous.hpp: the same hellos, nonce and, with a secret, the same proofs). Own
// connections rather than the parent's, as NCCL's ncclCommSplit does by default: a communicator
// used from another thread then has its own progress engine and its own flow control, so a large
// transfer on one never holds up, or interleaves with, the other's messages.

#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/tcp_rendezvous.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/log.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

namespace coltrain::comm::detail {

// One parent rank's part of a split, allgathered over the parent.
struct SplitEntry {
  std::int32_t color = -1;  // negative: in no new communicator
  std::int32_t key = 0;
  std::uint64_t nonce = 0;  // the new mesh's nonce, if this rank becomes its rank 0
  PeerAddress address{};    // this rank's listener for the new mesh (TCP only)
  std::uint32_t reserved = 0;
};
static_assert(sizeof(SplitEntry) == 48 && std::is_trivially_copyable_v<SplitEntry>);

// The parent ranks in `color`'s communicator, ordered by key, then by parent rank (as
// MPI_Comm_split orders them): index i is new rank i.
inline std::vector<int> split_members(std::span<const SplitEntry> entries, int color) {
  std::vector<int> members;
  for (std::size_t rank = 0; rank < entries.size(); ++rank) {
    if (entries[rank].color == color) members.push_back(static_cast<int>(rank));
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return entries[static_cast<std::size_t>(a)].key < entries[static_cast<std::size_t>(b)].key;
  });
  return members;
}

// Connects the members of a new TCP communicator to each other; returns one socket per new rank
// (empty at `new_rank`). `listener` is this rank's, announced in its entry.
inline std::vector<FileDescriptor> connect_split_mesh(std::span<const SplitEntry> entries,
                                                      const std::vector<int>& members, int new_rank,
                                                      const FileDescriptor& listener,
                                                      const CommOptions& options,
                                                      const ErrorContext& context) {
  const int size = static_cast<int>(members.size());
  if (size == 1) return std::vector<FileDescriptor>(1);
  AddressTable table{entries[static_cast<std::size_t>(members.front())].nonce, {}};
  for (int parent : members)
    table.entries.push_back(entries[static_cast<std::size_t>(parent)].address);
  const Logger logger(new_rank, size);
  return connect_full_mesh(new_rank, size, table, listener, hash_job_id(options.job_id), options,
                           logger, context);
}

}  // namespace coltrain::comm::detail
