// The shared-memory channel's rings, both ends in this process: a segment created and opened as
// two ranks do, a socket pair as the doorbell connection.
#include <catch2/catch.hpp>

#include <coltrain/comm/transport/shm/shm_channel.hpp>
#include <coltrain/comm/transport/tcp/tcp_peer_channel.hpp>
#include <coltrain/core/host_memory.hpp>

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using coltrain::comm::detail::create_segment;
using coltrain::comm::detail::fresh_segment_name;
using coltrain::comm::detail::kShmMinRingBytes;
using coltrain::comm::detail::kShmPage;
using coltrain::comm::detail::kShmReferences;
using coltrain::comm::detail::open_segment;
using coltrain::comm::detail::reads_memory_of;
using coltrain::comm::detail::ShmMapping;
using coltrain::comm::detail::ShmRingState;
using coltrain::comm::detail::ShmSingleCopy;
using coltrain::comm::detail::ShmStream;
using coltrain::comm::detail::single_copy_probe;

constexpr std::size_t kRing = kShmMinRingBytes;
constexpr std::uint64_t kNonce = 0x1234abcd5678ef90ull;

// Both ends of one pair's channel, as the lower (`low`) and higher (`high`) rank hold them.
struct Pair {
  std::array<int, 2> sockets{-1, -1};
  std::string name;
  std::unique_ptr<ShmStream> low, high;
  ShmMapping spy;  // a third mapping, to look at and tamper with the rings' counters

  // `single_copy_bytes` > 0: the lower end sends pieces of that size or more by reference, read
  // back by the higher end from this very process.
  explicit Pair(std::size_t single_copy_bytes = 0) {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sockets.data()) == 0);
    std::mt19937_64 random(42);
    name = fresh_segment_name(random);
    auto created = create_segment(name, kRing, kNonce);
    std::string why;
    auto opened = open_segment(name, kRing, kNonce, why);
    REQUIRE(opened);
    spy = open_segment(name, kRing, kNonce, why);
    REQUIRE(spy);
    ::shm_unlink(name.c_str());
    low = std::make_unique<ShmStream>(std::move(created), true, sockets[0],
                                      ShmSingleCopy{::getpid(), single_copy_bytes});
    high = std::make_unique<ShmStream>(std::move(opened), false, sockets[1],
                                       ShmSingleCopy{::getpid(), 0});
  }
  ~Pair() {
    for (int fd : sockets)
      if (fd >= 0) ::close(fd);
  }
};

ssize_t send_bytes(ShmStream& stream, const std::vector<std::byte>& bytes) {
  const iovec one{const_cast<std::byte*>(bytes.data()), bytes.size()};
  return stream.send(&one, 1);
}

ssize_t receive_bytes(ShmStream& stream, std::vector<std::byte>& into) {
  const iovec one{into.data(), into.size()};
  return stream.receive(&one, 1);
}

std::vector<std::byte> pattern(std::size_t bytes, unsigned seed) {
  std::vector<std::byte> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return out;
}

// Whether this process may read its own memory through process_vm_readv (a seccomp profile may
// refuse the call): the single-copy cases need it, and say so where they cannot run.
bool single_copy_runs_here() {
  const auto& word = single_copy_probe();
  if (reads_memory_of(::getpid(), reinterpret_cast<std::uintptr_t>(&word), word)) return true;
  WARN(
      "skipped part: process_vm_readv is refused here (seccomp?): this single-copy case does "
      "not run");
  return false;
}

// Bytes waiting on a non-blocking socket.
std::size_t doorbells_on(int fd) {
  std::array<char, 64> scratch;
  std::size_t total = 0;
  ssize_t got = 0;
  while ((got = ::recv(fd, scratch.data(), scratch.size(), MSG_DONTWAIT)) > 0)
    total += static_cast<std::size_t>(got);
  return total;
}

}  // namespace

TEST_CASE("shared-memory rings carry bytes both ways, across the wrap, gathered and scattered",
          "[comm][shm]") {
  Pair pair;
  REQUIRE(pair.low->ring_bytes() == kRing);
  std::size_t sent_total = 0;
  // Messages of sizes that do not divide the ring, so that copies wrap at every offset.
  for (unsigned round = 0; round < 40; ++round) {
    const std::size_t size = 1 + (round * 10007) % (kRing - 1);
    const auto head = pattern(size / 3, round), tail = pattern(size - size / 3, round + 7);
    const std::array<iovec, 2> gather{iovec{const_cast<std::byte*>(head.data()), head.size()},
                                      iovec{const_cast<std::byte*>(tail.data()), tail.size()}};
    REQUIRE(pair.low->send(gather.data(), gather.size()) == static_cast<ssize_t>(size));
    std::vector<std::byte> first(size / 2), second(size - size / 2);
    const std::array<iovec, 2> scatter{iovec{first.data(), first.size()},
                                       iovec{second.data(), second.size()}};
    REQUIRE(pair.high->receive(scatter.data(), scatter.size()) == static_cast<ssize_t>(size));
    std::vector<std::byte> whole = first;
    whole.insert(whole.end(), second.begin(), second.end());
    std::vector<std::byte> expected = head;
    expected.insert(expected.end(), tail.begin(), tail.end());
    REQUIRE(whole == expected);
    // The other direction, the same way.
    REQUIRE(send_bytes(*pair.high, expected) == static_cast<ssize_t>(size));
    std::vector<std::byte> back(size);
    REQUIRE(receive_bytes(*pair.low, back) == static_cast<ssize_t>(size));
    REQUIRE(back == expected);
    sent_total += size;
  }
  CHECK(sent_total > 4 * kRing);
}

TEST_CASE("a full ring takes what fits and then nothing, an empty one gives nothing",
          "[comm][shm]") {
  Pair pair;
  std::vector<std::byte> into(16);
  errno = 0;
  CHECK(receive_bytes(*pair.high, into) == -1);
  CHECK(errno == EAGAIN);
  const auto big = pattern(kRing + 1000, 3);
  CHECK(send_bytes(*pair.low, big) == static_cast<ssize_t>(kRing));  // what fits
  errno = 0;
  CHECK(send_bytes(*pair.low, big) == -1);
  CHECK(errno == EAGAIN);
  std::vector<std::byte> all(kRing + 1000);
  CHECK(receive_bytes(*pair.high, all) == static_cast<ssize_t>(kRing));
  CHECK(std::equal(all.begin(), all.begin() + kRing, big.begin()));
  // A notice goes whole or not at all.
  CHECK(pair.low->send_whole(std::as_bytes(std::span(big.data(), kRing - 10))));
  CHECK_FALSE(pair.low->send_whole(std::as_bytes(std::span(big.data(), 11))));
}

TEST_CASE("a sleeping side is woken by one doorbell byte, and only a sleeping side",
          "[comm][shm]") {
  Pair pair;
  const auto message = pattern(100, 1);
  std::vector<std::byte> into(100);
  // Nobody sleeps: no doorbell.
  REQUIRE(send_bytes(*pair.low, message) == 100);
  CHECK(doorbells_on(pair.sockets[1]) == 0);
  // The reader finds bytes while it prepares to sleep: it must not sleep.
  CHECK_FALSE(pair.high->prepare_to_sleep(true, false));
  REQUIRE(receive_bytes(*pair.high, into) == 100);
  // Now the ring is empty: the reader may sleep, and the next send rings once.
  CHECK(pair.high->prepare_to_sleep(true, false));
  REQUIRE(send_bytes(*pair.low, message) == 100);
  REQUIRE(send_bytes(*pair.low, message) == 100);
  CHECK(doorbells_on(pair.sockets[1]) == 1);
  // A writer waiting on a full ring is rung when the reader makes room.
  std::vector<std::byte> drain(200);
  REQUIRE(receive_bytes(*pair.high, drain) == 200);
  const auto fill = pattern(kRing, 2);
  REQUIRE(send_bytes(*pair.low, fill) == static_cast<ssize_t>(kRing));
  CHECK(pair.low->prepare_to_sleep(false, true));
  REQUIRE(receive_bytes(*pair.high, into) == 100);
  CHECK(doorbells_on(pair.sockets[0]) == 1);
}

TEST_CASE("the peer's end is read after its last bytes, sends to it fail", "[comm][shm]") {
  Pair pair;
  const auto last = pattern(64, 9);
  REQUIRE(send_bytes(*pair.low, last) == 64);
  ::close(pair.sockets[0]);  // the lower rank's process ends: the kernel closes its socket
  pair.sockets[0] = -1;
  pair.high->answer_doorbell();
  std::vector<std::byte> into(64);
  CHECK(receive_bytes(*pair.high, into) == 64);
  CHECK(into == last);
  CHECK(receive_bytes(*pair.high, into) == 0);  // end of stream
  errno = 0;
  CHECK(send_bytes(*pair.high, last) == -1);
  CHECK(errno == EPIPE);
}

TEST_CASE("counters outside the protocol are EPROTO, and nothing is copied past the ring",
          "[comm][shm]") {
  Pair pair;
  // The lower rank's published count claims more bytes than its ring holds (a bug, or a stray
  // write into the segment).
  const auto message = pattern(10, 4);
  REQUIRE(send_bytes(*pair.low, message) == 10);
  auto& lower_to_higher = *reinterpret_cast<ShmRingState*>(pair.spy.base() + kShmPage);
  lower_to_higher.written.store(3 * kRing);
  std::vector<std::byte> into(kRing * 4);
  errno = 0;
  CHECK(receive_bytes(*pair.high, into) == -1);
  CHECK(errno == EPROTO);
  errno = 0;
  CHECK(send_bytes(*pair.low, message) == -1);
  CHECK(errno == EPROTO);
}

TEST_CASE("a segment that does not hold the creator's nonce is refused, with the reason",
          "[comm][shm]") {
  std::mt19937_64 random(7);
  const std::string name = fresh_segment_name(random);
  auto created = create_segment(name, kRing, kNonce);
  std::string why;
  CHECK_FALSE(open_segment(name, kRing, kNonce + 1, why));
  CHECK(why.find("does not hold the segment") != std::string::npos);
  why.clear();
  CHECK_FALSE(open_segment(name, kRing * 2, kNonce, why));
  CHECK(why.find("bytes, expected") != std::string::npos);
  why.clear();
  CHECK_FALSE(open_segment(name, 12345, kNonce, why));
  CHECK(why.find("out of range") != std::string::npos);
  ::shm_unlink(name.c_str());
  why.clear();
  CHECK_FALSE(open_segment(name, kRing, kNonce, why));
  CHECK(why.find("cannot open") != std::string::npos);
}

TEST_CASE("single copy: large pieces come straight from the writer's memory, in stream order",
          "[comm][shm]") {
  if (!single_copy_runs_here()) return;
  constexpr std::size_t kLarge = 4096;
  Pair pair(kLarge);
  const auto& lower_to_higher = *reinterpret_cast<const ShmRingState*>(pair.spy.base() + kShmPage);
  const auto a = pattern(100, 1), b = pattern(3 * kLarge + 5, 2), c = pattern(kLarge - 1, 3),
             d = pattern(2 * kLarge, 4);
  const std::array<iovec, 4> gather{iovec{const_cast<std::byte*>(a.data()), a.size()},
                                    iovec{const_cast<std::byte*>(b.data()), b.size()},
                                    iovec{const_cast<std::byte*>(c.data()), c.size()},
                                    iovec{const_cast<std::byte*>(d.data()), d.size()}};
  const std::size_t total = a.size() + b.size() + c.size() + d.size();
  REQUIRE(pair.low->send(gather.data(), gather.size()) == static_cast<ssize_t>(total));
  // Only the small pieces went into the ring; the large ones are references, not yet copied.
  CHECK(lower_to_higher.written.load() == a.size() + c.size());
  CHECK(pair.low->references_sent() == 2);
  CHECK(pair.low->references_done() == 0);
  // The reader takes the stream in odd-sized pieces, so that copies stop inside references.
  std::vector<std::byte> whole;
  std::vector<std::byte> piece(1000);
  while (whole.size() < total) {
    const ssize_t got = receive_bytes(*pair.high, piece);
    REQUIRE(got > 0);
    whole.insert(whole.end(), piece.begin(), piece.begin() + got);
  }
  std::vector<std::byte> expected = a;
  for (const auto* part : {&b, &c, &d}) expected.insert(expected.end(), part->begin(), part->end());
  CHECK(whole == expected);
  CHECK(pair.low->references_done() == 2);
  errno = 0;
  CHECK(receive_bytes(*pair.high, piece) == -1);
  CHECK(errno == EAGAIN);
}

TEST_CASE("single copy: a large piece the caller keeps off it goes through the ring",
          "[comm][shm]") {
  if (!single_copy_runs_here()) return;
  constexpr std::size_t kLarge = 4096;
  Pair pair(kLarge);
  const auto& lower_to_higher = *reinterpret_cast<const ShmRingState*>(pair.spy.base() + kShmPage);
  const auto a = pattern(2 * kLarge, 5), b = pattern(3 * kLarge, 6);
  const std::array<iovec, 2> gather{iovec{const_cast<std::byte*>(a.data()), a.size()},
                                    iovec{const_cast<std::byte*>(b.data()), b.size()}};
  // Bit 0 clear: a goes into the ring although it is large; b, bit 1 set, by reference.
  REQUIRE(pair.low->send(gather.data(), gather.size(), 0b10) ==
          static_cast<ssize_t>(a.size() + b.size()));
  CHECK(lower_to_higher.written.load() == a.size());
  CHECK(pair.low->references_sent() == 1);
  std::vector<std::byte> whole(a.size() + b.size());
  std::size_t got_total = 0;
  while (got_total < whole.size()) {
    std::vector<std::byte> piece(whole.size() - got_total);
    const ssize_t got = receive_bytes(*pair.high, piece);
    REQUIRE(got > 0);
    std::copy(piece.begin(), piece.begin() + got, whole.begin() + static_cast<long>(got_total));
    got_total += static_cast<std::size_t>(got);
  }
  std::vector<std::byte> expected = a;
  expected.insert(expected.end(), b.begin(), b.end());
  CHECK(whole == expected);
  CHECK(pair.low->references_done() == 1);
}

// The transport's choice, payload by payload (CommOptions::single_copy_where_it_pays).
TEST_CASE(
    "single copy pays for exchanges in their page kind's sizes, never one way, else on huge pages",
    "[comm][shm]") {
  using coltrain::comm::Algorithm;
  using coltrain::comm::CallSizeRange;
  using coltrain::comm::Collective;
  using coltrain::comm::kNoCallSizes;
  using coltrain::comm::MessageHeader;
  using coltrain::comm::detail::single_copy_pays;
  constexpr std::size_t kExchangeBytes = std::size_t{2} << 20;
  const CallSizeRange from_exchange_bytes{kExchangeBytes};
  constexpr std::size_t kBlock = 4 * coltrain::kHugePageBytes;
  auto* huge = static_cast<std::byte*>(coltrain::allocate_host_memory(kBlock));
  const std::span<const std::byte> on_huge(huge + 4096, std::size_t{1} << 20);
  const auto call = [](Collective collective, Algorithm algorithm, std::size_t bytes) {
    MessageHeader header;
    header.collective = collective;
    header.algorithm = algorithm;
    header.dtype = coltrain::DataType::kFloat32;
    header.count = bytes / 4;
    return header;
  };
  // Exchanges: in the range, by the call's size.
  for (const Collective collective : {Collective::kAllreduce, Collective::kReduceScatter,
                                      Collective::kAllgather, Collective::kAllgatherv}) {
    INFO("collective " << static_cast<int>(collective));
    for (const Algorithm algorithm : {Algorithm::kRing, Algorithm::kHalvingDoubling}) {
      CHECK(single_copy_pays(call(collective, algorithm, kExchangeBytes), on_huge,
                             from_exchange_bytes, kNoCallSizes));
      CHECK_FALSE(single_copy_pays(call(collective, algorithm, kExchangeBytes - 4), on_huge,
                                   from_exchange_bytes, kNoCallSizes));
      // A measured range that ends: not from its end on.
      const CallSizeRange middle{1 << 17, 8 << 20};
      CHECK(single_copy_pays(call(collective, algorithm, 1 << 17), on_huge, middle, kNoCallSizes));
      CHECK(single_copy_pays(call(collective, algorithm, (8 << 20) - 4), on_huge, middle,
                             kNoCallSizes));
      CHECK_FALSE(
          single_copy_pays(call(collective, algorithm, 8 << 20), on_huge, middle, kNoCallSizes));
    }
  }
  // One way: never.
  CHECK_FALSE(single_copy_pays(call(Collective::kAllreduce, Algorithm::kTree, kBlock * 64), on_huge,
                               CallSizeRange{}, CallSizeRange{}));
  for (const Collective collective : {Collective::kBroadcast, Collective::kReduce})
    CHECK_FALSE(single_copy_pays(call(collective, Algorithm::kRing, kBlock * 64), on_huge,
                                 CallSizeRange{}, CallSizeRange{}));
  // Whole blocks to one peer: at any size.
  for (const Collective collective :
       {Collective::kAlltoall, Collective::kAlltoallv, Collective::kGather, Collective::kScatter,
        Collective::kSendRecv})
    CHECK(single_copy_pays(call(collective, Algorithm::kRing, 1 << 20), on_huge,
                           from_exchange_bytes, kNoCallSizes));
  // Memory on 4 KiB pages (unless the kernel puts all memory on huge pages): exchanges in the
  // 4 KiB-page range only, whole blocks never.
  if (!coltrain::detail::transparent_huge_pages_always()) {
    const std::vector<std::byte> ordinary(std::size_t{1} << 20);
    CHECK_FALSE(single_copy_pays(call(Collective::kAlltoall, Algorithm::kRing, 1 << 20), ordinary,
                                 CallSizeRange{}, CallSizeRange{}));
    CHECK_FALSE(single_copy_pays(call(Collective::kAllreduce, Algorithm::kRing, kBlock * 64),
                                 ordinary, CallSizeRange{}, kNoCallSizes));
    CHECK(single_copy_pays(call(Collective::kAllreduce, Algorithm::kRing, 1 << 20), ordinary,
                           kNoCallSizes, CallSizeRange{1 << 17}));
    CHECK_FALSE(single_copy_pays(call(Collective::kAllreduce, Algorithm::kRing, 1 << 16), ordinary,
                                 kNoCallSizes, CallSizeRange{1 << 17}));
  }
  coltrain::free_host_memory(huge);
}

TEST_CASE("single copy: a writer with every reference slot taken waits for the reader",
          "[comm][shm]") {
  if (!single_copy_runs_here()) return;
  constexpr std::size_t kLarge = 4096;
  Pair pair(kLarge);
  const std::size_t pieces = kShmReferences + 6;
  const auto bytes = pattern(pieces * kLarge, 5);
  std::vector<iovec> gather;
  for (std::size_t i = 0; i < pieces; ++i)
    gather.push_back({const_cast<std::byte*>(bytes.data()) + i * kLarge, kLarge});
  REQUIRE(pair.low->send(gather.data(), gather.size()) ==
          static_cast<ssize_t>(kShmReferences * kLarge));
  errno = 0;
  CHECK(pair.low->send(gather.data() + kShmReferences, 6) == -1);
  CHECK(errno == EAGAIN);
  // The writer waits for a slot (the ring has room, but that does not help): it may sleep, and
  // the reader's copy rings its doorbell. Likewise when it awaits the copy of reference 1.
  CHECK(pair.low->prepare_to_sleep(false, true));
  CHECK(pair.low->prepare_to_sleep(false, false, 1));
  std::vector<std::byte> first(kLarge);
  REQUIRE(receive_bytes(*pair.high, first) == static_cast<ssize_t>(kLarge));
  CHECK(doorbells_on(pair.sockets[0]) == 1);
  CHECK_FALSE(pair.low->prepare_to_sleep(false, true));
  CHECK_FALSE(pair.low->prepare_to_sleep(false, false, 1));
  // One slot is free again: one more piece goes. Then reader and writer take turns.
  std::size_t sent = kShmReferences;
  CHECK(pair.low->send(gather.data() + sent, pieces - sent) == static_cast<ssize_t>(kLarge));
  ++sent;
  std::vector<std::byte> rest((pieces - 1) * kLarge);
  std::size_t got = 0;
  for (int turn = 0; got < rest.size() && turn < 1000; ++turn) {
    const iovec into{rest.data() + got, rest.size() - got};
    const ssize_t step = pair.high->receive(&into, 1);
    if (step > 0) got += static_cast<std::size_t>(step);
    if (sent < pieces) {
      const ssize_t more = pair.low->send(gather.data() + sent, pieces - sent);
      if (more > 0) sent += static_cast<std::size_t>(more) / kLarge;
    }
  }
  REQUIRE(got == rest.size());
  CHECK(pair.low->references_done() == pieces);
  first.insert(first.end(), rest.begin(), rest.end());
  CHECK(first == bytes);
}

TEST_CASE("single copy: a writer that leaves with a reference outstanding fails the reader",
          "[comm][shm]") {
  if (!single_copy_runs_here()) return;
  // Its transport broke down, and its caller may reuse the buffer: the bytes the reader would
  // copy are not the message's any more, so the reader reports the peer gone instead.
  Pair pair(4096);
  const auto large = pattern(8192, 6);
  REQUIRE(send_bytes(*pair.low, large) == 8192);
  pair.low.reset();
  std::vector<std::byte> into(8192);
  errno = 0;
  CHECK(receive_bytes(*pair.high, into) == -1);
  CHECK(errno == ECONNRESET);
}

TEST_CASE(
    "single copy: a writer that leaves and frees the referenced memory fails the reader as "
    "gone, not as a protocol error",
    "[comm][shm]") {
  if (!single_copy_runs_here()) return;
  // A survivor whose neighbour broke down after another rank died: the neighbour's collective
  // threw and its buffer was unmapped. Reading the reference then fails with EFAULT, which must
  // still say "peer gone" (so the transport takes the neighbour's last words, which name the dead
  // rank) rather than "protocol error" between two live ranks.
  Pair pair(4096);
  constexpr std::size_t kBytes = 2 * kShmPage;
  void* mapped =
      ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mapped != MAP_FAILED);
  std::memset(mapped, 0x5a, kBytes);
  const iovec one{mapped, kBytes};
  REQUIRE(pair.low->send(&one, 1) == static_cast<ssize_t>(kBytes));
  pair.low.reset();
  REQUIRE(::munmap(mapped, kBytes) == 0);
  std::vector<std::byte> into(kBytes);
  errno = 0;
  CHECK(receive_bytes(*pair.high, into) == -1);
  CHECK(errno == ECONNRESET);
}

TEST_CASE("single copy: a reference outside the protocol is EPROTO, and nothing is read",
          "[comm][shm]") {
  if (!single_copy_runs_here()) return;
  Pair pair(4096);
  const auto large = pattern(8192, 7);
  REQUIRE(send_bytes(*pair.low, large) == 8192);
  auto& lower_to_higher = *reinterpret_cast<ShmRingState*>(pair.spy.base() + kShmPage);
  std::vector<std::byte> into(8192);
  SECTION("an address this process does not map") { lower_to_higher.references[0].address = 4096; }
  SECTION("a position past what the ring holds") {
    lower_to_higher.references[0].position = 1 << 20;
  }
  SECTION("more references posted than there are slots") {
    lower_to_higher.references_posted.store(kShmReferences + 1);
  }
  errno = 0;
  CHECK(receive_bytes(*pair.high, into) == -1);
  CHECK(errno == EPROTO);
  CHECK(pair.low->references_done() == 0);
}

TEST_CASE("the single-copy probe reads a word of a process only where it is that word",
          "[comm][shm]") {
  if (!single_copy_runs_here()) return;
  const auto address = reinterpret_cast<std::uintptr_t>(&single_copy_probe());
  CHECK(reads_memory_of(::getpid(), address, single_copy_probe()));
  CHECK_FALSE(reads_memory_of(::getpid(), address, single_copy_probe() + 1));
  CHECK_FALSE(reads_memory_of(::getpid(), 4096, single_copy_probe()));
  CHECK_FALSE(reads_memory_of(0, address, single_copy_probe()));
}

TEST_CASE(
    "last words: a notice left outside the stream reaches the peer, whatever the stream holds",
    "[comm][shm]") {
  Pair pair(4096);
  CHECK(pair.high->last_words().empty());
  const auto large = pattern(8192, 8);
  REQUIRE(send_bytes(*pair.low, large) == 8192);  // a reference the reader will not copy
  const auto words = pattern(520, 9);
  REQUIRE(pair.low->leave_last_words(std::as_bytes(std::span(words))));
  const auto too_long = pattern(4096, 1);
  CHECK_FALSE(pair.low->leave_last_words(std::as_bytes(std::span(too_long))));
  pair.low.reset();
  const auto left = pair.high->last_words();
  CHECK(std::vector<std::byte>(left.begin(), left.end()) == words);
}
