#pragma once
// PeerChannel: the TCP transport's state for one peer and what can be done to it alone, as Gloo
// keeps a pair apart from its event loop: the connection (a socket, or a shared-memory stream for
// a peer on this host), the FIFOs of posted sends and receives with their tickets, the gathered
// write of queued sends, the inbox that holds a header until its receive is known, and the
// messages read ahead of their receives (parked, and send/recv messages matched by tag). The
// progress engine that decides which channel to move, and the failure handling, stay in
// tcp_transport.hpp.

#include <coltrain/comm/protocol/failure_notice.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/rendezvous/memory_limit.hpp>
#include <coltrain/comm/transport/shm/shm_channel.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/core/host_memory.hpp>

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace coltrain::comm::detail {

// One sendmsg() gathers queued messages until it holds this many bytes, or the iovecs run out:
// small messages share a system call (13x the message rate of one call each), while a large one
// goes alone, so that this rank turns to its receives before the peer's sends stall on a full
// buffer (64 MB ring allreduce, 2 ranks on loopback: 1.8 GB/s bus bandwidth, against 1.5-1.6 when
// all queued 1 MB chunks went out in one call).
inline constexpr std::size_t kGatherBytes = 64 << 10;
inline constexpr std::size_t kMaxSendIovecs = 64;
// Receive staging: holds a header and the bytes that come with it in the same read; a small message
// fits whole, of a large one only this much is copied.
inline constexpr std::size_t kInboxBytes = 16 << 10;
static_assert(kInboxBytes <= kMemoryPerPeerBytes, "the memory check counts each peer's inbox");

inline constexpr std::size_t kHeaderBytes = sizeof(MessageHeader);

struct PendingSend {
  MessageHeader header;
  std::span<const std::byte> payload;
  std::size_t sent = 0;       // of header and payload together
  bool by_reference = false;  // the payload may go by single copy (decided once, when posted)

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

// An operation that made no progress: its call, and what it waits for, in words.
struct StalledOperation {
  MessageHeader header;
  std::string what;
};

// Whether single copy pays for `payload` of `header`'s call (CommOptions::single_copy_where_it_pays
// says where and why): in allreduce, reduce_scatter and allgather(v) for calls whose size lies in
// `exchanges` (payloads on huge pages) or `exchanges_on_small_pages` (elsewhere); never in
// broadcast, reduce and the tree allreduce; in the others on huge pages.
inline bool single_copy_pays(const MessageHeader& header, std::span<const std::byte> payload,
                             const CallSizeRange& exchanges,
                             const CallSizeRange& exchanges_on_small_pages) {
  switch (header.collective) {
    case Collective::kBroadcast:
    case Collective::kReduce:
      return false;
    case Collective::kAllreduce:
      if (header.algorithm == Algorithm::kTree) return false;
      [[fallthrough]];
    case Collective::kReduceScatter:
    case Collective::kAllgather:
    case Collective::kAllgatherv:
      return (on_huge_pages(payload.data(), payload.size()) ? exchanges : exchanges_on_small_pages)
          .contains(header.count * size_of(header.dtype));
    default:
      return on_huge_pages(payload.data(), payload.size());
  }
}

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
  ssize_t write(iovec* iov, std::size_t count, std::uint64_t may_reference) {
    if (shm) return shm->send(iov, count, may_reference);
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

  // Writes what one gathered write takes of the queued sends (kGatherBytes, kMaxSendIovecs) and
  // completes those that went out whole; sets `progressed` if any send moved or completed.
  // Returns 0, or the errno of a write that failed (one that would block is not a failure).
  int write_queued(bool& progressed) {
    progressed = settle();
    if (sends.empty()) return 0;
    static_assert(kMaxSendIovecs <= 64, "one bit of may_reference per iovec");
    std::array<iovec, kMaxSendIovecs> iov;
    std::uint64_t may_reference = 0;
    std::size_t count = 0;
    std::size_t gathered = 0;
    for (auto it = sends.begin(); it != sends.end(); ++it) {
      if (count + 2 > iov.size() || gathered >= kGatherBytes) break;
      if (it->sent < kHeaderBytes) {
        iov[count++] = {reinterpret_cast<std::byte*>(&it->header) + it->sent,
                        kHeaderBytes - it->sent};
        gathered += kHeaderBytes - it->sent;
      }
      const std::size_t payload_sent = it->sent > kHeaderBytes ? it->sent - kHeaderBytes : 0;
      const std::size_t payload_left = it->payload.size() - payload_sent;
      if (payload_left > 0) {
        // (A payload by reference goes whole or waits for a free slot, never part through the
        // ring.)
        if (it->by_reference) {
          may_reference |= std::uint64_t{1} << count;
        } else {
          gathered += payload_left;
        }
        iov[count++] = {const_cast<std::byte*>(it->payload.data()) + payload_sent, payload_left};
      }
    }
    const ssize_t sent = write(iov.data(), count, may_reference);
    if (sent < 0) {
      const int error = errno;
      return error == EAGAIN || error == EWOULDBLOCK || error == EINTR ? 0 : error;
    }
    auto left = static_cast<std::size_t>(sent);
    while (left > 0) {
      PendingSend& front = sends.front();
      const std::size_t step = std::min(left, front.total() - front.sent);
      front.sent += step;
      left -= step;
      if (front.sent == front.total()) {
        if (shm) {  // complete once the peer has copied what it references
          unsettled.push_back({front.header, front.total(), shm->references_sent()});
        } else {
          ++sends_completed;
        }
        sends.pop_front();
      }
    }
    settle();
    progressed = true;
    return 0;
  }

  // A send/recv message's header was read from the inbox: it goes to a buffer of its own, with the
  // payload bytes the inbox already holds; the rest is read from the stream into it.
  void take_tagged(const MessageHeader& header) {
    ParkedMessage& message = tagged.emplace_back(ParkedMessage{header, {}, 0});
    message.payload.resize(header.bytes);
    fill_from_inbox(message);
  }

  // Hands each whole send/recv message to the first pending receive of its tag (per tag, messages
  // and receives pair in order); `rank` receives from `peer`. Returns whether any was handed over.
  bool match_tagged(int rank, int peer) {
    bool matched = false;
    for (auto message = tagged.begin(); message != tagged.end() && tagged_pending > 0;) {
      if (!message->complete()) break;  // the last one, still arriving
      const auto receive = std::find_if(tagged_receives.begin(), tagged_receives.end(),
                                        [&](const PendingTaggedReceive& r) {
                                          return !r.done && r.expected.root == message->header.root;
                                        });
      if (receive == tagged_receives.end()) {
        ++message;
        continue;
      }
      check_header(receive->expected, message->header, rank, peer);
      if (!message->payload.empty())
        std::memcpy(receive->payload.data(), message->payload.data(), message->payload.size());
      receive->done = true;
      --tagged_pending;
      message = tagged.erase(message);
      matched = true;
    }
    while (!tagged_receives.empty() && tagged_receives.front().done) {
      tagged_receives.pop_front();
      ++tagged_receives_begin;
    }
    return matched;
  }

  // Hands parked messages to the posted receives, in order: checks each header, copies the
  // payload; a parked message still arriving becomes the receive's, which reads the rest from the
  // stream. Returns whether any was handed over.
  bool serve_parked(int rank, int peer) {
    bool served = false;
    while (!parked.empty() && !receives.empty()) {
      ParkedMessage& message = parked.front();
      PendingReceive& receive = receives.front();
      check_header(receive.expected, message.header, rank, peer);
      // An empty message's buffers may be null, which memcpy must not get even for 0 bytes.
      if (message.received > 0)
        std::memcpy(receive.payload.data(), message.payload.data(), message.received);
      receive.header_checked = true;
      receive.received = message.received;
      served = true;
      const bool whole = message.complete();
      parked.pop_front();
      if (!whole) break;
      receives.pop_front();
      ++receives_completed;
    }
    return served;
  }

  void fill_from_inbox(ParkedMessage& message) {
    message.received += take_from_inbox(std::span(message.payload).subspan(message.received));
  }

  // Moves what the inbox holds, up to into.size() bytes, to the front of `into`; returns how many.
  std::size_t take_from_inbox(std::span<std::byte> into) {
    const std::size_t take = std::min(inbox_size(), into.size());
    if (take > 0) std::memcpy(into.data(), inbox.get() + inbox_begin, take);
    inbox_begin += take;
    return take;
  }

  // Whether the inbox starts with a failure notice (it holds at least a header's worth).
  bool starts_with_notice() const {
    std::uint32_t magic = 0;
    std::memcpy(&magic, inbox.get() + inbox_begin, sizeof magic);
    return magic == kNoticeMagic;
  }

  // Completes the sends whose bytes the peer has copied by reference. Returns whether any did.
  bool settle() {
    if (unsettled.empty()) return false;
    const std::uint64_t done = shm->references_done();
    bool settled = false;
    while (!unsettled.empty() && unsettled.front().reference <= done) {
      unsettled.pop_front();
      ++sends_completed;
      settled = true;
    }
    return settled;
  }

  // What the operation with `ticket` (a send, a receive, or a receive by tag) waits for on this
  // channel to `peer`, for a timeout's message: "to send allreduce #12 (...) to rank 3; 4096 of its
  // 65576 bytes went out (rank 3 is not receiving)".
  StalledOperation describe_stalled(int peer, std::uint64_t ticket, bool is_send,
                                    bool by_tag) const {
    const std::string name = "rank " + std::to_string(peer);
    StalledOperation stalled;
    MessageHeader& header = stalled.header;
    std::string& what = stalled.what;
    if (by_tag) {
      header = tagged_receives[ticket - tagged_receives_begin].expected;
      what = "to receive " + describe_call(header) + " from " + name +
             "; no message with its tag has arrived (" + name +
             " has not sent it, or sent a collective's message first)";
      return stalled;
    }
    if (is_send) {
      const auto index = static_cast<std::size_t>(ticket - sends_completed);
      if (index < unsettled.size()) {
        const HandedOverSend& op = unsettled[index];
        header = op.header;
        what = "to send " + describe_call(header) + " to " + name + "; all " +
               std::to_string(op.bytes) + " of its bytes were handed over, and " + name +
               " has not copied them from this process's memory (it is not receiving)";
      } else {
        const PendingSend& op = sends[index - unsettled.size()];
        header = op.header;
        what = "to send " + describe_call(header) + " to " + name + "; " + std::to_string(op.sent) +
               " of its " + std::to_string(op.total()) + " bytes went out (" + name +
               " is not receiving)";
      }
    } else {
      const PendingReceive& op = receives[static_cast<std::size_t>(ticket - receives_completed)];
      header = op.expected;
      what = "to receive " + describe_call(header) + " from " + name + "; " +
             (op.header_checked ? std::to_string(op.received) + " of its " +
                                      std::to_string(op.payload.size()) + " payload bytes arrived"
                                : std::string("its header has not arrived"));
    }
    if (ticket > (is_send ? sends_completed : receives_completed))
      what += ", behind earlier messages that have not gone through either";
    return stalled;
  }

  // Moves what the inbox holds (a partial header, or a notice's start) to its front, to make room.
  void compact_inbox() {
    if (inbox_begin == 0) return;
    std::memmove(inbox.get(), inbox.get() + inbox_begin, inbox_size());
    inbox_end -= inbox_begin;
    inbox_begin = 0;
  }
};

}  // namespace coltrain::comm::detail
