#pragma once
// FailureDetector: one rank's side of the failure-detection protocol (failure_notice.hpp), apart
// from the transport that carries its notices. It holds what the rank knows: the call in progress,
// the verdict it fails with (the first that reached it), and during an inquiry the answers of the
// other ranks; from those answers it names the rank to blame. The TCP transport moves the notices
// (tcp_transport.hpp): it queues what this class writes and hands over what arrives.
//
// An inquiry, after a timeout without progress: every rank is asked whether it is alive and whom
// it waits on. Following the chain of waiting from the awaited peer, the first rank that died or
// did not answer is the one to blame, a stopped rank rather than its blocked neighbour; a chain
// that comes back to a visited rank is alive ranks waiting on each other, whose calls do not
// match. An answer carries the call the rank is in, so that a rank in the same collective with
// another algorithm, root or op is named in a MismatchError even when no message showed it.

#include <coltrain/comm/protocol/failure_notice.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/error.hpp>

#include <cstddef>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::comm {

class FailureDetector {
 public:
  FailureDetector(int rank, int size) : rank_(rank), size_(size) {}

  // The call this rank is in: its last message posted. Notices name it.
  void set_call(const MessageHeader& call) { call_ = call; }
  const std::optional<MessageHeader>& call() const { return call_; }

  // A notice from this rank about its current call.
  FailureNotice notice(NoticeKind kind) const {
    FailureNotice n;
    n.kind = kind;
    n.seen_by = rank_;
    n.collective = call_ ? call_->collective : Collective::kAllreduce;
    n.sequence = call_ ? call_->sequence : kNoCall;
    return n;
  }

  // The verdict this rank fails with, once one has arrived (the first one counts).
  const std::optional<FailureNotice>& verdict() const { return verdict_; }
  const std::string& verdict_text() const { return verdict_text_; }
  void throw_verdict_if_any() const {
    if (verdict_) throw_failure(*verdict_, verdict_text_, rank_);
  }

  // Takes a verdict a peer left outside its stream as it broke down (a frame of notice and text,
  // checked as any notice is); returns whether it became this rank's verdict.
  bool take_last_words(std::span<const std::byte> frame) {
    FailureNotice n;
    if (verdict_ || frame.size() < sizeof n) return false;
    std::memcpy(&n, frame.data(), sizeof n);
    if (n.magic != kNoticeMagic || n.kind != NoticeKind::kFailure ||
        n.text_bytes != frame.size() - sizeof n)
      return false;
    adopt(n, std::string(reinterpret_cast<const char*>(frame.data()) + sizeof n,
                         static_cast<std::size_t>(n.text_bytes)));
    return true;
  }

  // What to send back for a notice: an answer to a kSuspect, with its text (valid until this
  // detector is destroyed).
  struct Reply {
    FailureNotice notice;
    std::span<const std::byte> text;
  };

  // Acts on a notice from `peer` with its text: a verdict is kept (the first one), an answer is
  // recorded for the inquiry in progress, and a question gets the reply returned: alive, waiting
  // on `waiting_on`, in the current call.
  std::optional<Reply> take(int peer, const FailureNotice& n, std::string text, int waiting_on) {
    switch (n.kind) {
      case NoticeKind::kFailure:
        if (!verdict_) adopt(n, std::move(text));
        return std::nullopt;
      case NoticeKind::kSuspect: {
        FailureNotice answer = notice(NoticeKind::kAlive);
        answer.waiting_on = waiting_on;
        if (!call_) return Reply{answer, {}};
        // The answer's text is this rank's call, so that the asking rank can name a field in
        // which the calls differ when the ranks deadlocked before any message showed it.
        told_calls_.push_back(*call_);
        answer.text_bytes = sizeof(MessageHeader);
        return Reply{answer, std::as_bytes(std::span(&told_calls_.back(), 1))};
      }
      case NoticeKind::kAlive:
        if (!answers_.empty()) {
          const auto index = static_cast<std::size_t>(peer);
          answers_[index] = n.waiting_on;
          if (text.size() == sizeof(MessageHeader)) {
            MessageHeader call;
            std::memcpy(&call, text.data(), sizeof call);
            answer_calls_[index] = call;
          }
        }
        return std::nullopt;
    }
    return std::nullopt;
  }

  // Starts an inquiry about `suspect`, the peer this rank's call waits on: forgets earlier
  // answers and returns the question to send to every rank.
  FailureNotice begin_inquiry(int suspect) {
    answers_.assign(static_cast<std::size_t>(size_), std::nullopt);
    answer_calls_.assign(static_cast<std::size_t>(size_), std::nullopt);
    FailureNotice ask = notice(NoticeKind::kSuspect);
    ask.failed_rank = suspect;
    return ask;
  }

  bool answered(int peer) const {
    const auto index = static_cast<std::size_t>(peer);
    return index < answers_.size() && answers_[index].has_value();
  }

  // Whether the chain of waiting from `suspect` ends, past ranks that answered, at a rank that did
  // not answer (or waits on no rank) and that this rank does not wait on itself. The last rank
  // before it waits on it directly and names it (or whom it waits on) first-hand, so this rank does
  // better to wait a while for that verdict than to blame a rank that may be alive but slow to
  // answer (a loaded machine can starve a process for longer than the inquiry lasts).
  template <class Gone>
  bool ends_beyond_suspect(int suspect, Gone&& gone) const {
    const Chain chain = follow(suspect, gone);
    return !chain.died && !chain.cycle && chain.culprit != suspect;
  }

  // Ends the inquiry about `suspect` by throwing the error that names the rank to blame, with
  // `account` (this rank's own timeout) appended: a verdict that came meanwhile; PeerLostError for
  // a dead rank on the chain of waiting (gone(rank) says whether its connections closed);
  // MismatchError for a rank in this collective with another algorithm, root or op; else
  // TimeoutError for the first rank that did not answer, or for ranks waiting on each other.
  template <class Gone>
  [[noreturn]] void conclude(int suspect, const TimeoutError& account, Gone&& gone) const {
    // A verdict that came meanwhile (held, as from a peer this call does not wait on) is the first
    // detector's account, which every rank should give: a rank along the chain that found the
    // culprit first and left would otherwise be named here for not answering.
    throw_verdict_if_any();
    const Chain chain = follow(suspect, gone);
    ErrorContext where = account.context();
    where.peer = chain.culprit;
    if (chain.died) {
      throw PeerLostError("rank " + std::to_string(chain.culprit) + " closed its connections (" +
                              chain.text + "); " + account.message(),
                          where);
    }
    check_answered_calls();
    std::string message = account.message();
    if (chain.cycle) {
      message = "alive ranks wait on each other (" + chain.text +
                "): their calls do not match (collectives called in different orders, or a "
                "receive without its send); " +
                message;
    } else {
      message = "rank " + std::to_string(chain.culprit) + " made no progress and did not answer (" +
                chain.text + "); " + message;
    }
    throw TimeoutError(message, where);
  }

 private:
  // The chain of waiting from `suspect` as the answers tell it: the rank to blame (the first that
  // died or did not answer; `suspect` for a cycle), and how the chain went, in words.
  struct Chain {
    int culprit = -1;
    bool died = false;
    bool cycle = false;
    std::string text;
  };

  template <class Gone>
  Chain follow(int suspect, Gone&& gone) const {
    Chain chain;
    chain.culprit = suspect;
    chain.text = "rank " + std::to_string(rank_) + " waits on rank " + std::to_string(suspect);
    std::vector<bool> visited(static_cast<std::size_t>(size_), false);
    for (int current = suspect;;) {
      const auto index = static_cast<std::size_t>(current);
      if (current == rank_ || visited[index]) {  // alive ranks waiting on each other
        chain.culprit = suspect;
        chain.cycle = true;
        return chain;
      }
      visited[index] = true;
      chain.culprit = current;
      if (gone(current)) {
        chain.died = true;
        return chain;
      }
      const std::optional<int> next = index < answers_.size() ? answers_[index] : std::nullopt;
      if (!next || *next < 0 || *next >= size_) return chain;
      current = *next;
      chain.text += ", which waits on rank " + std::to_string(current);
    }
  }

  void adopt(const FailureNotice& n, std::string text) {
    verdict_ = n;
    verdict_text_ = std::move(text);
  }

  // Throws MismatchError if a rank that answered is in this rank's collective (same sequence
  // number) with another algorithm, root, op... Ranks whose calls take different paths (tree
  // against ring, two roots of a reduce) can wait on each other before any message shows the
  // difference; this names it instead of a timeout.
  void check_answered_calls() const {
    if (!call_ || call_->collective == Collective::kSendRecv) return;
    for (int peer = 0; peer < static_cast<int>(answer_calls_.size()); ++peer) {
      const std::optional<MessageHeader>& call = answer_calls_[static_cast<std::size_t>(peer)];
      if (call && call->magic == kMessageMagic && call->collective != Collective::kSendRecv &&
          call->sequence == call_->sequence) {
        check_same_call(*call_, *call, rank_, peer);
      }
    }
  }

  int rank_;
  int size_;
  std::optional<MessageHeader> call_;
  std::optional<FailureNotice> verdict_;
  std::string verdict_text_;
  std::vector<std::optional<int>> answers_;  // during an inquiry: whom each rank waits on
  std::vector<std::optional<MessageHeader>> answer_calls_;  // and the call it is in
  // The calls this rank told in its answers: the queued answers' text. 40 bytes per inquiry
  // answered, and inquiries come only after a whole timeout without progress.
  std::deque<MessageHeader> told_calls_;
};

}  // namespace coltrain::comm
