#pragma once
// PeerChannel: the TCP transport's state for one peer (tcp_transport.hpp): the connection (a
// socket, or a shared-memory stream for a peer on this host), the FIFOs of posted sends and
// receives with their tickets, the inbox that holds a header until its receive is known, and the
// messages read ahead of their receives (parked, and send/recv messages matched by tag).

#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/transport/shm/shm_channel.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <vector>

namespace coltrain::comm::detail {

// Receive staging: holds a header and the bytes that come with it in the same read; a small message
// fits whole, of a large one only this much is copied.
inline constexpr std::size_t kInboxBytes = 16 << 10;

inline constexpr std::size_t kHeaderBytes = sizeof(MessageHeader);

struct PendingSend {
  MessageHeader header;
  std::span<const std::byte> payload;
  std::size_t sent = 0;  // of header and payload together

  std::size_t total() const { return kHeaderBytes + payload.size(); }
};

// A send whose bytes are all handed over to a shared-memory stream, some of them by reference: its
// caller's buffer is in use until the peer has copied reference `reference`.
struct HandedOverSend {
  MessageHeader header;
  std::size_t bytes = 0;  // of header and payload together
  std::uint64_t reference = 0;
};

struct PendingReceive {
  MessageHeader expected;
  std::span<std::byte> payload;
  bool header_checked = false;
  std::size_t received = 0;  // payload bytes in place
};

// A posted receive of a send/recv message: matched by tag (expected.root) in arrival order.
struct PendingTaggedReceive {
  MessageHeader expected;
  std::span<std::byte> payload;
  bool done = false;
};

// A message read ahead of its receive while this rank looked for notices behind it (a rank that
// has waited a while parks what blocks its streams, so that a notice can reach it).
struct ParkedMessage {
  MessageHeader header;
  std::vector<std::byte> payload;
  std::size_t received = 0;  // payload bytes read so far

  bool complete() const { return received == payload.size(); }
};

// One peer's connection and its queues. Tickets count posted and completed operations per
// direction; ticket t is complete once t < completed.
struct PeerChannel {
  FileDescriptor socket;
  // A peer on this host: the stream's bytes go through shared memory, and the socket carries
  // doorbells and the end of the stream (comm/transport/shm/shm_channel.hpp).
  std::unique_ptr<ShmStream> shm;
  std::deque<PendingSend> sends;
  std::deque<HandedOverSend> unsettled;  // after `sends`: handed over, not yet complete
  std::deque<PendingReceive> receives;
  std::uint64_t sends_posted = 0;
  std::uint64_t sends_completed = 0;
  std::uint64_t receives_posted = 0;
  std::uint64_t receives_completed = 0;
  std::unique_ptr<std::byte[]> inbox;  // kInboxBytes, allocated with the first receive
  std::size_t inbox_begin = 0;
  std::size_t inbox_end = 0;
  bool active = false;  // listed in TcpTransport::active_
  bool gone = false;    // the peer closed the connection while nothing was awaited from it
  // A message header that no posted receive awaits yet sits in the inbox: the socket is left
  // alone (not polled for notices) until a receive is posted.
  bool data_waiting = false;
  std::deque<ParkedMessage> parked;  // read ahead; served before the inbox. Only while no receive
                                     // is posted: a posted receive takes them first
  std::deque<ParkedMessage> tagged;  // send/recv messages that arrived, in arrival order
  std::deque<PendingTaggedReceive> tagged_receives;  // in posting order; done ones leave the front
  std::uint64_t tagged_receives_begin = 0;           // the ticket of tagged_receives.front()
  std::size_t tagged_pending = 0;                    // posted and not done

  bool idle() const {
    return sends.empty() && unsettled.empty() && receives.empty() && tagged_pending == 0;
  }
  // The stream's next bytes into the iovecs, or what fits of the iovecs onto it, as recvmsg() and
  // sendmsg() on a non-blocking socket do: through shared memory for a peer on this host, else
  // through the socket.
  ssize_t read(iovec* iov, std::size_t count) {
    if (shm) return shm->receive(iov, count);
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = count;
    return ::recvmsg(socket.get(), &message, MSG_DONTWAIT);
  }
  ssize_t write(iovec* iov, std::size_t count) {
    if (shm) return shm->send(iov, count);
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = count;
    return ::sendmsg(socket.get(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  // The message being read into a buffer of its own (parked or tagged), if one is half read.
  ParkedMessage* arriving() {
    if (!tagged.empty() && !tagged.back().complete()) return &tagged.back();
    if (!parked.empty() && !parked.back().complete()) return &parked.back();
    return nullptr;
  }
  std::size_t inbox_size() const { return inbox_end - inbox_begin; }
  // Moves what the inbox holds (a partial header, or a notice's start) to its front, to make room.
  void compact_inbox() {
    if (inbox_begin == 0) return;
    std::memmove(inbox.get(), inbox.get() + inbox_begin, inbox_size());
    inbox_end -= inbox_begin;
    inbox_begin = 0;
  }
};

}  // namespace coltrain::comm::detail
