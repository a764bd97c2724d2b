#pragma once
// The point-to-point interface that coltrain's algorithms (ring, tree, halving-doubling) are
// written against, once, for every backend: MPI point-to-point (mpi_transport.hpp), our TCP
// transport (tcp_transport.hpp), and later NCCL send/recv.
//
// Contract:
// - isend(peer, header, payload) queues one message: the header, then header.bytes ==
//   payload.size() bytes. The payload must stay valid and unchanged until the request completes.
// - irecv(peer, expected, payload) receives the next message from `peer`. Its header must match
//   `expected` (check_header), or the wait that completes it throws MismatchError naming both ranks
//   and both calls; its payload lands in `payload`, whose size is expected.bytes.
// - Messages between two ranks arrive in the order they were posted, per direction; both sides of a
//   collective post in the same deterministic order, so messages match without tags.
// - Sends and receives progress together while any wait runs, so a rank may post a send to its
//   right and a receive from its left and wait on both without deadlock, at any message size.
// - wait(request) returns when that request is complete, or throws: TimeoutError when the
//   transport's timeout (COLTRAIN_TIMEOUT) passes with no progress, PeerLostError when a peer's
//   connection or process is gone, MismatchError as above. After a throw the transport is broken:
//   every later call throws, and peers see this rank leave instead of waiting for it.
// - Requests are cheap handles; waiting on a completed request returns at once.

#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/core/config.hpp>

#include <concepts>
#include <cstddef>
#include <span>

namespace coltrain::comm {

template <class T>
concept Transport = requires(T& transport, const T& const_transport, int peer,
                             const MessageHeader& header, std::span<const std::byte> send_payload,
                             std::span<std::byte> receive_payload, typename T::Request request) {
  { const_transport.rank() } -> std::same_as<int>;
  { const_transport.size() } -> std::same_as<int>;
  { transport.isend(peer, header, send_payload) } -> std::same_as<typename T::Request>;
  { transport.irecv(peer, header, receive_payload) } -> std::same_as<typename T::Request>;
  transport.wait(request);
};

// Waits for every request in `requests`.
template <Transport T>
void wait_all(T& transport, std::span<typename T::Request> requests) {
  for (auto& request : requests) transport.wait(request);
}

}  // namespace coltrain::comm
