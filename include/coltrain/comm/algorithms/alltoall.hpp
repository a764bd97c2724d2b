#pragma once
// Alltoall: rank i's block j goes to rank j, as block i of its output. Two algorithms:
// - pairwise exchange: at step s (1 <= s < p) each rank sends its block for rank + s and receives
//   from rank - s, so every block travels once, straight to its rank: (p-1) a + (p-1)/p n b. The
//   choice for large blocks.
// - Bruck (1997): rotate the blocks so that block i is the one for rank + i, then at step k
//   (k = 1, 2, 4, ... < p) send every block whose index has bit k to rank + k, and rotate back:
//   lg p messages, each about half the blocks: lg(p) a + lg(p)/2 n b. The choice for small blocks,
//   where the message count dominates.
// Buffers are bytes: p blocks of `block_bytes` each (whole elements of the call's dtype).
// alltoallv (blocks of any size, anywhere in the buffers) runs the pairwise exchange.

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/transport/transport.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <vector>

namespace coltrain::comm {

template <Transport Tr>
void pairwise_alltoall(Tr& transport, const std::byte* input, std::byte* output,
                       std::size_t block_bytes, const MessageHeader& call) {
  const int p = transport.size();
  const int rank = transport.rank();
  const auto block = [&](int i) { return static_cast<std::size_t>(i) * block_bytes; };
  detail::copy_bytes(output + block(rank), input + block(rank), block_bytes);
  const MessageHeader header = detail::message(call, block_bytes);
  for (int step = 1; step < p; ++step) {
    const int to = (rank + step) % p;
    const int from = (rank - step + p) % p;
    std::array<typename Tr::Request, 2> requests{
        transport.irecv(from, header, std::span<std::byte>(output + block(from), block_bytes)),
        transport.isend(to, header, std::span<const std::byte>(input + block(to), block_bytes))};
    wait_all(transport, std::span(requests));
  }
}

// `scratch` holds the rotated blocks and one message each way, reused across calls: allocating
// (and faulting in) three fresh buffers per call cost more than the exchange itself.
template <Transport Tr>
void bruck_alltoall(Tr& transport, const std::byte* input, std::byte* output,
                    std::size_t block_bytes, const MessageHeader& call,
                    std::vector<std::byte>& scratch) {
  const int p = transport.size();
  const int rank = transport.rank();
  const auto block = [&](int i) { return static_cast<std::size_t>(i) * block_bytes; };
  if (scratch.size() < 3 * block(p)) scratch.resize(3 * block(p));
  std::byte* rotated = scratch.data();  // rotated[i] is the block for rank + i
  std::byte* outgoing = rotated + block(p);
  std::byte* incoming = outgoing + block(p);
  for (int i = 0; i < p; ++i)
    detail::copy_bytes(rotated + block(i), input + block((rank + i) % p), block_bytes);
  for (int k = 1; k < p; k <<= 1) {
    std::size_t packed = 0;
    for (int i = k; i < p; ++i) {
      if ((i & k) == 0) continue;
      detail::copy_bytes(outgoing + packed, rotated + block(i), block_bytes);
      packed += block_bytes;
    }
    const MessageHeader header = detail::message(call, packed);
    std::array<typename Tr::Request, 2> requests{
        transport.irecv((rank - k + p) % p, header, std::span<std::byte>(incoming, packed)),
        transport.isend((rank + k) % p, header, std::span<const std::byte>(outgoing, packed))};
    wait_all(transport, std::span(requests));
    std::size_t unpacked = 0;
    for (int i = k; i < p; ++i) {
      if ((i & k) == 0) continue;
      detail::copy_bytes(rotated + block(i), incoming + unpacked, block_bytes);
      unpacked += block_bytes;
    }
  }
  // rotated[i] now holds the block that rank - i sent to this rank.
  for (int i = 0; i < p; ++i)
    detail::copy_bytes(output + block((rank - i + p) % p), rotated + block(i), block_bytes);
}

// Blocks of any size: rank i sends send_bytes[j] bytes from input + send_offsets[j] to rank j,
// which receives recv_bytes[i] bytes at output + recv_offsets[i]. Each message's header counts its
// own elements, so a sender and a receiver that disagree on a block's count fail with
// MismatchError.
template <Transport Tr>
void pairwise_alltoallv(Tr& transport, const std::byte* input,
                        std::span<const std::size_t> send_bytes,
                        std::span<const std::size_t> send_offsets, std::byte* output,
                        std::span<const std::size_t> recv_bytes,
                        std::span<const std::size_t> recv_offsets, std::size_t element_bytes,
                        const MessageHeader& call) {
  const int p = transport.size();
  const int rank = transport.rank();
  const auto at = [](int i) { return static_cast<std::size_t>(i); };
  const auto header = [&](std::size_t bytes) {
    MessageHeader h = detail::message(call, bytes);
    h.count = bytes / element_bytes;
    return h;
  };
  // The communicator checked that this rank's block to itself has one size on both sides.
  detail::copy_bytes(output + recv_offsets[at(rank)], input + send_offsets[at(rank)],
                     send_bytes[at(rank)]);
  for (int step = 1; step < p; ++step) {
    const int to = (rank + step) % p;
    const int from = (rank - step + p) % p;
    std::array<typename Tr::Request, 2> requests{
        transport.irecv(
            from, header(recv_bytes[at(from)]),
            std::span<std::byte>(output + recv_offsets[at(from)], recv_bytes[at(from)])),
        transport.isend(
            to, header(send_bytes[at(to)]),
            std::span<const std::byte>(input + send_offsets[at(to)], send_bytes[at(to)]))};
    wait_all(transport, std::span(requests));
  }
}

}  // namespace coltrain::comm
