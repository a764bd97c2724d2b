#pragma once
// The Transport concept over MPI point-to-point, on a private duplicate of the caller's
// communicator so that coltrain's messages never match the application's receives.
//
// A message is one MPI message when its payload is small (header and payload packed together: one
// latency instead of two) and two otherwise (the header, then the payload straight from and into
// the caller's buffers). Both sides know the expected size, and the header is checked before any
// payload is trusted. Waits poll MPI_Test against the transport's deadline, because MPI_Wait cannot
// time out. A rank whose call fails sends its verdict (failure_notice.hpp) to every rank, and a
// rank that has waited a millisecond looks for one now and then, so that ranks the failure does
// not touch directly fail at once with its cause instead of timing out. Send/recv messages
// (collective kSendRecv) travel on MPI tags of their own, two per user tag, so MPI matches them by
// tag and apart from the collectives' messages.

#include <coltrain/comm/host_layout.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/protocol/failure_notice.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/transport/transport.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>

#if !COLTRAIN_WITH_MPI
#error "coltrain/comm/transport/mpi/mpi_transport.hpp needs MPI: compile with mpicxx or link MPI"
#endif

#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace coltrain::comm {

class MpiTransport {
 public:
  // Payloads up to this many bytes travel in the header's message.
  static constexpr std::size_t kPackedPayloadLimit = 8192;

  struct Request {
    std::size_t index = 0;
  };

  MpiTransport(MPI_Comm parent, CommOptions options) : options_(std::move(options)) {
    require_thread_level();
    COLTRAIN_CHECK_MPI(MPI_Comm_dup(parent, &comm_));
    COLTRAIN_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    COLTRAIN_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    COLTRAIN_CHECK_MPI(MPI_Comm_size(comm_, &size_));
    // Ranks that outnumber this node's cores must give their core away while they wait.
    MPI_Comm node = MPI_COMM_NULL;
    COLTRAIN_CHECK_MPI(
        MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    int ranks_on_node = 1;
    COLTRAIN_CHECK_MPI(MPI_Comm_size(node, &ranks_on_node));
    COLTRAIN_CHECK_MPI(MPI_Comm_free(&node));
    shares_cores_ =
        static_cast<unsigned>(ranks_on_node) > std::max(1u, std::thread::hardware_concurrency());
    // Every rank's host identity, as the TCP transport learns it, so that COLTRAIN_HOST_ID groups
    // ranks the same way on both backends.
    const detail::HostIdentity mine = detail::host_identity(options_.host_id);
    std::vector<detail::HostIdentity> identities(static_cast<std::size_t>(size_));
    COLTRAIN_CHECK_MPI(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, identities.data(), sizeof mine,
                                     MPI_BYTE, comm_));
    hosts_ = HostLayout(identities);
  }
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  // A communicator's calls run on its progress thread (comm/request.hpp), so MPI must allow calls
  // from more than one thread: at least MPI_THREAD_SERIALIZED, which holds as long as no other
  // thread of the program calls MPI while collectives run; MPI_THREAD_MULTIPLE otherwise. Throws
  // ConfigError naming the level MPI gives and how to ask for more.
  static void require_thread_level() {
    int provided = MPI_THREAD_SINGLE;
    COLTRAIN_CHECK_MPI(MPI_Query_thread(&provided));
    if (provided >= MPI_THREAD_SERIALIZED) return;
    const char* name =
        provided == MPI_THREAD_FUNNELED ? "MPI_THREAD_FUNNELED" : "MPI_THREAD_SINGLE";
    throw ConfigError(
        std::string("MPI runs at thread level ") + name +
        ", but coltrain's collectives progress on a thread of their own and need at least "
        "MPI_THREAD_SERIALIZED (MPI_THREAD_MULTIPLE if other threads call MPI meanwhile): "
        "initialise MPI with MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), or let "
        "coltrain initialise it (Communicator::from_env); if MPI_Init_thread already asked for "
        "more, this MPI library cannot give it");
  }
  ~MpiTransport() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || comm_ == MPI_COMM_NULL) return;
    abandon_pending();
    release_control_sends();
    // A broken communicator keeps its MPI communicator: messages that peers already sent on it
    // would otherwise reach whichever communicator MPI gives the freed context id next.
    if (broken_.empty()) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }
  const CommOptions& options() const { return options_; }
  // Which ranks share a host.
  const HostLayout& host_layout() const { return hosts_; }
  // MPI's own transport between the ranks of a node (MPICH's shared memory, on which its
  // same_host constants were fitted).
  bool hosts_share_memory() const { return true; }
  // Whether this node has more ranks than cores (its waits then yield the core).
  bool shares_cores() const { return shares_cores_; }

  Request isend(int peer, const MessageHeader& header, std::span<const std::byte> payload) {
    Operation& op = start(peer, header, /*is_send=*/true);
    const bool packed = payload.size() <= kPackedPayloadLimit;
    std::memcpy(op.frame.data(), &header, sizeof header);
    std::size_t frame_bytes = sizeof header;
    if (packed) {
      if (!payload.empty())
        std::memcpy(op.frame.data() + sizeof header, payload.data(), payload.size());
      frame_bytes += payload.size();
    }
    post(op, MPI_Isend(op.frame.data(), static_cast<int>(frame_bytes), MPI_BYTE, peer,
                       op.header_tag, comm_, &op.requests[0]));
    if (!packed) post_payload(op, const_cast<std::byte*>(payload.data()), payload.size());
    return {requests_begin_ + operations_.size() - 1};
  }

  Request irecv(int peer, const MessageHeader& expected, std::span<std::byte> payload) {
    Operation& op = start(peer, expected, /*is_send=*/false);
    op.payload = payload;
    post(op, MPI_Irecv(op.frame.data(), static_cast<int>(op.frame.size()), MPI_BYTE, peer,
                       op.header_tag, comm_, &op.requests[0]));
    // The payload's receive is posted only after the header checked out (in wait), so a mismatched
    // peer's data never lands in the caller's buffer.
    return {requests_begin_ + operations_.size() - 1};
  }

  void wait(Request request) {
    throw_if_broken();
    if (request.index < requests_begin_) return;  // completed and retired
    Operation& op = operations_.at(request.index - requests_begin_);
    guarded(op, [&] {
      while (!op.done) progress(op);
    });
    retire_completed();
  }

  // Tests `request` once without blocking; throws as wait() does.
  bool test(Request request) {
    throw_if_broken();
    if (request.index < requests_begin_) return true;
    Operation& op = operations_.at(request.index - requests_begin_);
    bool done = false;
    guarded(op, [&] { done = test_once(op); });
    retire_completed();
    return done;
  }

  // The largest send/recv tag: two MPI tags each, above the collectives', within the 32767 that
  // every MPI allows (MPI_TAG_UB).
  static constexpr int kMaxUserTag = 16000;

 private:
  static constexpr int kHeaderTag = 1;
  static constexpr int kPayloadTag = 2;
  // A timed-out rank's call (compare_calls_before_timeout).
  static constexpr int kAnnouncementTag = 3;
  // A failed rank's verdict (tell_others).
  static constexpr int kVerdictTag = 4;
  // How often a waiting rank looks for a verdict, after its first millisecond of waiting.
  static constexpr auto kVerdictCheckInterval = std::chrono::milliseconds(2);
  static constexpr int kFirstUserTag = 16;  // send/recv tag t: header 16 + 2t, payload 17 + 2t
  // MPI counts are ints: larger payloads go as several messages of at most this many bytes.
  static constexpr std::size_t kMaxMessageBytes = std::size_t{1} << 30;

  struct Operation {
    int header_tag = kHeaderTag;
    int payload_tag = kPayloadTag;
    bool is_send = false;
    bool done = false;
    bool header_checked = false;
    int peer = 0;
    MessageHeader header;  // sent, or expected
    std::array<std::byte, sizeof(MessageHeader) + kPackedPayloadLimit> frame{};
    std::span<std::byte> payload;
    std::deque<MPI_Request> requests;  // [0]: header message; then payload pieces
  };

  Operation& start(int peer, const MessageHeader& header, bool is_send) {
    throw_if_broken();
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw InvalidArgument("invalid peer " + std::to_string(peer) + " for rank " +
                            std::to_string(rank_) + " of " + std::to_string(size_));
    }
    Operation& op = operations_.emplace_back();
    op.is_send = is_send;
    op.peer = peer;
    op.header = header;
    if (header.collective == Collective::kSendRecv) {
      op.header_tag = kFirstUserTag + 2 * header.root;
      op.payload_tag = op.header_tag + 1;
    }
    op.requests.push_back(MPI_REQUEST_NULL);
    return op;
  }

  // Runs `work` on `op`; an error breaks the transport, and unless it is another rank's verdict,
  // this rank's own verdict goes to every rank.
  template <class F>
  void guarded(const Operation& op, F&& work) {
    try {
      std::forward<F>(work)();
    } catch (const Error& e) {
      broken_ = e.what();
      if (!verdict_heard_) tell_others(op, e);
      abandon_pending();
      throw;
    }
  }

  // Sends this rank's verdict on its failed call to every other rank (one small non-blocking
  // send each, released at destruction).
  void tell_others(const Operation& op, const Error& cause) {
    FailureNotice verdict;
    verdict.seen_by = rank_;
    verdict.collective = op.header.collective;
    verdict.sequence = op.header.sequence;
    blame_for(verdict, cause);
    std::string text = cause.message();
    text.resize(std::min(text.size(), kMaxNoticeText));
    verdict.text_bytes = text.size();
    auto& bytes = verdict_message_.emplace(sizeof verdict + text.size());
    std::memcpy(bytes.data(), &verdict, sizeof verdict);
    std::memcpy(bytes.data() + sizeof verdict, text.data(), text.size());
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request& request = verdicts_.emplace_back(MPI_REQUEST_NULL);
      if (MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, peer, kVerdictTag,
                    comm_, &request) != MPI_SUCCESS) {
        verdicts_.pop_back();
      }
    }
  }

  // Throws the error of another rank's verdict, if one has arrived. A rank that timed out announced
  // its call before it sent its verdict: a call of op's collective that differs is named first,
  // as this rank's own timeout would have named it.
  void check_verdicts(const Operation& op) {
    const std::optional<WaitingMessage> waiting = take_waiting(kVerdictTag);
    if (!waiting) return;
    const std::vector<std::byte>& frame = waiting->bytes;
    FailureNotice verdict;
    if (frame.size() < sizeof verdict) return;
    std::memcpy(&verdict, frame.data(), sizeof verdict);
    if (verdict.magic != kNoticeMagic || verdict.kind != NoticeKind::kFailure) return;
    const std::size_t text_bytes =
        std::min<std::size_t>(frame.size() - sizeof verdict, kMaxNoticeText);
    verdict_heard_ = true;
    if (op.header.collective != Collective::kSendRecv) compare_waiting(op, kAnnouncementTag);
    throw_failure(
        verdict,
        std::string(reinterpret_cast<const char*>(frame.data()) + sizeof verdict, text_bytes),
        rank_);
  }

  void retire_completed() {
    while (!operations_.empty() && operations_.front().done) {
      operations_.pop_front();
      ++requests_begin_;
    }
  }

  void post(Operation& op, int status) {
    if (status != MPI_SUCCESS) fail(op, status, op.is_send ? "MPI_Isend" : "MPI_Irecv");
  }

  void post_payload(Operation& op, std::byte* data, std::size_t bytes) {
    for (std::size_t offset = 0; offset < bytes; offset += kMaxMessageBytes) {
      const int piece = static_cast<int>(std::min(kMaxMessageBytes, bytes - offset));
      MPI_Request& request = op.requests.emplace_back(MPI_REQUEST_NULL);
      post(op, op.is_send ? MPI_Isend(data + offset, piece, MPI_BYTE, op.peer, op.payload_tag,
                                      comm_, &request)
                          : MPI_Irecv(data + offset, piece, MPI_BYTE, op.peer, op.payload_tag,
                                      comm_, &request));
    }
  }

  // Tests the operation's requests once, spinning briefly and then yielding, until the deadline.
  void progress(Operation& op) {
    const Deadline deadline(options_.timeout);
    Stopwatch spinning;
    Clock::time_point next_verdict_check = Clock::now() + std::chrono::milliseconds(1);
    while (true) {
      if (test_once(op)) return;
      if (Clock::now() >= next_verdict_check) {
        check_verdicts(op);
        next_verdict_check = Clock::now() + kVerdictCheckInterval;
      }
      if (deadline.expired()) {
        check_verdicts(op);
        compare_calls_before_timeout(op);
        ErrorContext context = context_for(op);
        throw TimeoutError(std::string("no progress for ") +
                               std::to_string(options_.timeout.count() / 1000.0) + " s while " +
                               (op.is_send ? "sending to" : "receiving from") + " rank " +
                               std::to_string(op.peer) + " (COLTRAIN_TIMEOUT)",
                           context);
      }
      // Ranks that outnumber the cores give the core away between polls after a short spin.
      if (shares_cores_ && spinning.microseconds() > 50.0) std::this_thread::yield();
    }
  }

  // Before a timeout: ranks whose calls take different paths (tree against ring, two roots of a
  // reduce) can wait on each other before any posted receive meets a header that shows the
  // difference. So this rank compares its call with (1) the headers of this collective (same
  // sequence number) that reached it but that no receive of it took, and (2) the calls the other
  // ranks announce when they time out too: it announces its own to every rank, then reads the
  // announcements for a short while (a quarter of the timeout, at most 1 s). The last rank of a
  // deadlock to time out finds the others' announcements waiting. Throws MismatchError naming the
  // first field that differs; the timeout breaks the transport anyway, so taking those messages
  // costs nothing.
  void compare_calls_before_timeout(const Operation& op) {
    if (op.header.collective == Collective::kSendRecv) return;
    compare_waiting(op, kHeaderTag);
    announced_ = std::make_unique<MessageHeader>(op.header);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request& request = announcements_.emplace_back(MPI_REQUEST_NULL);
      if (MPI_Isend(announced_.get(), sizeof(MessageHeader), MPI_BYTE, peer, kAnnouncementTag,
                    comm_, &request) != MPI_SUCCESS) {
        announcements_.pop_back();
      }
    }
    const Deadline grace(std::min<Clock::duration>(std::chrono::seconds(1), options_.timeout / 4));
    for (int heard = 0; heard < size_ - 1 && !grace.expired();) {
      heard += compare_waiting(op, kAnnouncementTag);
      check_verdicts(op);  // a rank that named the difference first
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // Takes the messages waiting on `tag` (headers or announcements) and throws MismatchError if one
  // is of op's collective (same sequence) but another call. Bounded by a count, as a live peer may
  // keep sending. Returns how many it took.
  int compare_waiting(const Operation& op, int tag) {
    constexpr int kMostMessages = 4096;
    int taken = 0;
    for (; taken < kMostMessages; ++taken) {
      const std::optional<WaitingMessage> waiting = take_waiting(tag);
      if (!waiting) break;
      MessageHeader header;
      if (waiting->bytes.size() < sizeof header) continue;
      std::memcpy(&header, waiting->bytes.data(), sizeof header);
      if (header.magic == kMessageMagic && header.sequence == op.header.sequence)
        check_same_call(op.header, header, rank_, waiting->source);
    }
    return taken;
  }

  struct WaitingMessage {
    std::vector<std::byte> bytes;
    int source = -1;
  };

  // Receives one message that waits on `tag`, from any rank, if there is one.
  std::optional<WaitingMessage> take_waiting(int tag) {
    int found = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, tag, comm_, &found, &message, &status) != MPI_SUCCESS ||
        !found) {
      return std::nullopt;
    }
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    WaitingMessage waiting{std::vector<std::byte>(static_cast<std::size_t>(std::max(bytes, 0))),
                           status.MPI_SOURCE};
    if (MPI_Mrecv(waiting.bytes.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS) {
      return std::nullopt;
    }
    return waiting;
  }

  // At destruction: the announcements of a timed-out call and the verdict of a failed one are
  // small and sent at once in practice; one that still is not complete is released to MPI with
  // its buffer left allocated on purpose (as abandon_pending does with frames).
  void release_control_sends() noexcept {
    if (!release_sends(announcements_)) static_cast<void>(announced_.release());
    if (!release_sends(verdicts_) && verdict_message_) {
      new std::vector<std::byte>(std::move(*verdict_message_));  // leaked, see above
    }
  }

  // Waits up to 200 ms for `requests`, frees those still pending; whether all completed.
  static bool release_sends(std::vector<MPI_Request>& requests) noexcept {
    const Deadline deadline(std::chrono::milliseconds(200));
    bool all_complete = true;
    for (MPI_Request& request : requests) {
      int flag = 0;
      while (!flag && !deadline.expired()) MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        MPI_Request_free(&request);
        all_complete = false;
      }
    }
    requests.clear();
    return all_complete;
  }

  // Tests the operation's requests in order; marks it done once all are. Returns op.done.
  bool test_once(Operation& op) {
    // By index: receiving the header may append the payload's requests.
    for (std::size_t i = 0; i < op.requests.size(); ++i) {
      if (op.requests[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status status;
      const int rc = MPI_Test(&op.requests[i], &flag, &status);
      if (rc != MPI_SUCCESS) fail(op, rc, "MPI_Test");
      if (!flag) return false;
      if (!op.is_send && i == 0) on_header_received(op, status);
    }
    op.done = true;
    return true;
  }

  void on_header_received(Operation& op, const MPI_Status& status) {
    if (op.header_checked) return;
    op.header_checked = true;
    int received = 0;
    MPI_Get_count(&status, MPI_BYTE, &received);
    MessageHeader header;
    if (static_cast<std::size_t>(received) < sizeof header) {
      throw MismatchError("rank " + std::to_string(op.peer) + " sent a " +
                              std::to_string(received) +
                              "-byte message where a coltrain header was expected",
                          context_for(op));
    }
    std::memcpy(&header, op.frame.data(), sizeof header);
    check_header(op.header, header, rank_, op.peer);
    const std::size_t bytes = op.payload.size();
    if (bytes <= kPackedPayloadLimit) {
      if (static_cast<std::size_t>(received) != sizeof header + bytes) {
        throw MismatchError("rank " + std::to_string(op.peer) + " sent " +
                                std::to_string(received - static_cast<int>(sizeof header)) +
                                " payload bytes, expected " + std::to_string(bytes),
                            context_for(op));
      }
      if (bytes != 0) std::memcpy(op.payload.data(), op.frame.data() + sizeof header, bytes);
    } else {
      post_payload(op, op.payload.data(), bytes);
    }
  }

  ErrorContext context_for(const Operation& op) const {
    ErrorContext context;
    context.rank = rank_;
    context.peer = op.peer;
    context.operation = std::string(name_of(op.header.collective));
    context.sequence = op.header.sequence;
    return context;
  }

  [[noreturn]] void fail(const Operation& op, int status, const char* call) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(status, text, &length);
    ErrorContext context = context_for(op);
    const std::string message = std::string(call) + " failed: " + std::string(text, length);
    broken_ = message;
    throw BackendError("MPI", status, message, context);
  }

  // After an error or at destruction: no pending receive may later write into freed memory. Cancel
  // what is pending and wait briefly; requests that still do not complete (a send the peer never
  // takes) are released to MPI, and their frames are left allocated on purpose.
  void abandon_pending() noexcept {
    const Deadline deadline(std::chrono::seconds(1));
    bool all_complete = true;
    for (Operation& op : operations_) {
      for (MPI_Request& request : op.requests) {
        if (request == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&request);
        int flag = 0;
        while (!flag && !deadline.expired()) MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
        if (!flag) {
          MPI_Request_free(&request);
          all_complete = false;
        }
      }
    }
    if (!all_complete) new std::deque<Operation>(std::move(operations_));  // see above: leaked
    operations_.clear();
  }

  void throw_if_broken() const {
    if (!broken_.empty()) {
      throw CommError("communicator is unusable after an earlier error: " + broken_);
    }
  }

  CommOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::deque<Operation> operations_;  // in posting order; completed ones retire from the front
  std::size_t requests_begin_ = 0;    // Request index of operations_.front()
  std::string broken_;
  std::unique_ptr<MessageHeader> announced_;  // this rank's call, announced when it timed out
  std::vector<MPI_Request> announcements_;
  std::optional<std::vector<std::byte>> verdict_message_;  // this rank's verdict, being sent
  std::vector<MPI_Request> verdicts_;
  bool verdict_heard_ = false;  // the transport broke on another rank's verdict
  bool shares_cores_ = false;
  HostLayout hosts_;
};

static_assert(Transport<MpiTransport>);

}  // namespace coltrain::comm
