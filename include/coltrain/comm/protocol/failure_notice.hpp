#pragma once
// Failure notices: the control messages with which ranks tell each other which rank failed first
// and how, so that every survivor's error names the root cause ("rank 3 died (connection reset)
// during allreduce #812; seen first by rank 2") instead of the neighbour it lost, or a timeout.
//
// Over TCP a notice travels in place of a message header: the same 40 bytes, told apart by its
// magic, then `text_bytes` of text (the first detector's own account). Over MPI only verdicts
// travel, as messages of their own (mpi_transport.hpp). Three kinds:
// - kFailure: the verdict. A rank that receives one fails with it and passes it on to every peer
//   it can still reach before it closes its connections.
// - kSuspect: a rank that timed out asks every rank whether it is alive; the one that never
//   answers, at the end of the chain of ranks waiting on each other, is the hung one (SIGSTOP).
// - kAlive: the answer: alive, and waiting on rank `waiting_on`; its text is the message header
//   of the call it is in, so that ranks whose calls differ in a way no message showed (they
//   deadlocked first) learn which field differs.

#include <coltrain/comm/types.hpp>
#include <coltrain/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>

namespace coltrain::comm {

// "CTRF" in little-endian byte order (a message header's magic is "CTRN").
inline constexpr std::uint32_t kNoticeMagic = 0x46525443u;
// A notice's text is the first detector's account; longer ones are cut.
inline constexpr std::size_t kMaxNoticeText = 480;

enum class NoticeKind : std::uint8_t { kFailure = 1, kSuspect = 2, kAlive = 3 };

enum class FailureCause : std::uint8_t {
  kDied = 1,      // its connection closed or was reset: the process is gone
  kHung = 2,      // it made no progress for COLTRAIN_TIMEOUT and did not answer (stopped, hung)
  kMismatch = 3,  // two ranks called different collectives
  kError = 4,     // it stopped with an error outside the collectives (or a transport error)
};

struct FailureNotice {
  std::uint32_t magic = kNoticeMagic;
  NoticeKind kind = NoticeKind::kFailure;
  FailureCause cause = FailureCause::kError;
  Collective collective = Collective::kAllreduce;  // the call during which it was seen
  std::uint8_t reserved = 0;
  std::int32_t failed_rank = -1;
  std::int32_t seen_by = -1;     // the rank that detected it first
  std::int32_t waiting_on = -1;  // kAlive: the peer this rank's current call waits on
  std::uint32_t reserved2 = 0;
  std::uint64_t sequence = 0;    // of that call; kNoCall when there was none
  std::uint64_t text_bytes = 0;  // that follow
};
static_assert(sizeof(FailureNotice) == 40 && std::is_trivially_copyable_v<FailureNotice>);

inline constexpr std::uint64_t kNoCall = ~std::uint64_t{0};

// One line for a person: who failed, how, during which call, and who saw it first.
inline std::string describe_failure(const FailureNotice& n, const std::string& text) {
  const std::string failed = "rank " + std::to_string(n.failed_rank);
  const std::string call = n.sequence == kNoCall ? std::string("before its first collective")
                                                 : std::string(name_of(n.collective)) + " #" +
                                                       std::to_string(n.sequence);
  const std::string seen = "; seen first by rank " + std::to_string(n.seen_by);
  const std::string detail = text.empty() ? "" : ": " + text;
  switch (n.cause) {
    case FailureCause::kDied:
      return failed + " died during " + call + seen + detail;
    case FailureCause::kHung:
      return failed + " made no progress during " + call + " (stopped, hung, or busy outside the " +
             "collectives)" + seen + detail;
    case FailureCause::kMismatch:
      return "ranks called different collectives during " + call + seen + detail;
    case FailureCause::kError:
      break;
  }
  return failed + " stopped with an error" +
         (n.sequence == kNoCall ? std::string() : " at or after " + call) +
         (n.seen_by == n.failed_rank ? std::string() : seen) + detail;
}

// Fills in whom `verdict` (kind, call and seen_by already set) blames for `cause`, the error with
// which the detecting rank's own call failed: the peer its error names when the error says that
// peer died, hung or disagreed; else the detecting rank itself (kError).
inline void blame_for(FailureNotice& verdict, const std::exception& cause) {
  verdict.cause = FailureCause::kError;
  verdict.failed_rank = verdict.seen_by;
  const auto* error = dynamic_cast<const Error*>(&cause);
  const int peer = error != nullptr ? error->context().peer.value_or(-1) : -1;
  if (peer < 0) return;
  if (dynamic_cast<const PeerLostError*>(&cause) != nullptr) {
    verdict.cause = FailureCause::kDied;
  } else if (dynamic_cast<const TimeoutError*>(&cause) != nullptr) {
    verdict.cause = FailureCause::kHung;
  } else if (dynamic_cast<const MismatchError*>(&cause) != nullptr) {
    verdict.cause = FailureCause::kMismatch;
  } else {
    return;
  }
  verdict.failed_rank = peer;
}

// The error a survivor throws for a verdict: the class follows the cause, so code that catches
// PeerLostError or TimeoutError keeps working; the context names the failed rank as the peer.
[[noreturn]] inline void throw_failure(const FailureNotice& n, const std::string& text, int rank) {
  ErrorContext context;
  context.rank = rank;
  context.peer = n.failed_rank;
  context.operation = std::string(name_of(n.collective));
  if (n.sequence != kNoCall) context.sequence = n.sequence;
  const std::string message = describe_failure(n, text);
  switch (n.cause) {
    case FailureCause::kDied:
      throw PeerLostError(message, context);
    case FailureCause::kHung:
      throw TimeoutError(message, context);
    case FailureCause::kMismatch:
      throw MismatchError(message, context);
    case FailureCause::kError:
      break;
  }
  throw CommError(message, context);
}

}  // namespace coltrain::comm
