#pragma once
// The collectives that move blocks without reducing them (alltoall(v), gather, scatter,
// allgatherv) and send/recv, written as the sends and receives each rank makes. A backend that
// runs point-to-point groups (NCCL: ncclSend/ncclRecv between ncclGroupStart and ncclGroupEnd)
// runs these; a rank's block for itself is a send to itself and a receive from itself.

#include <cstddef>
#include <span>
#include <vector>

namespace coltrain::comm {

struct PeerSend {
  int peer = 0;
  const void* data = nullptr;
  std::size_t bytes = 0;
};
struct PeerReceive {
  int peer = 0;
  void* data = nullptr;
  std::size_t bytes = 0;
};

struct PeerTransfers {
  std::vector<PeerSend> sends;
  std::vector<PeerReceive> receives;
};

namespace detail {

inline const void* byte_offset(const void* base, std::size_t offset) {
  return static_cast<const std::byte*>(base) + offset;
}
inline void* byte_offset(void* base, std::size_t offset) {
  return static_cast<std::byte*>(base) + offset;
}

}  // namespace detail

// alltoall(v): block j of the input (send_bytes[j] at send_offsets[j]) to rank j, and rank j's
// block for this rank into block j of the output. One entry per rank in each list.
inline PeerTransfers pairwise_transfers(const void* input, std::span<const std::size_t> send_bytes,
                                        std::span<const std::size_t> send_offsets, void* output,
                                        std::span<const std::size_t> receive_bytes,
                                        std::span<const std::size_t> receive_offsets) {
  PeerTransfers transfers;
  for (std::size_t j = 0; j < send_bytes.size(); ++j) {
    const int peer = static_cast<int>(j);
    transfers.sends.push_back({peer, detail::byte_offset(input, send_offsets[j]), send_bytes[j]});
    transfers.receives.push_back(
        {peer, detail::byte_offset(output, receive_offsets[j]), receive_bytes[j]});
  }
  return transfers;
}

// gather: every rank's input (block_bytes) to the root, which receives rank j's at block j.
inline PeerTransfers gather_transfers(int rank, int ranks, int root, const void* input,
                                      void* output, std::size_t block_bytes) {
  PeerTransfers transfers;
  transfers.sends.push_back({root, input, block_bytes});
  if (rank == root) {
    for (int j = 0; j < ranks; ++j) {
      transfers.receives.push_back(
          {j, detail::byte_offset(output, static_cast<std::size_t>(j) * block_bytes), block_bytes});
    }
  }
  return transfers;
}

// scatter: the root's block j (block_bytes) to rank j; every rank receives its block from the root.
inline PeerTransfers scatter_transfers(int rank, int ranks, int root, const void* input,
                                       void* output, std::size_t block_bytes) {
  PeerTransfers transfers;
  if (rank == root) {
    for (int j = 0; j < ranks; ++j) {
      transfers.sends.push_back(
          {j, detail::byte_offset(input, static_cast<std::size_t>(j) * block_bytes), block_bytes});
    }
  }
  transfers.receives.push_back({root, output, block_bytes});
  return transfers;
}

// allgatherv: this rank's input to every rank; rank j's (bytes[j]) into the output at offsets[j].
inline PeerTransfers allgatherv_transfers(const void* input, std::size_t input_bytes, void* output,
                                          std::span<const std::size_t> bytes,
                                          std::span<const std::size_t> offsets) {
  PeerTransfers transfers;
  for (std::size_t j = 0; j < bytes.size(); ++j) {
    const int peer = static_cast<int>(j);
    transfers.sends.push_back({peer, input, input_bytes});
    transfers.receives.push_back({peer, detail::byte_offset(output, offsets[j]), bytes[j]});
  }
  return transfers;
}

}  // namespace coltrain::comm
