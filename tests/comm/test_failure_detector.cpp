// The failure detector alone, without a transport: the notices it writes, the verdict it keeps,
// the answers it gives and records, and whom an inquiry blames along the chain of waiting. The
// transports' failure tests (test_failure_naming.cpp and others) run the same protocol over
// sockets, with processes killed and stopped.
#include <catch2/catch.hpp>

#include <coltrain/comm/protocol/failure_detector.hpp>
#include <coltrain/comm/protocol/failure_notice.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/core/error.hpp>

#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;

namespace {

MessageHeader allreduce_call(std::uint64_t sequence, Algorithm algorithm = Algorithm::kRing) {
  MessageHeader call;
  call.collective = Collective::kAllreduce;
  call.algorithm = algorithm;
  call.sequence = sequence;
  call.count = 1024;
  call.bytes = 4096;
  return call;
}

// An answer from `from` (alive, waiting on `waiting_on`), with the call it is in as its text.
FailureNotice alive(int from, int waiting_on) {
  FailureNotice n;
  n.kind = NoticeKind::kAlive;
  n.seen_by = from;
  n.waiting_on = waiting_on;
  return n;
}

std::string call_text(const MessageHeader& call) {
  std::string text(sizeof call, '\0');
  std::memcpy(text.data(), &call, sizeof call);
  return text;
}

TimeoutError own_timeout(int rank, int peer) {
  ErrorContext where;
  where.rank = rank;
  where.peer = peer;
  where.operation = "allreduce";
  return TimeoutError("rank " + std::to_string(rank) + " made no progress", where);
}

// What conclude() throws, as the exception's class and message.
struct Conclusion {
  std::string kind;
  std::string message;
  std::optional<int> peer;
};

template <class Gone>
Conclusion conclude(const FailureDetector& detector, int suspect, int rank, Gone gone) {
  try {
    detector.conclude(suspect, own_timeout(rank, suspect), gone);
  } catch (const PeerLostError& e) {
    return {"lost", e.what(), e.context().peer};
  } catch (const MismatchError& e) {
    return {"mismatch", e.what(), e.context().peer};
  } catch (const TimeoutError& e) {
    return {"timeout", e.what(), e.context().peer};
  } catch (const CommError& e) {
    return {"comm", e.what(), e.context().peer};
  }
  FAIL("conclude returned");
  return {};
}

const auto nobody_gone = [](int) { return false; };

}  // namespace

TEST_CASE("FailureDetector: notices name this rank and its current call", "[failure][detector]") {
  FailureDetector detector(2, 4);
  FailureNotice before = detector.notice(NoticeKind::kFailure);
  CHECK(before.seen_by == 2);
  CHECK(before.sequence == kNoCall);
  detector.set_call(allreduce_call(17));
  const FailureNotice during = detector.notice(NoticeKind::kSuspect);
  CHECK(during.kind == NoticeKind::kSuspect);
  CHECK(during.magic == kNoticeMagic);
  CHECK(during.sequence == 17);
  CHECK(during.collective == Collective::kAllreduce);
}

TEST_CASE("FailureDetector: the first verdict counts and is thrown with its cause's class",
          "[failure][detector]") {
  FailureDetector detector(0, 3);
  CHECK_NOTHROW(detector.throw_verdict_if_any());
  FailureNotice first;
  first.cause = FailureCause::kDied;
  first.failed_rank = 2;
  first.seen_by = 1;
  first.sequence = 5;
  FailureNotice second = first;
  second.cause = FailureCause::kHung;
  second.failed_rank = 1;
  CHECK_FALSE(detector.take(1, first, "connection reset", -1).has_value());
  CHECK_FALSE(detector.take(2, second, "later", -1).has_value());
  REQUIRE(detector.verdict().has_value());
  CHECK(detector.verdict()->failed_rank == 2);
  CHECK(detector.verdict_text() == "connection reset");
  try {
    detector.throw_verdict_if_any();
    FAIL("no throw");
  } catch (const PeerLostError& e) {
    CHECK(e.context().peer == 2);
    CHECK(std::string(e.what()).find("rank 2 died during allreduce #5") != std::string::npos);
    CHECK(std::string(e.what()).find("seen first by rank 1") != std::string::npos);
  }
}

TEST_CASE("FailureDetector: a question gets alive, whom this rank waits on, and its call",
          "[failure][detector]") {
  FailureDetector idle(1, 3);
  FailureNotice ask;
  ask.kind = NoticeKind::kSuspect;
  const auto no_call = idle.take(0, ask, "", 2);
  REQUIRE(no_call.has_value());
  CHECK(no_call->notice.kind == NoticeKind::kAlive);
  CHECK(no_call->notice.waiting_on == 2);
  CHECK(no_call->notice.text_bytes == 0);
  CHECK(no_call->text.empty());

  FailureDetector busy(1, 3);
  const MessageHeader call = allreduce_call(9, Algorithm::kTree);
  busy.set_call(call);
  const auto reply = busy.take(0, ask, "", 0);
  REQUIRE(reply.has_value());
  CHECK(reply->notice.seen_by == 1);
  CHECK(reply->notice.sequence == 9);
  REQUIRE(reply->text.size() == sizeof(MessageHeader));
  CHECK(reply->notice.text_bytes == reply->text.size());
  MessageHeader told;
  std::memcpy(&told, reply->text.data(), sizeof told);
  CHECK(told.algorithm == Algorithm::kTree);
  CHECK(told.sequence == 9);
  // A second answer keeps the first one's text valid: both may still be queued.
  busy.set_call(allreduce_call(10));
  const auto later = busy.take(2, ask, "", 0);
  REQUIRE(later.has_value());
  std::memcpy(&told, reply->text.data(), sizeof told);
  CHECK(told.sequence == 9);
}

TEST_CASE("FailureDetector: an inquiry blames the first rank along the chain that did not answer",
          "[failure][detector]") {
  // Rank 0 waits on 1, which waits on 2, which waits on 3; 3 does not answer (stopped).
  FailureDetector detector(0, 5);
  detector.set_call(allreduce_call(3));
  const FailureNotice ask = detector.begin_inquiry(1);
  CHECK(ask.kind == NoticeKind::kSuspect);
  CHECK(ask.failed_rank == 1);
  detector.take(1, alive(1, 2), "", -1);
  detector.take(2, alive(2, 3), "", -1);
  detector.take(4, alive(4, 0), "", -1);
  CHECK(detector.answered(1));
  CHECK(detector.answered(4));
  CHECK_FALSE(detector.answered(3));
  const Conclusion c = conclude(detector, 1, 0, nobody_gone);
  CHECK(c.kind == "timeout");
  CHECK(c.peer == 3);
  CHECK(c.message.find("rank 3 made no progress and did not answer (rank 0 waits on rank 1, which "
                       "waits on rank 2, which waits on rank 3)") != std::string::npos);
  CHECK(c.message.find("rank 0 made no progress") != std::string::npos);  // the own account
}

TEST_CASE(
    "FailureDetector: a silent rank past the awaited one is left to the rank that waits on it",
    "[failure][detector]") {
  // Rank 0 waits on 1, which waits on 2; 2 has not answered. Rank 1 waits on 2 directly and names
  // it first-hand (or whom 2 turns out to wait on): rank 0 waits for that verdict.
  FailureDetector far(0, 4);
  far.begin_inquiry(1);
  far.take(1, alive(1, 2), "", -1);
  CHECK(far.ends_beyond_suspect(1, nobody_gone));
  // 2 answers late, waiting on 3, which is silent: still another rank's call.
  far.take(2, alive(2, 3), "", -1);
  CHECK(far.ends_beyond_suspect(1, nobody_gone));
  CHECK(conclude(far, 1, 0, nobody_gone).peer == 3);  // what is said when no verdict comes

  // The awaited rank itself silent: this rank is the one to name it.
  FailureDetector near(0, 4);
  near.begin_inquiry(1);
  CHECK_FALSE(near.ends_beyond_suspect(1, nobody_gone));

  // A dead rank on the chain, or a cycle of alive ranks, is known at once.
  FailureDetector dead(0, 4);
  dead.begin_inquiry(1);
  dead.take(1, alive(1, 2), "", -1);
  CHECK_FALSE(dead.ends_beyond_suspect(1, [](int rank) { return rank == 2; }));
  FailureDetector cycle(0, 3);
  cycle.begin_inquiry(1);
  cycle.take(1, alive(1, 2), "", -1);
  cycle.take(2, alive(2, 0), "", -1);
  CHECK_FALSE(cycle.ends_beyond_suspect(1, nobody_gone));
}

TEST_CASE("FailureDetector: a dead rank along the chain is named as lost", "[failure][detector]") {
  FailureDetector detector(0, 4);
  detector.begin_inquiry(1);
  detector.take(1, alive(1, 3), "", -1);
  const Conclusion c = conclude(detector, 1, 0, [](int rank) { return rank == 3; });
  CHECK(c.kind == "lost");
  CHECK(c.peer == 3);
  CHECK(c.message.find("rank 3 closed its connections (rank 0 waits on rank 1, which waits on "
                       "rank 3)") != std::string::npos);
}

TEST_CASE("FailureDetector: alive ranks waiting on each other are a cycle, not a hung rank",
          "[failure][detector]") {
  FailureDetector detector(0, 3);
  detector.begin_inquiry(1);
  detector.take(1, alive(1, 2), "", -1);
  detector.take(2, alive(2, 0), "", -1);
  const Conclusion back_to_me = conclude(detector, 1, 0, nobody_gone);
  CHECK(back_to_me.kind == "timeout");
  CHECK(back_to_me.peer == 1);
  CHECK(back_to_me.message.find("alive ranks wait on each other") != std::string::npos);

  FailureDetector loop(0, 4);
  loop.begin_inquiry(1);
  loop.take(1, alive(1, 2), "", -1);
  loop.take(2, alive(2, 1), "", -1);
  const Conclusion c = conclude(loop, 1, 0, nobody_gone);
  CHECK(c.message.find("alive ranks wait on each other") != std::string::npos);
}

TEST_CASE(
    "FailureDetector: a waited-on rank out of range ends the chain instead of indexing past it",
    "[failure][detector]") {
  FailureDetector detector(0, 3);
  detector.begin_inquiry(1);
  detector.take(1, alive(1, 7), "", -1);
  const Conclusion c = conclude(detector, 1, 0, nobody_gone);
  CHECK(c.kind == "timeout");
  CHECK(c.peer == 1);
}

TEST_CASE("FailureDetector: an answer in this collective with another algorithm is a mismatch",
          "[failure][detector]") {
  FailureDetector detector(0, 3);
  detector.set_call(allreduce_call(4, Algorithm::kRing));
  detector.begin_inquiry(1);
  detector.take(1, alive(1, 0), call_text(allreduce_call(4, Algorithm::kTree)), -1);
  detector.take(2, alive(2, 0), call_text(allreduce_call(4, Algorithm::kRing)), -1);
  const Conclusion c = conclude(detector, 1, 0, nobody_gone);
  CHECK(c.kind == "mismatch");
  CHECK(c.peer == 1);

  // The same answers about another call (an earlier sequence number) prove nothing.
  FailureDetector later(0, 3);
  later.set_call(allreduce_call(5, Algorithm::kRing));
  later.begin_inquiry(1);
  later.take(1, alive(1, 0), call_text(allreduce_call(4, Algorithm::kTree)), -1);
  CHECK(conclude(later, 1, 0, nobody_gone).kind == "timeout");
}

TEST_CASE("FailureDetector: a verdict that came during the inquiry is thrown instead of a blame",
          "[failure][detector]") {
  FailureDetector detector(0, 3);
  detector.begin_inquiry(1);
  FailureNotice verdict;
  verdict.cause = FailureCause::kHung;
  verdict.failed_rank = 2;
  verdict.seen_by = 1;
  verdict.sequence = 8;
  detector.take(1, verdict, "stopped", -1);
  const Conclusion c = conclude(detector, 1, 0, nobody_gone);
  CHECK(c.kind == "timeout");
  CHECK(c.peer == 2);
  CHECK(c.message.find("seen first by rank 1") != std::string::npos);
}

TEST_CASE("FailureDetector: last words are taken only when they are a whole, well-formed verdict",
          "[failure][detector]") {
  FailureNotice n;
  n.cause = FailureCause::kDied;
  n.failed_rank = 3;
  n.seen_by = 2;
  const std::string text = "connection reset by peer";
  n.text_bytes = text.size();
  std::vector<std::byte> frame(sizeof n + text.size());
  std::memcpy(frame.data(), &n, sizeof n);
  std::memcpy(frame.data() + sizeof n, text.data(), text.size());

  FailureDetector detector(0, 4);
  CHECK_FALSE(detector.take_last_words({}));
  CHECK_FALSE(detector.take_last_words(std::span(frame).first(sizeof n + 3)));  // cut short
  std::vector<std::byte> wrong_magic = frame;
  wrong_magic[0] = std::byte{0};
  CHECK_FALSE(detector.take_last_words(wrong_magic));
  std::vector<std::byte> question = frame;
  FailureNotice ask = n;
  ask.kind = NoticeKind::kSuspect;
  std::memcpy(question.data(), &ask, sizeof ask);
  CHECK_FALSE(detector.take_last_words(question));
  CHECK_FALSE(detector.verdict().has_value());

  CHECK(detector.take_last_words(frame));
  REQUIRE(detector.verdict().has_value());
  CHECK(detector.verdict()->failed_rank == 3);
  CHECK(detector.verdict_text() == text);
  CHECK_FALSE(detector.take_last_words(frame));  // the first verdict stays
}
