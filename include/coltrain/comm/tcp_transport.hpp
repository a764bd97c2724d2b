#pragma once
// The Transport concept (transport.hpp) over TCP: one non-blocking socket per peer, set up by the
// rendezvous in tcp_rendezvous.hpp, and a progress engine that runs inside wait().
//
// Per peer there is a FIFO of posted sends and a FIFO of posted receives; requests are tickets in
// those FIFOs, so a Request is a few bytes and a completed one stays completed. wait() moves bytes
// for every peer with pending work until the awaited request is done:
// - Sends: one sendmsg() gathers headers and payloads straight from the callers' buffers: several
//   small messages at once, a large one alone; a partial write resumes where it stopped.
// - Receives: bytes are read into a small per-peer inbox until a whole header is there; the header
//   is checked against the oldest posted receive (check_header) before any payload lands in the
//   caller's buffer. The rest of the payload is then read straight into the caller's buffer, with
//   the inbox as a second iovec, so one recvmsg() finishes a payload and picks up the next header.
//   Small messages thus cost one read each, or less, and large ones are not copied.
// - Waiting: non-blocking attempts catch a reply that is about to arrive (a loopback round trip is
//   ~8 us when polled, ~100 us through a sleep and wake-up); after a while (spin_before_sleep) the
//   rank sleeps in poll(), so that ranks outnumbering cores do not starve each other.
// - Errors: a lost peer is a PeerLostError naming it, no progress for CommOptions::timeout is a
//   TimeoutError naming what was awaited from whom, a wrong header a MismatchError. Any error
//   breaks the transport: it shuts all its connections at once, so peers blocked on this rank fail
//   fast with PeerLostError instead of waiting out their timeouts, and every later call throws
//   CommError.

#include <coltrain/comm/message_header.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/socket.hpp>
#include <coltrain/comm/tcp_rendezvous.hpp>
#include <coltrain/comm/transport.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/log.hpp>
#include <coltrain/core/timer.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace coltrain::comm {

namespace detail {

// How long a waiting rank keeps making non-blocking attempts before it sleeps in poll(). Waking up
// costs up to milliseconds on a VM (a halted vCPU must be rescheduled), which halves the bandwidth
// of a pipelined ring, so a rank with a core of its own spins through the gaps between chunks.
// Ranks that outnumber the cores spin only a little longer than a loopback round trip, so that they
// do not starve each other.
inline constexpr auto kSpinWithOwnCore = std::chrono::microseconds(2000);
inline constexpr auto kSpinWhenSharingCores = std::chrono::microseconds(50);

inline std::chrono::microseconds spin_before_sleep(const LaunchEnv& env) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const auto local_ranks = static_cast<unsigned>(env.local_world_size.value_or(env.world_size));
  return local_ranks <= cores ? kSpinWithOwnCore : kSpinWhenSharingCores;
}

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

inline constexpr std::size_t kHeaderBytes = sizeof(MessageHeader);

struct PendingSend {
  MessageHeader header;
  std::span<const std::byte> payload;
  std::size_t sent = 0;  // of header and payload together

  std::size_t total() const { return kHeaderBytes + payload.size(); }
};

struct PendingReceive {
  MessageHeader expected;
  std::span<std::byte> payload;
  bool header_checked = false;
  std::size_t received = 0;  // payload bytes in place
};

// One peer's connection and its queues. Tickets count posted and completed operations per
// direction; ticket t is complete once t < completed.
struct PeerChannel {
  FileDescriptor socket;
  std::deque<PendingSend> sends;
  std::deque<PendingReceive> receives;
  std::uint64_t sends_posted = 0;
  std::uint64_t sends_completed = 0;
  std::uint64_t receives_posted = 0;
  std::uint64_t receives_completed = 0;
  std::unique_ptr<std::byte[]> inbox;  // kInboxBytes, allocated with the first receive
  std::size_t inbox_begin = 0;
  std::size_t inbox_end = 0;
  bool active = false;  // listed in TcpTransport::active_

  bool idle() const { return sends.empty() && receives.empty(); }
  std::size_t inbox_size() const { return inbox_end - inbox_begin; }
};

}  // namespace detail

class TcpTransport {
 public:
  // A posted operation: its peer, its direction, and its place in that peer's queue. A default
  // Request refers to nothing and is always complete.
  struct Request {
    int peer = -1;
    bool is_send = false;
    std::uint64_t ticket = 0;
  };

  // Runs the rendezvous for `env`'s rank (see tcp_rendezvous.hpp); returns once this rank is
  // connected to every other.
  TcpTransport(const LaunchEnv& env, const CommOptions& options)
      : TcpTransport(env, options, Logger(env.rank, env.world_size)) {}

  // As above, logging the rendezvous (strangers turned away, timings) through `logger`.
  TcpTransport(const LaunchEnv& env, const CommOptions& options, const Logger& logger)
      : options_(options),
        rank_(env.rank),
        size_(env.world_size),
        spin_before_sleep_(detail::spin_before_sleep(env)) {
    std::vector<detail::FileDescriptor> sockets = detail::bootstrap_tcp_mesh(env, options_, logger);
    peers_.resize(sockets.size());
    for (std::size_t peer = 0; peer < sockets.size(); ++peer) {
      peers_[peer].socket = std::move(sockets[peer]);
    }
  }

  // A moved-from transport may only be destroyed or assigned to.
  TcpTransport(TcpTransport&&) noexcept = default;
  TcpTransport& operator=(TcpTransport&&) noexcept = default;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;
  // Closing the sockets is the whole shutdown: data already written still reaches the peers.
  ~TcpTransport() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }

  Request isend(int peer, const MessageHeader& header, std::span<const std::byte> payload) {
    detail::PeerChannel& channel = post_check(peer, header, payload.size(), "isend");
    channel.sends.push_back({header, payload, 0});
    activate(peer);
    return {peer, true, channel.sends_posted++};
  }

  Request irecv(int peer, const MessageHeader& expected, std::span<std::byte> payload) {
    detail::PeerChannel& channel = post_check(peer, expected, payload.size(), "irecv");
    if (!channel.inbox) channel.inbox = std::make_unique<std::byte[]>(detail::kInboxBytes);
    channel.receives.push_back({expected, payload, false, 0});
    activate(peer);
    return {peer, false, channel.receives_posted++};
  }

  void wait(Request request) {
    throw_if_broken("wait");
    if (complete(request)) return;
    try {
      progress_until(request);
    } catch (const std::exception& e) {
      break_down(e);
      throw;
    }
  }

 private:
  using PeerChannel = detail::PeerChannel;

  ErrorContext context(int peer, const MessageHeader& header) const {
    ErrorContext result;
    result.rank = rank_;
    result.peer = peer;
    result.operation = std::string(name_of(header.collective));
    result.sequence = header.sequence;
    return result;
  }

  ErrorContext context(const char* operation) const {
    ErrorContext result;
    result.rank = rank_;
    result.operation = operation;
    return result;
  }

  void throw_if_broken(const char* call) const {
    if (broken_.empty()) return;
    throw CommError("communicator is unusable after an earlier error: " + broken_, context(call));
  }

  PeerChannel& post_check(int peer, const MessageHeader& header, std::size_t payload_bytes,
                          const char* call) {
    throw_if_broken(call);
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw InvalidArgument(std::string(call) + ": invalid peer " + std::to_string(peer) +
                                " for rank " + std::to_string(rank_) + " of " +
                                std::to_string(size_),
                            context(peer, header));
    }
    if (header.bytes != payload_bytes) {
      throw InvalidArgument(std::string(call) + ": header.bytes is " +
                                std::to_string(header.bytes) + " but the payload has " +
                                std::to_string(payload_bytes) + " bytes",
                            context(peer, header));
    }
    return peers_[static_cast<std::size_t>(peer)];
  }

  void activate(int peer) {
    PeerChannel& channel = peers_[static_cast<std::size_t>(peer)];
    if (channel.active) return;
    channel.active = true;
    active_.push_back(peer);
  }

  bool complete(const Request& request) const {
    if (request.peer < 0) return true;
    const PeerChannel& channel = peers_[static_cast<std::size_t>(request.peer)];
    return request.ticket <
           (request.is_send ? channel.sends_completed : channel.receives_completed);
  }

  void progress_until(const Request& request) {
    Clock::time_point last_progress = Clock::now();
    while (true) {
      bool progressed = false;
      for (std::size_t i = 0; i < active_.size();) {
        PeerChannel& channel = peers_[static_cast<std::size_t>(active_[i])];
        if (!channel.sends.empty()) progressed |= progress_sends(active_[i], channel);
        if (!channel.receives.empty()) progressed |= progress_receives(active_[i], channel);
        if (channel.idle()) {
          channel.active = false;
          active_[i] = active_.back();
          active_.pop_back();
        } else {
          ++i;
        }
      }
      if (complete(request)) return;
      const Clock::time_point now = Clock::now();
      if (progressed) {
        last_progress = now;
      } else if (now - last_progress >= options_.timeout) {
        throw timeout_error(request);
      } else if (now - last_progress >= spin_before_sleep_) {
        sleep_until_ready(Deadline(options_.timeout - (now - last_progress)));
      }
    }
  }

  // Blocks until a socket with pending work can move bytes (or has failed), or `deadline`.
  void sleep_until_ready(const Deadline& deadline) {
    ready_.clear();
    for (const int peer : active_) {
      const PeerChannel& channel = peers_[static_cast<std::size_t>(peer)];
      const short events = static_cast<short>((channel.sends.empty() ? 0 : POLLOUT) |
                                              (channel.receives.empty() ? 0 : POLLIN));
      ready_.push_back({channel.socket.get(), events, 0});
    }
    if (::poll(ready_.data(), ready_.size(), detail::poll_timeout_ms(deadline)) < 0 &&
        errno != EINTR) {
      detail::throw_system_error("poll the peer connections", errno, context("wait"));
    }
  }

  // One sendmsg() of the queued messages that kGatherBytes admits. Returns whether bytes moved.
  bool progress_sends(int peer, PeerChannel& channel) {
    std::array<iovec, detail::kMaxSendIovecs> iov;
    std::size_t count = 0;
    std::size_t gathered = 0;
    for (auto it = channel.sends.begin(); it != channel.sends.end(); ++it) {
      if (count + 2 > iov.size() || gathered >= detail::kGatherBytes) break;
      gathered += it->total() - it->sent;
      if (it->sent < detail::kHeaderBytes) {
        iov[count++] = {reinterpret_cast<std::byte*>(&it->header) + it->sent,
                        detail::kHeaderBytes - it->sent};
      }
      const std::size_t payload_sent =
          it->sent > detail::kHeaderBytes ? it->sent - detail::kHeaderBytes : 0;
      if (payload_sent < it->payload.size()) {
        iov[count++] = {const_cast<std::byte*>(it->payload.data()) + payload_sent,
                        it->payload.size() - payload_sent};
      }
    }
    msghdr message{};
    message.msg_iov = iov.data();
    message.msg_iovlen = count;
    const ssize_t sent = ::sendmsg(channel.socket.get(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      const int error = errno;
      if (error == EAGAIN || error == EWOULDBLOCK || error == EINTR) return false;
      throw_connection_error(peer, channel.sends.front().header, detail::errno_text(error),
                             is_connection_loss(error));
    }
    auto left = static_cast<std::size_t>(sent);
    while (left > 0) {
      detail::PendingSend& front = channel.sends.front();
      const std::size_t step = std::min(left, front.total() - front.sent);
      front.sent += step;
      left -= step;
      if (front.sent == front.total()) {
        channel.sends.pop_front();
        ++channel.sends_completed;
      }
    }
    return true;
  }

  // Delivers what the inbox holds to the queued receives, then reads until the socket is drained
  // or the queue is empty. Returns whether bytes moved.
  bool progress_receives(int peer, PeerChannel& channel) {
    bool progressed = drain_inbox(peer, channel);
    while (!channel.receives.empty()) {
      detail::PendingReceive& front = channel.receives.front();
      // Whatever is left in the inbox is a partial header; move it to the front to make room.
      if (channel.inbox_begin > 0) {
        std::memmove(channel.inbox.get(), channel.inbox.get() + channel.inbox_begin,
                     channel.inbox_size());
        channel.inbox_end -= channel.inbox_begin;
        channel.inbox_begin = 0;
      }
      std::array<iovec, 2> iov;
      std::size_t count = 0;
      std::size_t direct = 0;
      if (front.header_checked) {
        direct = front.payload.size() - front.received;
        iov[count++] = {front.payload.data() + front.received, direct};
      }
      const std::size_t room = detail::kInboxBytes - channel.inbox_end;
      iov[count++] = {channel.inbox.get() + channel.inbox_end, room};
      msghdr message{};
      message.msg_iov = iov.data();
      message.msg_iovlen = count;
      const ssize_t received = ::recvmsg(channel.socket.get(), &message, MSG_DONTWAIT);
      if (received == 0) {
        throw_connection_error(peer, front.expected, "peer closed the connection", true);
      }
      if (received < 0) {
        const int error = errno;
        if (error == EAGAIN || error == EWOULDBLOCK || error == EINTR) return progressed;
        throw_connection_error(peer, front.expected, detail::errno_text(error),
                               is_connection_loss(error));
      }
      progressed = true;
      const auto got = static_cast<std::size_t>(received);
      const std::size_t into_payload = std::min(got, direct);
      front.received += into_payload;
      channel.inbox_end += got - into_payload;
      drain_inbox(peer, channel);
      if (got < direct + room) return progressed;  // the socket has nothing more for now
    }
    return progressed;
  }

  // Completes queued receives from the inbox: checks each header, copies payload bytes. Returns
  // whether any header or payload byte was consumed.
  bool drain_inbox(int peer, PeerChannel& channel) {
    bool progressed = false;
    while (!channel.receives.empty()) {
      detail::PendingReceive& front = channel.receives.front();
      if (!front.header_checked) {
        if (channel.inbox_size() < detail::kHeaderBytes) return progressed;
        MessageHeader header;
        std::memcpy(&header, channel.inbox.get() + channel.inbox_begin, detail::kHeaderBytes);
        channel.inbox_begin += detail::kHeaderBytes;
        check_header(front.expected, header, rank_, peer);
        front.header_checked = true;
        progressed = true;
      }
      const std::size_t take =
          std::min(channel.inbox_size(), front.payload.size() - front.received);
      if (take > 0) {
        std::memcpy(front.payload.data() + front.received,
                    channel.inbox.get() + channel.inbox_begin, take);
        channel.inbox_begin += take;
        front.received += take;
        progressed = true;
      }
      if (front.received < front.payload.size()) return progressed;
      channel.receives.pop_front();
      ++channel.receives_completed;
    }
    return progressed;
  }

  static bool is_connection_loss(int error) {
    return error == ECONNRESET || error == EPIPE || error == ENOTCONN || error == ETIMEDOUT ||
           error == ECONNABORTED || error == EHOSTUNREACH || error == ENETUNREACH;
  }

  // Throws PeerLostError when `lost`, else CommError, for a failed read or write to `peer`.
  [[noreturn]] void throw_connection_error(int peer, const MessageHeader& in_flight,
                                           const std::string& reason, bool lost) const {
    if (!lost) {
      throw CommError("rank " + std::to_string(rank_) + " failed on its connection to rank " +
                          std::to_string(peer) + " (" + reason + ") during " +
                          std::string(name_of(in_flight.collective)) + " #" +
                          std::to_string(in_flight.sequence),
                      context(peer, in_flight));
    }
    throw PeerLostError("rank " + std::to_string(rank_) + " lost its connection to rank " +
                            std::to_string(peer) + " (" + reason + ") during " +
                            std::string(name_of(in_flight.collective)) + " #" +
                            std::to_string(in_flight.sequence),
                        context(peer, in_flight));
  }

  TimeoutError timeout_error(const Request& request) const {
    const PeerChannel& channel = peers_[static_cast<std::size_t>(request.peer)];
    const std::string peer = "rank " + std::to_string(request.peer);
    std::string what;
    MessageHeader header;
    if (request.is_send) {
      const detail::PendingSend& op =
          channel.sends[static_cast<std::size_t>(request.ticket - channel.sends_completed)];
      header = op.header;
      what = "to send " + detail::describe_call(header) + " to " + peer + "; " +
             std::to_string(op.sent) + " of its " + std::to_string(op.total()) +
             " bytes went out (" + peer + " is not receiving)";
    } else {
      const detail::PendingReceive& op =
          channel.receives[static_cast<std::size_t>(request.ticket - channel.receives_completed)];
      header = op.expected;
      what = "to receive " + detail::describe_call(header) + " from " + peer + "; " +
             (op.header_checked ? std::to_string(op.received) + " of its " +
                                      std::to_string(op.payload.size()) + " payload bytes arrived"
                                : std::string("its header has not arrived"));
    }
    if (request.ticket > (request.is_send ? channel.sends_completed : channel.receives_completed)) {
      what += ", behind earlier messages that have not gone through either";
    }
    return TimeoutError("rank " + std::to_string(rank_) + " made no progress for " +
                            detail::format_seconds(options_.timeout) +
                            " (COLTRAIN_TIMEOUT) waiting " + what,
                        context(request.peer, header));
  }

  // Marks the transport unusable and closes every connection, so that peers see this rank leave.
  void break_down(const std::exception& cause) {
    if (const auto* error = dynamic_cast<const Error*>(&cause)) {
      const std::string where = coltrain::detail::describe(error->context());
      broken_ = error->message() + (where.empty() ? "" : " [" + where + "]");
    } else {
      broken_ = cause.what();
    }
    for (PeerChannel& channel : peers_) {
      if (channel.socket) ::shutdown(channel.socket.get(), SHUT_RDWR);
      channel = PeerChannel{};
    }
    active_.clear();
  }

  CommOptions options_;
  int rank_;
  int size_;
  std::chrono::microseconds spin_before_sleep_;
  std::vector<PeerChannel> peers_;  // indexed by rank; this rank's entry has no socket
  std::vector<int> active_;         // peers with pending sends or receives
  std::vector<pollfd> ready_;       // poll() set, kept to avoid an allocation per sleep
  std::string broken_;              // the first error; non-empty once the transport is broken
};

static_assert(Transport<TcpTransport>);

}  // namespace coltrain::comm
