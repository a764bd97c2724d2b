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
// - Send/recv messages (header collective kSendRecv) are matched by tag, not by their place in the
//   stream: each is read whole into a buffer when it arrives, wherever it is in the stream, and
//   handed to the first receive posted for its tag (one copy), so that messages and collectives
//   never wait for each other's receives.
// - Peers on this host: the same stream runs through a pair of shared-memory rings
//   (comm/transport/shm/shm_channel.hpp) in place of the socket, which then carries only doorbells
//   and the end of the stream; everything above (headers, inbox, notices, deadlines) is the same
//   for both. Large payloads go by reference where the host allows it (single copy: the peer reads
//   them from this process's memory), so a send whose bytes are all handed over completes only once
//   the peer has copied them (`unsettled`).
// - Waiting: non-blocking attempts catch a reply that is about to arrive (a loopback round trip is
//   ~8 us when polled, ~100 us through a sleep and wake-up); after a while (spin_before_sleep) the
//   rank sleeps in poll(), so that ranks outnumbering cores do not starve each other.
// - Errors: a lost peer is a PeerLostError naming it, a wrong header a MismatchError. No progress
//   for CommOptions::timeout starts an inquiry (comm/protocol/failure_detector.hpp): every rank is
//   asked whether it is alive and whom it waits on, and the rank at the end of that chain that does
//   not answer is named (a stopped rank, not its blocked neighbour) in a TimeoutError; an answering
//   rank in the same collective with another algorithm, root or op is named in a MismatchError.
//   Any error breaks the transport: it sends its root cause as a failure notice to every rank it
//   can still reach, then shuts all its connections, so peers blocked on this rank fail fast, and
//   with the first detector's verdict, instead of blaming their neighbour; every later call
//   throws CommError. A transport destroyed while an exception unwinds (an error in the caller's
//   code between collectives) tells its peers the same way.

#include <coltrain/comm/host_layout.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/protocol/failure_detector.hpp>
#include <coltrain/comm/protocol/failure_notice.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/rendezvous/tcp_rendezvous.hpp>
#include <coltrain/comm/transport/shm/shm_setup.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/comm/transport/tcp/spin_policy.hpp>
#include <coltrain/comm/transport/tcp/tcp_peer_channel.hpp>
#include <coltrain/comm/transport/transport.hpp>
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
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::comm {

class TcpTransport {
 public:
  // A posted operation: its peer, its direction, and its place in that peer's queue. A default
  // Request refers to nothing and is always complete.
  struct Request {
    int peer = -1;
    bool is_send = false;
    bool tagged = false;  // a send/recv message's receive, matched by tag
    std::uint64_t ticket = 0;
  };

  // Runs the rendezvous for `env`'s rank (see tcp_rendezvous.hpp); returns once this rank is
  // connected to every other.
  TcpTransport(const LaunchEnv& env, const CommOptions& options)
      : TcpTransport(env, options, Logger(env.rank, env.world_size)) {}

  // As above, logging the rendezvous (strangers turned away, timings) through `logger`.
  TcpTransport(const LaunchEnv& env, const CommOptions& options, const Logger& logger)
      : TcpTransport(env.rank, detail::bootstrap_tcp_mesh(env, options, logger), env, options) {}

  // Over sockets already connected to every other rank (one per rank, empty at `rank`), as an
  // elastic regroup (comm/elastic/elastic_group.hpp) builds them; `env` sizes the spin before
  // sleeping unless the options set it.
  TcpTransport(int rank, std::vector<detail::FileDescriptor> sockets, const LaunchEnv& env,
               const CommOptions& options)
      : options_(options),
        env_(env),
        rank_(rank),
        size_(static_cast<int>(sockets.size())),
        spin_before_sleep_(options.spin_before_sleep.value_or(detail::spin_before_sleep(env))),
        detector_(rank, size_) {
    detail::SharedMemorySetup shared =
        detail::setup_shared_memory(rank, sockets, options, Logger(rank, size_));
    hosts_ = std::move(shared.hosts);
    hosts_share_memory_ = shared.every_rank_shares_memory;
    peers_.resize(sockets.size());
    for (std::size_t peer = 0; peer < sockets.size(); ++peer) {
      peers_[peer].socket = std::move(sockets[peer]);
      peers_[peer].shm = std::move(shared.streams[peer]);
    }
  }

  // Which ranks share a host (learned at connection, from every rank's host identity).
  const HostLayout& host_layout() const { return hosts_; }

  // Whether the ranks of a host talk through shared memory: every rank asked for it. The same on
  // every rank, so the cost model's choices agree (CostModel::same_host).
  bool hosts_share_memory() const { return hosts_share_memory_; }

  // Whether `peer`'s bytes go through shared memory (a rank on this host).
  bool shares_memory_with(int peer) const {
    return peers_.at(static_cast<std::size_t>(peer)).shm != nullptr;
  }
  // Whether large payloads to `peer` go by single copy (it reads them from this process's memory).
  bool single_copy_with(int peer) const {
    const PeerChannel& channel = peers_.at(static_cast<std::size_t>(peer));
    return channel.shm && channel.shm->sends_by_reference();
  }

  // A moved-from transport may only be destroyed or assigned to.
  TcpTransport(TcpTransport&&) noexcept = default;
  TcpTransport& operator=(TcpTransport&&) noexcept = default;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;
  // Closing the sockets is the whole shutdown: data already written still reaches the peers.
  // While an exception unwinds (the caller's code failed between collectives), the peers are told
  // first, so that they name this rank instead of waiting on it or blaming a neighbour.
  ~TcpTransport() {
    if (peers_.empty() || !broken_.empty() || std::uncaught_exceptions() == 0) return;
    FailureNotice verdict = detector_.notice(NoticeKind::kFailure);
    verdict.cause = FailureCause::kError;
    verdict.failed_rank = rank_;
    send_verdict(verdict, "the process left while an exception was propagating");
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  // How long a wait polls before it sleeps in poll() (CommOptions::spin_before_sleep).
  std::chrono::microseconds spin_before_sleep() const { return spin_before_sleep_; }
  const CommOptions& options() const { return options_; }
  // Measured single-copy ranges (a tuning file's: CommOptions::single_copy_exchanges and
  // single_copy_exchanges_on_small_pages); no send may be queued.
  void set_single_copy_exchanges(const CallSizeRange& on_huge_pages,
                                 const CallSizeRange& on_small_pages) {
    options_.single_copy_exchanges = on_huge_pages;
    options_.single_copy_exchanges_on_small_pages = on_small_pages;
  }
  const LaunchEnv& launch_env() const { return env_; }

  // The address this host uses to reach the other ranks (that of its connection to the first
  // peer); loopback in a world of one rank.
  detail::IpAddress local_address() const {
    for (const PeerChannel& channel : peers_) {
      if (channel.socket) return detail::local_endpoint(channel.socket.get()).address;
    }
    return detail::IpAddress::ipv4(htonl(INADDR_LOOPBACK));
  }

  Request isend(int peer, const MessageHeader& header, std::span<const std::byte> payload) {
    detail::PeerChannel& channel = post_check(peer, header, payload.size(), "isend");
    channel.sends.push_back({header, payload, 0, by_reference(channel, header, payload)});
    detector_.set_call(header);
    activate(peer);
    return {peer, true, false, channel.sends_posted++};
  }

  Request irecv(int peer, const MessageHeader& expected, std::span<std::byte> payload) {
    detail::PeerChannel& channel = post_check(peer, expected, payload.size(), "irecv");
    if (!channel.inbox) channel.inbox = std::make_unique<std::byte[]>(detail::kInboxBytes);
    if (expected.collective == Collective::kSendRecv) {
      channel.tagged_receives.push_back({expected, payload, false});
      ++channel.tagged_pending;
      detector_.set_call(expected);
      activate(peer);
      return {peer, false, true,
              channel.tagged_receives_begin + channel.tagged_receives.size() - 1};
    }
    channel.receives.push_back({expected, payload, false, 0});
    channel.data_waiting = false;
    detector_.set_call(expected);
    activate(peer);
    return {peer, false, false, channel.receives_posted++};
  }

  void wait(Request request) {
    throw_if_broken("wait");
    if (complete(request)) return;
    guarded([&] { progress_until(request); });
  }

  // Moves what can move without blocking, then says whether `request` is complete. Throws as
  // wait() does.
  bool test(Request request) {
    throw_if_broken("test");
    if (complete(request)) return true;
    guarded([&] {
      detector_.throw_verdict_if_any();
      progress_active_peers();
    });
    return complete(request);
  }

 private:
  using PeerChannel = detail::PeerChannel;

  // Runs `work` on the progress engine; an error breaks the transport down (see the header).
  template <class F>
  void guarded(F&& work) {
    try {
      std::forward<F>(work)();
    } catch (const std::exception& e) {
      // A lost connection is often a peer that broke down after an earlier failure: its notice
      // may be waiting on a socket this rank was not reading (it was sending there). That
      // verdict, not the lost connection, is the root cause.
      if (dynamic_cast<const PeerLostError*>(&e) != nullptr) {
        try {
          take_last_words();
          look_for_verdict();
        } catch (const std::exception& verdict) {
          break_down(verdict);
          throw;
        }
      }
      break_down(e);
      throw;
    }
  }

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
    if (request.tagged) {
      return request.ticket < channel.tagged_receives_begin ||
             channel.tagged_receives[request.ticket - channel.tagged_receives_begin].done;
    }
    return request.ticket <
           (request.is_send ? channel.sends_completed : channel.receives_completed);
  }

  void progress_until(const Request& request) {
    detector_
        .throw_verdict_if_any();  // a peer's verdict came after the last call had done its part
    awaited_ = request;
    Clock::time_point last_progress = Clock::now();
    while (true) {
      const bool progressed = progress_active_peers();
      if (complete(request)) return;
      const Clock::time_point now = Clock::now();
      const Clock::duration waited = now - last_progress;
      if (progressed) {
        last_progress = now;
        parking_ = false;
      } else if (waited >= options_.timeout) {
        if (inquire(request)) return;  // what was awaited came during the inquiry
        last_progress = Clock::now();
      } else if (waited >= spin_before_sleep_) {
        // After a while without progress, messages that wait for later receives are parked, so
        // that a notice behind them can be read (a peer's inquiry must get its answer).
        const Clock::duration park_after =
            std::min<Clock::duration>(std::chrono::milliseconds(100), options_.timeout / 4);
        Clock::duration sleep = options_.timeout - waited;
        if (waited >= park_after) {
          detector_.throw_verdict_if_any();  // this call is stuck too
          parking_ = true;
        } else {
          sleep = std::min(sleep, park_after - waited);
        }
        sleep_until_ready(Deadline(sleep));
      }
    }
  }

  // One non-blocking pass over the peers with pending work. Returns whether bytes moved.
  bool progress_active_peers() {
    bool progressed = false;
    for (std::size_t i = 0; i < active_.size();) {
      PeerChannel& channel = peers_[static_cast<std::size_t>(active_[i])];
      if (!channel.sends.empty() || !channel.unsettled.empty())
        progressed |= progress_sends(active_[i], channel);
      if (!channel.receives.empty()) progressed |= progress_receives(active_[i], channel);
      if (channel.tagged_pending > 0) progressed |= progress_tagged(active_[i], channel);
      if (channel.idle()) {
        channel.active = false;
        active_[i] = active_.back();
        active_.pop_back();
      } else {
        ++i;
      }
    }
    return progressed;
  }

  // Send/recv receives from `peer`: reads the stream when no collective receive does (a
  // collective's message in front stops it, as in read_idle_peer), then hands arrived messages to
  // the receives of their tags. Returns whether bytes moved.
  bool progress_tagged(int peer, PeerChannel& channel) {
    bool progressed = false;
    if (channel.receives.empty() && watched_for_notices(channel)) progressed = read_idle_peer(peer);
    progressed |= channel.match_tagged(rank_, peer);
    if (channel.tagged_pending > 0 && channel.gone) {
      for (const detail::PendingTaggedReceive& receive : channel.tagged_receives) {
        if (!receive.done)
          throw_connection_error(peer, receive.expected, "peer closed the connection", true);
      }
    }
    return progressed;
  }

  // Blocks until a socket with pending work can move bytes (or has failed), or `deadline`. The
  // other peers' sockets are watched too: a notice (comm/protocol/failure_notice.hpp) may come from
  // any rank, and is read here.
  void sleep_until_ready(const Deadline& deadline) {
    // A notice may already sit in an idle peer's inbox, read there with the previous message.
    for (int peer = 0; peer < size_; ++peer) {
      const PeerChannel& channel = peers_[static_cast<std::size_t>(peer)];
      if (peer != rank_ && watched_for_notices(channel) && channel.inbox &&
          channel.inbox_size() >= detail::kHeaderBytes)
        read_idle_peer(peer);
    }
    ready_.clear();
    ready_peers_.clear();
    ready_rings_.clear();
    bool rings_busy = false;  // a shared-memory ring changed while the flags went up
    for (int peer = 0; peer < size_; ++peer) {
      PeerChannel& channel = peers_[static_cast<std::size_t>(peer)];
      if (peer == rank_ || !channel.socket) continue;
      const bool read = !channel.receives.empty() || watched_for_notices(channel);
      const bool write = !channel.sends.empty();
      const bool settling = !channel.unsettled.empty();  // (shared memory only)
      short events = static_cast<short>((write ? POLLOUT : 0) | (read ? POLLIN : 0));
      if (events == 0 && !settling) continue;
      bool ring_busy = false;
      if (channel.shm) {  // the socket brings doorbells for both directions
        ring_busy = !channel.shm->prepare_to_sleep(
            read, write, settling ? channel.unsettled.front().reference : 0);
        events = POLLIN;
      }
      rings_busy |= ring_busy;
      ready_.push_back({channel.socket.get(), events, 0});
      ready_peers_.push_back(peer);
      ready_rings_.push_back(ring_busy);
    }
    if (::poll(ready_.data(), ready_.size(), rings_busy ? 0 : detail::poll_timeout_ms(deadline)) <
            0 &&
        errno != EINTR) {
      detail::throw_system_error("poll the peer connections", errno, context("wait"));
    }
    for (std::size_t i = 0; i < ready_.size(); ++i) {
      PeerChannel& channel = peers_[static_cast<std::size_t>(ready_peers_[i])];
      const bool readable = (ready_[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
      if (readable && channel.shm) channel.shm->answer_doorbell();
      // A ring that changed before its flag went up rang no doorbell: an idle peer's notice
      // there is read now, as nothing else reads that ring.
      if ((readable || ready_rings_[i]) && channel.receives.empty())
        read_idle_peer(ready_peers_[i]);
    }
  }

  // A peer nothing is awaited from, whose stream may bring a notice this rank can read: not gone,
  // and no message waiting for a receive in front of it (unless parking reads past it).
  bool watched_for_notices(const PeerChannel& channel) const {
    return channel.receives.empty() && !channel.gone && (!channel.data_waiting || parking_);
  }

  // Whether `payload` of a send to `channel` may go by single copy: the peer can read this
  // process's memory, the piece is large enough, and (CommOptions::single_copy_where_it_pays) it
  // pays for this call. Decided once per send: the huge-page registry takes a lock.
  bool by_reference(const PeerChannel& channel, const MessageHeader& header,
                    std::span<const std::byte> payload) const {
    if (!channel.shm || !channel.shm->sends_by_reference() ||
        payload.size() < channel.shm->reference_min_bytes())
      return false;
    return !options_.single_copy_where_it_pays ||
           detail::single_copy_pays(header, payload, options_.single_copy_exchanges,
                                    options_.single_copy_exchanges_on_small_pages);
  }

  // One sendmsg() of the queued messages that kGatherBytes admits (payloads that go by reference
  // cost no copy, so they do not count: every queued chunk is offered to the peer at once); then
  // completes the sends whose bytes the peer has all copied. Returns whether bytes moved or sends
  // completed.
  bool progress_sends(int peer, PeerChannel& channel) {
    bool progressed = false;
    if (const int error = channel.write_queued(progressed)) {
      throw_connection_error(peer, channel.sends.front().header, detail::errno_text(error),
                             is_connection_loss(error));
    }
    // Every byte handed over, but a peer that left before copying them never will: this send
    // fails now, not at the timeout (no receive from the peer may be posted to notice it).
    if (!channel.unsettled.empty() && channel.shm->peer_gone()) {
      throw_connection_error(peer, channel.unsettled.front().header,
                             "peer closed the connection before copying this rank's message", true);
    }
    return progressed;
  }

  // Delivers what the inbox holds to the queued receives, then reads until the socket is drained
  // or the queue is empty. Returns whether bytes moved.
  bool progress_receives(int peer, PeerChannel& channel) {
    bool progressed = drain_inbox(peer, channel);
    while (!channel.receives.empty()) {
      detail::PendingReceive& front = channel.receives.front();
      // Whatever is left in the inbox is a partial header.
      channel.compact_inbox();
      std::array<iovec, 2> iov;
      std::size_t count = 0;
      std::size_t direct = 0;
      detail::ParkedMessage* tagged = nullptr;  // a send/recv message in front, half read
      if (front.header_checked) {
        direct = front.payload.size() - front.received;
        iov[count++] = {front.payload.data() + front.received, direct};
      } else if ((tagged = channel.arriving()) != nullptr) {
        direct = tagged->payload.size() - tagged->received;
        iov[count++] = {tagged->payload.data() + tagged->received, direct};
      }
      const std::size_t room = detail::kInboxBytes - channel.inbox_end;
      iov[count++] = {channel.inbox.get() + channel.inbox_end, room};
      const ssize_t received = channel.read(iov.data(), count);
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
      (tagged != nullptr ? tagged->received : front.received) += into_payload;
      channel.inbox_end += got - into_payload;
      drain_inbox(peer, channel);
      if (got < direct + room) return progressed;  // the socket has nothing more for now
    }
    return progressed;
  }

  // Completes queued receives from the inbox: checks each header, copies payload bytes. Returns
  // whether any header or payload byte was consumed.
  bool drain_inbox(int peer, PeerChannel& channel) {
    bool progressed = channel.serve_parked(rank_, peer);
    if (!channel.parked.empty()) return progressed;  // the inbox holds what came after them
    if (detail::ParkedMessage* message = channel.arriving()) {  // a send/recv message, half read
      const std::size_t before = message->received;
      channel.fill_from_inbox(*message);
      progressed |= message->received != before;
      if (!message->complete()) return progressed;
    }
    while (!channel.receives.empty()) {
      detail::PendingReceive& front = channel.receives.front();
      if (!front.header_checked) {
        if (channel.inbox_size() < detail::kHeaderBytes) return progressed;
        if (channel.starts_with_notice()) {
          // In place of the data awaited from this peer: it broke down, so this call cannot end.
          if (!take_notice(peer, channel, false)) return progressed;  // its text is on the way
          progressed = true;
          continue;
        }
        MessageHeader header;
        std::memcpy(&header, channel.inbox.get() + channel.inbox_begin, detail::kHeaderBytes);
        channel.inbox_begin += detail::kHeaderBytes;
        progressed = true;
        if (header.magic == kMessageMagic && header.collective == Collective::kSendRecv) {
          channel.take_tagged(header);  // a message between collective messages: set aside
          if (!channel.tagged.back().complete()) return progressed;
          continue;
        }
        check_header(front.expected, header, rank_, peer);
        front.header_checked = true;
        progressed = true;
      }
      const std::size_t take = channel.take_from_inbox(front.payload.subspan(front.received));
      front.received += take;
      progressed |= take > 0;
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
    const detail::StalledOperation stalled =
        peers_[static_cast<std::size_t>(request.peer)].describe_stalled(
            request.peer, request.ticket, request.is_send, request.tagged);
    return TimeoutError("rank " + std::to_string(rank_) + " made no progress for " +
                            detail::format_seconds(options_.timeout) +
                            " (COLTRAIN_TIMEOUT) waiting " + stalled.what,
                        context(request.peer, stalled.header));
  }

  // Marks the transport unusable, tells every peer it can still reach the root cause, and shuts
  // every connection, so that peers see this rank leave.
  void break_down(const std::exception& cause) {
    const auto* error = dynamic_cast<const Error*>(&cause);
    if (error != nullptr) {
      const std::string where = coltrain::detail::describe(error->context());
      broken_ = error->message() + (where.empty() ? "" : " [" + where + "]");
    } else {
      broken_ = cause.what();
    }
    if (detector_.verdict()) {  // a notice's verdict: passed on as it came
      send_verdict(*detector_.verdict(), detector_.verdict_text());
      return;
    }
    FailureNotice verdict = detector_.notice(NoticeKind::kFailure);
    blame_for(verdict, cause);
    send_verdict(verdict, error != nullptr ? error->message() : broken_);
  }

  // Marks the transport broken and sends `verdict` (with `text`) to every peer that can take it:
  // one non-blocking write per peer, skipped where a message is half sent (the notice would land
  // inside its payload) or the peer is the one that died. Then shuts every connection; the
  // sockets stay open until destruction, so that nothing unread turns the close into a reset.
  void send_verdict(const FailureNotice& verdict, std::string text) {
    if (broken_.empty()) broken_ = describe_failure(verdict, text);
    text.resize(std::min(text.size(), kMaxNoticeText));
    FailureNotice head = verdict;
    head.text_bytes = text.size();
    std::string bytes(sizeof head, '\0');
    std::memcpy(bytes.data(), &head, sizeof head);
    bytes += text;
    for (int peer = 0; peer < size_; ++peer) {
      PeerChannel& channel = peers_[static_cast<std::size_t>(peer)];
      if (peer == rank_ || !channel.socket) continue;
      const bool half_sent = !channel.sends.empty() && channel.sends.front().sent > 0;
      const bool dead = verdict.cause == FailureCause::kDied && peer == verdict.failed_rank;
      // Outside the stream as well: a peer stopped at one of this rank's references cannot read
      // on to the copy in the stream (the references become void when this rank leaves).
      if (channel.shm && !dead) channel.shm->leave_last_words(std::as_bytes(std::span(bytes)));
      if (!half_sent && !dead && !channel.gone) {
        if (channel.shm) {
          channel.shm->send_whole(std::as_bytes(std::span(bytes)));
        } else {
          [[maybe_unused]] const ssize_t ignored =
              ::send(channel.socket.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
      }
      ::shutdown(channel.socket.get(), SHUT_RDWR);
      detail::FileDescriptor socket = std::move(channel.socket);
      channel = PeerChannel{};
      channel.socket = std::move(socket);
    }
    active_.clear();
  }

  // Queues a notice behind the messages already queued to `peer` (never inside one), with its
  // text (n.text_bytes of them), which must outlive the send.
  void queue_notice(int peer, const FailureNotice& n, std::span<const std::byte> text = {}) {
    PeerChannel& channel = peers_[static_cast<std::size_t>(peer)];
    MessageHeader as_header;
    static_assert(sizeof as_header == sizeof n);
    std::memcpy(static_cast<void*>(&as_header), &n, sizeof n);
    channel.sends.push_back({as_header, text, 0});
    ++channel.sends_posted;
    activate(peer);
  }

  // The inbox starts with a notice: acts on it once its text is there too (false until then).
  // A verdict becomes this rank's error: at once, or with `defer` (it came from a peer this call
  // does not wait on) once the call stops making progress or the next one begins, so that a call
  // whose data still flows completes first.
  bool take_notice(int peer, PeerChannel& channel, bool defer) {
    FailureNotice n;
    std::memcpy(&n, channel.inbox.get() + channel.inbox_begin, sizeof n);
    if (n.text_bytes > kMaxNoticeText) {
      throw MismatchError("rank " + std::to_string(peer) + " sent a failure notice with " +
                              std::to_string(n.text_bytes) + " bytes of text (at most " +
                              std::to_string(kMaxNoticeText) + "): the stream lost its framing",
                          context(peer, detector_.call().value_or(MessageHeader{})));
    }
    if (channel.inbox_size() < sizeof n + n.text_bytes) return false;
    const char* text = reinterpret_cast<const char*>(channel.inbox.get() + channel.inbox_begin);
    std::string account(text + sizeof n, static_cast<std::size_t>(n.text_bytes));
    channel.inbox_begin += sizeof n + static_cast<std::size_t>(n.text_bytes);
    const std::optional<FailureDetector::Reply> reply =
        detector_.take(peer, n, std::move(account), awaited_.peer);
    if (reply) queue_notice(peer, reply->notice, reply->text);
    if (n.kind == NoticeKind::kFailure && !defer) detector_.throw_verdict_if_any();
    return true;
  }

  // A peer nothing is awaited from has bytes (or closed): reads one header's worth at a time into
  // its inbox. A notice is acted on; a message header waits for its receive, or, while parking_, is
  // read whole into `parked` and the stream read on; an end of stream marks the peer gone (an error
  // only once something is awaited from it).
  // Returns whether bytes were read. A send/recv message is always read whole (into `tagged`).
  bool read_idle_peer(int peer) {
    PeerChannel& channel = peers_[static_cast<std::size_t>(peer)];
    if (!channel.inbox) channel.inbox = std::make_unique<std::byte[]>(detail::kInboxBytes);
    if (parking_) channel.data_waiting = false;
    bool progressed = false;
    while (!channel.gone && !channel.data_waiting) {
      channel.compact_inbox();
      std::byte* into = channel.inbox.get() + channel.inbox_end;
      std::size_t want =
          detail::kHeaderBytes - std::min(channel.inbox_size(), detail::kHeaderBytes);
      detail::ParkedMessage* message = channel.arriving();
      if (message != nullptr) {
        // The rest of a parked payload: from the inbox first, then straight from the socket.
        channel.fill_from_inbox(*message);
        if (message->complete()) continue;
        into = message->payload.data() + message->received;
        want = message->payload.size() - message->received;
      } else if (channel.inbox_size() >= detail::kHeaderBytes) {
        if (!channel.starts_with_notice()) {
          MessageHeader header;
          std::memcpy(&header, channel.inbox.get() + channel.inbox_begin, sizeof header);
          const bool ours = header.magic == kMessageMagic;
          if (ours && header.collective == Collective::kSendRecv) {
            channel.inbox_begin += sizeof header;
            channel.take_tagged(header);
            progressed = true;
            continue;
          }
          // Not ours, or no parking yet: the receive that comes for it deals with it.
          if (!parking_ || !ours) {
            channel.data_waiting = true;
            return progressed;
          }
          channel.inbox_begin += sizeof header;
          channel.parked.push_back({header, std::vector<std::byte>(header.bytes), 0});
          continue;
        }
        FailureNotice n;
        std::memcpy(&n, channel.inbox.get() + channel.inbox_begin, sizeof n);
        const std::size_t whole = sizeof n + static_cast<std::size_t>(std::min<std::uint64_t>(
                                                 n.text_bytes, kMaxNoticeText));
        if (channel.inbox_size() >= whole) {
          take_notice(peer, channel, true);
          progressed = true;
          continue;
        }
        want = whole - channel.inbox_size();
      }
      iovec one{into, want};
      const ssize_t got = channel.read(&one, 1);
      if (got == 0) {
        channel.gone = true;
      } else if (got < 0) {
        const int error = errno;
        if (error == EAGAIN || error == EWOULDBLOCK || error == EINTR) return progressed;
        channel.gone = true;
      } else {
        progressed = true;
        if (message != nullptr) {
          message->received += static_cast<std::size_t>(got);
        } else {
          channel.inbox_end += static_cast<std::size_t>(got);
        }
      }
    }
    return progressed;
  }

  // Takes the first failure notice a peer on this host left outside its stream as it broke down
  // (a well-formed one: a peer's bytes are checked as any notice's are).
  void take_last_words() {
    for (const PeerChannel& channel : peers_)
      if (channel.shm && detector_.take_last_words(channel.shm->last_words())) return;
  }

  // Reads, from every peer whose stream is at a message boundary, what has arrived: throws the
  // first failure notice found there.
  void look_for_verdict() {
    parking_ = true;
    for (int peer = 0; peer < size_; ++peer) {
      PeerChannel& channel = peers_[static_cast<std::size_t>(peer)];
      const bool at_boundary = channel.receives.empty() || !channel.receives.front().header_checked;
      if (peer != rank_ && channel.socket && !channel.gone && !channel.data_waiting && at_boundary)
        read_idle_peer(peer);
    }
    detector_.throw_verdict_if_any();
  }

  // No progress for the timeout on `request`: asks every rank whether it is alive and whom it
  // waits on, for a short while (a quarter of the timeout, at most 1 s), then names the first rank
  // along the chain of waiting from the awaited peer that did not answer (or died). When that rank
  // is not the awaited peer, the rank that waits on it directly gives the better account: its
  // verdict is awaited for as long as it can take (its own timeout and inquiry) before this rank
  // names the rank itself. Returns true if the request completed meanwhile; otherwise throws
  // TimeoutError (or PeerLostError) naming the rank to blame, which break_down passes on.
  bool inquire(const Request& request) {
    detector_.throw_verdict_if_any();
    const TimeoutError account = timeout_error(request);
    parking_ = true;
    const FailureNotice ask = detector_.begin_inquiry(request.peer);
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_ && !peers_[static_cast<std::size_t>(peer)].gone) queue_notice(peer, ask);
    const auto gone = [&](int peer) { return peers_[static_cast<std::size_t>(peer)].gone; };
    const Clock::duration grace_time =
        std::min<Clock::duration>(std::chrono::seconds(1), options_.timeout / 4);
    const Deadline grace(grace_time);
    const Deadline witness(grace_time + options_.timeout + grace_time);
    while (true) {
      for (std::size_t i = 0; i < active_.size(); ++i) {
        const int peer = active_[i];
        PeerChannel& channel = peers_[static_cast<std::size_t>(peer)];
        try {
          if (!channel.sends.empty() || !channel.unsettled.empty()) progress_sends(peer, channel);
          if (!channel.receives.empty()) progress_receives(peer, channel);
        } catch (const PeerLostError&) {
          if (detector_.verdict()) throw;  // a verdict that came in, not this peer's end
          channel.gone = true;
          channel.sends.clear();
          channel.unsettled.clear();
          channel.receives.clear();
        }
      }
      if (complete(request)) return true;
      if (detector_.verdict()) break;
      const Deadline* until = &grace;
      if (grace.expired()) {
        if (witness.expired() || !detector_.ends_beyond_suspect(request.peer, gone)) break;
        until = &witness;
      } else {
        bool all_answered = true;
        for (int peer = 0; peer < size_; ++peer)
          if (peer != rank_ && !gone(peer) && !detector_.answered(peer)) all_answered = false;
        if (all_answered) break;
      }
      sleep_until_ready(
          Deadline(std::min<Clock::duration>(until->remaining(), std::chrono::milliseconds(10))));
    }
    detector_.conclude(request.peer, account, gone);
  }

  CommOptions options_;
  LaunchEnv env_;
  int rank_;
  int size_;
  std::chrono::microseconds spin_before_sleep_;
  std::vector<PeerChannel> peers_;  // indexed by rank; this rank's entry has no socket
  HostLayout hosts_;
  bool hosts_share_memory_ = false;
  std::vector<int> active_;        // peers with pending sends or receives
  std::vector<pollfd> ready_;      // poll() set, kept to avoid an allocation per sleep
  std::vector<int> ready_peers_;   // the peer of each ready_ entry
  std::vector<char> ready_rings_;  // whether its ring had work before the poll (shared memory)
  std::string broken_;             // the first error; non-empty once the transport is broken
  Request awaited_;                // what wait() waits for now
  FailureDetector detector_;       // the call in progress, a verdict, an inquiry's answers
  // Read ahead of the receives (parked) to find notices: set after a while without progress.
  bool parking_ = false;
};

static_assert(Transport<TcpTransport>);

}  // namespace coltrain::comm
