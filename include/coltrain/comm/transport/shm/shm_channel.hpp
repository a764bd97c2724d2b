#pragma once
// Shared memory between two ranks of one host, for the TCP transport (tcp_transport.hpp): the
// pair's bytes go through two rings in a shared segment instead of the loopback TCP stack, which
// copies every byte twice through the kernel and wakes the reader with a system call. The TCP
// connection stays: it carries nothing but one-byte doorbells and tells each side when the other
// process is gone (the kernel closes a killed process's sockets), so failure detection, notices
// and deadlines work as over TCP.
//
// Which peers share a host is decided when the transport is built, from a host identity
// (host_layout.hpp), not from addresses. The two ranks then prove the segment is shared (a nonce
// written by one is read by the other) before they use it; anything less falls back to TCP with a
// warning. That setup, run once per mesh, is shm_setup.hpp.
//
// The segment: one per pair, created by the lower rank as /dev/shm/coltrain-shm.<pid>.<random>,
// opened by the higher rank, and unlinked as soon as it has mapped it: after that the segment has
// no name, and the kernel frees it when both processes are gone, however they end (kill -9
// included). A creator killed in the milliseconds before the unlink leaves a name behind; every
// later setup removes names whose creator process no longer exists.
//
// A ring is a single-producer single-consumer byte queue: the writer copies into the free space
// and publishes its count of bytes written (release), the reader copies out and publishes its
// count read. A side that finds nothing to do for a while sleeps in poll() on the TCP socket after
// raising its flag in the ring (reader_sleeping, writer_sleeping) and checking the ring once more;
// the other side, after moving bytes, lowers the flag and sends one doorbell byte if it was up.
// ShmStream's send() and receive() behave as sendmsg() and recvmsg() on a non-blocking socket
// (bytes moved; -1 with errno EAGAIN when nothing can move; 0 from receive() at the end of the
// stream), so the transport drives both kinds of peer the same way.
//
// Single copy: a ring costs every byte two copies (into the ring, out of it). A large payload
// (CommOptions::single_copy_bytes or more in one piece) therefore does not go through the ring: the
// writer publishes a reference to it (where in the stream, its address, its length; up to
// kShmReferences at once), and the reader copies it straight out of the writer's memory with
// process_vm_readv (cross-memory attach, as MPICH's and Open MPI's shared-memory transports do),
// then counts it done. send() counts the referenced bytes as handed over; the caller (the
// transport) keeps its buffer unchanged, and its send incomplete, until references_done() covers
// them. A writer whose stream ends with references outstanding (its transport broke down, and the
// buffers may be reused) marks its ring closed first; the reader checks that mark after every copy,
// so a copy that raced with the reuse is an error, never data, and takes the writer's failure
// notice from beside the rings (last words), since it cannot read on to the copy in the stream.
// Whether the reader may read the writer's memory (same user, no Yama or seccomp refusal, one
// process-id namespace) is probed at setup: each rank reads a word of the other's memory whose
// value it was told; where that fails the pair keeps the ring for every byte.

#include <coltrain/comm/host_layout.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/log.hpp>
#include <coltrain/core/timer.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace coltrain::comm::detail {

static_assert(std::atomic<std::uint64_t>::is_always_lock_free &&
                  std::atomic<std::uint32_t>::is_always_lock_free,
              "the rings' counters must be lock-free atomics to be shared between processes");

inline constexpr std::string_view kShmNamePrefix = "coltrain-shm.";
inline constexpr std::uint64_t kShmMagic = 0x636f6c7472616e33ull;  // "coltran3"
inline constexpr std::size_t kShmPage = 4096;
// Ring sizes: 4 MiB per direction keeps a pipelined ring allreduce's chunks flowing without
// stalls; with many ranks on a host each pair gets less, so that a rank's rings total at most
// about kShmBytesPerRank (allocated when the segment is made) up to 256 ranks on a host. Making and
// mapping the segments is most of a large job's rendezvous: with a 256 KiB floor, 128 ranks on
// the 2-core machine took 3.4-4.7 s to connect, with 128 KiB rings 2.1-2.3 s.
inline constexpr std::size_t kShmMaxRingBytes = 4 << 20;
inline constexpr std::size_t kShmMinRingBytes = 64 << 10;
inline constexpr std::size_t kShmBytesPerRank = 32 << 20;
// A writer publishes its bytes every this many, so that a large message's copy out of the ring
// overlaps its copy in (one publication per message serialised them: 1 MB allreduce 20% slower).
inline constexpr std::size_t kShmPublishBytes = 64 << 10;
static_assert(kShmMinRingBytes >= kShmPublishBytes, "the smallest ring holds one publication");

// The ring size a rank offers when `local_peers` other ranks share its host, whose /dev/shm holds
// `capacity` bytes: a rank's rings within kShmBytesPerRank, and the host's L(L-1)/2 segments within
// half of /dev/shm (a container's is often 64 MiB; the other half stays for other users). 0 when
// even the smallest rings would not fit there: the host's ranks then use TCP.
inline std::size_t shm_ring_bytes(
    int local_peers, std::uint64_t capacity = std::numeric_limits<std::uint64_t>::max()) {
  const auto peers = static_cast<std::uint64_t>(std::max(local_peers, 1));
  const std::uint64_t host_share = capacity / (2 * (peers + 1) * peers);
  if (host_share < kShmMinRingBytes) return 0;
  const auto share =
      static_cast<std::size_t>(std::min<std::uint64_t>(kShmBytesPerRank / (2 * peers), host_share));
  return std::clamp(std::bit_floor(share), kShmMinRingBytes, kShmMaxRingBytes);
}

// The ring size for a host whose /dev/shm holds `capacity` bytes and whose ranks' smallest memory
// headroom is `headroom` (rendezvous/memory_limit.hpp): its segments within half of /dev/shm and
// within a quarter of the headroom, since the ranks' own data needs the rest.
inline std::size_t shm_ring_bytes_within(int local_peers, std::uint64_t capacity,
                                         std::uint64_t headroom) {
  return shm_ring_bytes(local_peers, std::min(capacity, headroom / 2));
}

// The size of the tmpfs at /dev/shm (the same for every rank that shares its mount namespace, as
// ranks of one host identity do); the largest value when it cannot be read.
inline std::uint64_t shm_capacity() {
  struct statvfs info {};
  if (::statvfs("/dev/shm", &info) != 0) return std::numeric_limits<std::uint64_t>::max();
  return static_cast<std::uint64_t>(info.f_blocks) * info.f_frsize;
}

// A piece of the stream that stays in the writer's memory: `bytes` bytes at `address`, which come
// right after ring byte `position`.
struct ShmReference {
  std::uint64_t position = 0;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
};
// References a writer may have outstanding: enough that a pipelined collective's chunks are all
// posted without waiting for the reader.
inline constexpr std::size_t kShmReferences = 64;
// Room for a failure notice outside the stream (comm/protocol/failure_notice.hpp: 40 bytes and its
// text).
inline constexpr std::size_t kShmLastWordsBytes = 1024;

// One direction's counters, each on a cache line of its own so that writer and reader do not
// invalidate each other's line with every update.
struct ShmRingState {
  alignas(64) std::atomic<std::uint64_t> written{0};
  alignas(64) std::atomic<std::uint64_t> read{0};
  alignas(64) std::atomic<std::uint32_t> reader_sleeping{0};
  alignas(64) std::atomic<std::uint32_t> writer_sleeping{0};
  // Single copy: the writer's references, numbered from 1; reference n is in slot (n - 1) %
  // kShmReferences until the reader has counted it done.
  alignas(64) std::atomic<std::uint64_t> references_posted{0};
  alignas(64) std::atomic<std::uint64_t> references_done{0};
  // Set by the writer before its stream ends: memory it referenced may be reused from then on.
  alignas(64) std::atomic<std::uint32_t> writer_closed{0};
  alignas(64) std::array<ShmReference, kShmReferences> references{};
  // A writer that breaks down leaves its failure notice here too: a reader stopped at one of its
  // references (which it may no longer copy) cannot reach the copy in the stream.
  alignas(64) std::atomic<std::uint64_t> last_words_bytes{0};
  std::array<std::byte, kShmLastWordsBytes> last_words{};
};
static_assert(sizeof(ShmRingState) <= kShmPage);

// The segment's first page: what the opener checks before it trusts the rest.
struct ShmSegmentHeader {
  std::uint64_t magic;
  std::uint64_t nonce;       // the creator's proof that both map the same memory
  std::uint64_t ring_bytes;  // each direction's data, a power of two
};

// Page 0: header; page 1: lower -> higher ring state; page 2: higher -> lower; then the two rings'
// data, lower -> higher first.
inline std::size_t shm_segment_bytes(std::size_t ring_bytes) {
  return 3 * kShmPage + 2 * ring_bytes;
}

// A mapping of a whole segment; unmapped on destruction.
class ShmMapping {
 public:
  ShmMapping() = default;
  ShmMapping(void* base, std::size_t bytes) : base_(base), bytes_(bytes) {}
  ShmMapping(ShmMapping&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), bytes_(other.bytes_) {}
  ShmMapping& operator=(ShmMapping&& other) noexcept {
    if (this != &other) {
      release();
      base_ = std::exchange(other.base_, nullptr);
      bytes_ = other.bytes_;
    }
    return *this;
  }
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping() { release(); }

  std::byte* base() const { return static_cast<std::byte*>(base_); }
  explicit operator bool() const { return base_ != nullptr; }

 private:
  void release() {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = nullptr;
  }

  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

// How a pair's payloads may skip the ring (single copy, see the top of this file).
struct ShmSingleCopy {
  pid_t peer = 0;             // the peer's process, whose referenced memory this end reads
  std::size_t min_bytes = 0;  // this end sends pieces of at least this many bytes by reference;
                              // 0: never (the peer cannot read this process's memory)
};

// One rank's end of a pair's segment: it writes one ring and reads the other. `doorbell` is the
// pair's TCP socket (not owned), which wakes the other side and reports its end.
class ShmStream {
 public:
  ShmStream(ShmMapping mapping, bool lower, int doorbell, ShmSingleCopy single_copy = {})
      : mapping_(std::move(mapping)), doorbell_(doorbell), single_copy_(single_copy) {
    const auto* header = reinterpret_cast<const ShmSegmentHeader*>(mapping_.base());
    ring_bytes_ = header->ring_bytes;
    auto* lower_to_higher = reinterpret_cast<ShmRingState*>(mapping_.base() + kShmPage);
    auto* higher_to_lower = reinterpret_cast<ShmRingState*>(mapping_.base() + 2 * kShmPage);
    std::byte* data = mapping_.base() + 3 * kShmPage;
    out_ = lower ? lower_to_higher : higher_to_lower;
    in_ = lower ? higher_to_lower : lower_to_higher;
    out_data_ = lower ? data : data + ring_bytes_;
    in_data_ = lower ? data + ring_bytes_ : data;
  }
  // The peer may be reading memory this end referenced, which the caller may reuse from now on.
  ~ShmStream() { out_->writer_closed.store(1, std::memory_order_seq_cst); }
  ShmStream(const ShmStream&) = delete;
  ShmStream& operator=(const ShmStream&) = delete;

  std::size_t ring_bytes() const { return ring_bytes_; }
  // Whether this end sends large pieces by reference.
  bool sends_by_reference() const { return single_copy_.min_bytes > 0; }
  // The smallest piece sent by reference (while sends_by_reference()).
  std::size_t reference_min_bytes() const { return single_copy_.min_bytes; }
  // References this end has sent, and how many of them the peer has copied: the bytes handed over
  // up to reference n are the caller's to reuse once references_done() >= n.
  std::uint64_t references_sent() const { return references_posted_; }
  std::uint64_t references_done() const {
    return out_->references_done.load(std::memory_order_acquire);
  }

  // As sendmsg() on a non-blocking socket: copies what fits of the iovecs into the outbound ring,
  // and hands over each large piece by reference while a reference slot is free (its bytes count
  // as sent; the caller keeps them unchanged until references_done() covers them). Bit i of
  // `may_reference` clear: iov[i] (of the first 64) goes through the ring whatever its size. -1
  // with EPIPE (or the socket's error) once the peer is gone, EAGAIN when nothing could be handed
  // over.
  ssize_t send(const iovec* iov, std::size_t count,
               std::uint64_t may_reference = ~std::uint64_t{0}) {
    if (closed_) {
      errno = close_error_ != 0 ? close_error_ : EPIPE;
      return -1;
    }
    const std::uint64_t written = out_->written.load(std::memory_order_relaxed);
    const std::uint64_t used = written - out_->read.load(std::memory_order_acquire);
    if (used > ring_bytes_) return corrupted();
    const std::uint64_t free = ring_bytes_ - used;
    const std::uint64_t done = out_->references_done.load(std::memory_order_acquire);
    std::uint64_t in_ring = 0;  // of the bytes handed over, those copied into the ring
    std::uint64_t moved = 0;
    bool posted = false;
    references_full_ = false;
    for (std::size_t i = 0; i < count; ++i) {
      if (sends_by_reference() && (i >= 64 || (may_reference >> i & 1) != 0) &&
          iov[i].iov_len >= single_copy_.min_bytes) {
        if (references_posted_ - done >= kShmReferences) {
          references_full_ = true;
          break;
        }
        // The ring bytes before it are published (release) before the reference is.
        ShmReference& slot = out_->references[references_posted_ % kShmReferences];
        slot = {written + in_ring, reinterpret_cast<std::uintptr_t>(iov[i].iov_base),
                iov[i].iov_len};
        out_->references_posted.store(++references_posted_, std::memory_order_release);
        moved += iov[i].iov_len;
        posted = true;
        continue;
      }
      if (in_ring == free) break;
      const auto* from = static_cast<const std::byte*>(iov[i].iov_base);
      const std::size_t take = std::min<std::uint64_t>(iov[i].iov_len, free - in_ring);
      // Published piece by piece, so that the reader copies out while this side copies in.
      for (std::size_t piece_done = 0; piece_done < take;) {
        const std::size_t piece = std::min(take - piece_done, kShmPublishBytes);
        copy_in(written + in_ring, from + piece_done, piece);
        in_ring += piece;
        piece_done += piece;
        out_->written.store(written + in_ring, std::memory_order_release);
      }
      moved += take;
      if (take < iov[i].iov_len) break;
    }
    if (moved == 0 && !posted) {
      errno = EAGAIN;
      return -1;
    }
    out_->written.store(written + in_ring, std::memory_order_seq_cst);
    if (posted) out_->references_posted.store(references_posted_, std::memory_order_seq_cst);
    if (lower_flag(out_->reader_sleeping)) ring_doorbell();
    return static_cast<ssize_t>(moved);
  }

  // As recvmsg() on a non-blocking socket: copies the stream's next bytes into the iovecs, from the
  // inbound ring, and each referenced piece from the peer's memory once the ring is read up to it.
  // 0 once everything is read and the peer is gone, -1 with EAGAIN when there is nothing to read;
  // -1 with ECONNRESET when the peer's process, or the memory it referenced, went away during a
  // copy, EPROTO when its counters or references break the protocol.
  ssize_t receive(const iovec* iov, std::size_t count) {
    std::uint64_t read = in_->read.load(std::memory_order_relaxed);
    std::uint64_t moved = 0;
    std::size_t i = 0;
    std::size_t offset = 0;  // into iov[i]
    // Moves (i, offset) on by `bytes` filled, past every iovec that is full (empty ones too).
    const auto advance = [&](std::size_t bytes) {
      offset += bytes;
      while (i < count && offset >= iov[i].iov_len) {
        offset -= iov[i].iov_len;
        ++i;
      }
    };
    bool gave_room = false;  // ring bytes were read: the writer may be waiting for room
    ssize_t failure = 0;
    while (i < count) {
      // The count first: ring bytes written after a reference are published after it, so a
      // reference not seen now lies beyond `written`. One seen now lies within the count loaded
      // after it (its bytes before were published first).
      const std::uint64_t written = in_->written.load(std::memory_order_acquire);
      const std::uint64_t posted = in_->references_posted.load(std::memory_order_acquire);
      if (written - read > ring_bytes_ || posted - references_taken_ > kShmReferences) {
        failure = corrupted();
        break;
      }
      const ShmReference* next = nullptr;
      std::uint64_t until = written;  // ring bytes to read before the next reference
      if (posted != references_taken_) {
        next = &in_->references[references_taken_ % kShmReferences];
        const std::uint64_t covering = in_->written.load(std::memory_order_acquire);
        if (next->position < read || next->position > covering || next->bytes == 0 ||
            reference_offset_ >= next->bytes) {
          failure = corrupted();
          break;
        }
        until = next->position;
      }
      // Ring bytes up to the next reference (or all there are).
      while (i < count && read < until) {
        const std::size_t take = std::min<std::uint64_t>(iov[i].iov_len - offset, until - read);
        copy_out(read, static_cast<std::byte*>(iov[i].iov_base) + offset, take);
        read += take;
        moved += take;
        gave_room = true;
        advance(take);
      }
      // A reference starts a call of its own: the caller, having read the header before it,
      // comes back with the message's own buffer first, and the bytes go there, not through its
      // staging buffer.
      if (next == nullptr || read < until || i == count || (moved > 0 && reference_offset_ == 0))
        break;
      const ssize_t copied = copy_referenced(*next, iov + i, count - i, offset);
      if (copied < 0) {
        failure = -1;
        break;
      }
      moved += static_cast<std::uint64_t>(copied);
      advance(static_cast<std::size_t>(copied));
      if (reference_offset_ != 0) break;  // the iovecs are full
    }
    if (gave_room) {
      in_->read.store(read, std::memory_order_seq_cst);
      if (lower_flag(in_->writer_sleeping)) ring_doorbell();
    }
    if (moved > 0) return static_cast<ssize_t>(moved);  // a failure shows on the next call
    if (failure < 0) return -1;
    if (closed_) {
      if (close_error_ == 0) return 0;
      errno = close_error_;
      return -1;
    }
    errno = EAGAIN;
    return -1;
  }

  // Writes `bytes` whole or not at all (a failure notice must not be torn); then wakes the peer.
  bool send_whole(std::span<const std::byte> bytes) {
    const std::uint64_t written = out_->written.load(std::memory_order_relaxed);
    const std::uint64_t used = written - out_->read.load(std::memory_order_acquire);
    if (closed_ || used > ring_bytes_ || bytes.size() > ring_bytes_ - used) return false;
    copy_in(written, bytes.data(), bytes.size());
    out_->written.store(written + bytes.size(), std::memory_order_seq_cst);
    ring_doorbell();
    return true;
  }

  // Leaves `words` (a failure notice) for the peer outside the stream, where it finds them even
  // when it stopped at a reference of this end's. False when they do not fit.
  bool leave_last_words(std::span<const std::byte> words) {
    if (words.size() > kShmLastWordsBytes) return false;
    std::memcpy(out_->last_words.data(), words.data(), words.size());
    out_->last_words_bytes.store(words.size(), std::memory_order_seq_cst);
    return true;
  }
  // What the peer left with leave_last_words(): empty until it does (or when its count is out of
  // range); valid while this stream lives.
  std::span<const std::byte> last_words() const {
    const std::uint64_t bytes = in_->last_words_bytes.load(std::memory_order_acquire);
    if (bytes > kShmLastWordsBytes) return {};
    return {in_->last_words.data(), static_cast<std::size_t>(bytes)};
  }

  // Before sleeping in poll() on the socket: raise the flags for what this side waits on (bytes to
  // read; room to write; the peer's copy of reference `awaited_reference`, if not 0), then look
  // once more. True when there is still nothing to do (sleeping is safe: whatever the peer does
  // next rings the doorbell).
  bool prepare_to_sleep(bool reading, bool writing, std::uint64_t awaited_reference = 0) {
    const bool settling = awaited_reference != 0;
    if (reading) in_->reader_sleeping.store(1, std::memory_order_seq_cst);
    if (writing || settling) out_->writer_sleeping.store(1, std::memory_order_seq_cst);
    const bool readable =
        in_->written.load(std::memory_order_seq_cst) != in_->read.load(std::memory_order_relaxed) ||
        in_->references_posted.load(std::memory_order_seq_cst) != references_taken_;
    // The last send stopped at a full ring, or at every reference slot taken.
    const bool writable =
        references_full_
            ? references_posted_ - out_->references_done.load(std::memory_order_seq_cst) <
                  kShmReferences
            : out_->written.load(std::memory_order_relaxed) -
                      out_->read.load(std::memory_order_seq_cst) <
                  ring_bytes_;
    const bool settled = out_->references_done.load(std::memory_order_seq_cst) >= awaited_reference;
    return !(reading && readable) && !(writing && writable) && !(settling && settled);
  }

  // Whether the socket said the peer is gone (answer_doorbell()): references it has not copied by
  // now it never will.
  bool peer_gone() const { return closed_; }

  // The socket was readable: reads the doorbells; an end of stream or an error marks the peer gone
  // (receive() still hands out what the ring holds).
  void answer_doorbell() {
    std::array<std::byte, 256> scratch;
    while (!closed_) {
      const ssize_t got = ::recv(doorbell_, scratch.data(), scratch.size(), MSG_DONTWAIT);
      if (got > 0) continue;
      if (got == 0) {
        closed_ = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        closed_ = true;
        close_error_ = errno;
      } else {
        return;
      }
    }
  }

 private:
  // The counters say a ring holds more bytes than it can: the peer wrote outside the protocol.
  // Nothing is copied (it would go past the ring); the transport reports EPROTO for the peer.
  static ssize_t corrupted() {
    errno = EPROTO;
    return -1;
  }

  // Copies the rest of `reference`, as much as the iovecs (from `offset` into the first) take,
  // out of the peer's memory; counts it done when whole.
  ssize_t copy_referenced(const ShmReference& reference, const iovec* iov, std::size_t count,
                          std::size_t offset) {
    const std::uint64_t left = reference.bytes - reference_offset_;
    std::array<iovec, 8> local;
    std::size_t locals = 0;
    std::uint64_t want = 0;
    for (std::size_t i = 0; i < count && locals < local.size() && want < left; ++i) {
      const std::size_t skip = i == 0 ? offset : 0;
      const std::size_t take = std::min<std::uint64_t>(iov[i].iov_len - skip, left - want);
      if (take == 0) continue;
      local[locals++] = {static_cast<std::byte*>(iov[i].iov_base) + skip, take};
      want += take;
    }
    if (want == 0) return 0;
    const iovec remote{
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(reference.address + reference_offset_)),
        static_cast<std::size_t>(want)};
    const ssize_t copied =
        ::process_vm_readv(single_copy_.peer, local.data(), locals, &remote, 1, 0);
    if (copied <= 0) {
      // A writer that broke down marks its ring closed before its caller can free the buffer, so
      // memory gone from under a closed writer's reference is the peer gone (its last words say
      // why), not a broken protocol. Otherwise: the process is gone (ESRCH), or the memory is
      // (EFAULT with the writer still open: a reference outside the protocol).
      const int error = errno;
      const bool writer_left = in_->writer_closed.load(std::memory_order_seq_cst) != 0;
      errno = !writer_left && (copied == 0 || error == EFAULT) ? EPROTO : ECONNRESET;
      return -1;
    }
    // The writer may have given up, and reused the memory, while the bytes were copied.
    if (in_->writer_closed.load(std::memory_order_seq_cst) != 0) {
      errno = ECONNRESET;
      return -1;
    }
    reference_offset_ += static_cast<std::uint64_t>(copied);
    if (reference_offset_ == reference.bytes) {
      reference_offset_ = 0;
      in_->references_done.store(++references_taken_, std::memory_order_seq_cst);
      if (lower_flag(in_->writer_sleeping)) ring_doorbell();
    }
    return copied;
  }

  // Lowers a sleeping flag; says whether it was up.
  static bool lower_flag(std::atomic<std::uint32_t>& flag) {
    return flag.load(std::memory_order_seq_cst) != 0 &&
           flag.exchange(0, std::memory_order_seq_cst) != 0;
  }

  void ring_doorbell() const {
    const char bell = 1;
    // A full socket buffer already holds doorbells the peer has yet to read: nothing is lost.
    [[maybe_unused]] const ssize_t sent = ::send(doorbell_, &bell, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // An empty iovec's base may be null, which memcpy must not get even for 0 bytes.
  void copy_in(std::uint64_t position, const std::byte* from, std::size_t bytes) const {
    if (bytes == 0) return;
    const std::size_t at = position & (ring_bytes_ - 1);
    const std::size_t first = std::min(bytes, ring_bytes_ - at);
    std::memcpy(out_data_ + at, from, first);
    if (first < bytes) std::memcpy(out_data_, from + first, bytes - first);
  }

  void copy_out(std::uint64_t position, std::byte* to, std::size_t bytes) const {
    if (bytes == 0) return;
    const std::size_t at = position & (ring_bytes_ - 1);
    const std::size_t first = std::min(bytes, ring_bytes_ - at);
    std::memcpy(to, in_data_ + at, first);
    if (first < bytes) std::memcpy(to + first, in_data_, bytes - first);
  }

  ShmMapping mapping_;
  int doorbell_;
  ShmSingleCopy single_copy_;
  std::size_t ring_bytes_ = 0;
  ShmRingState* out_ = nullptr;
  ShmRingState* in_ = nullptr;
  std::byte* out_data_ = nullptr;
  std::byte* in_data_ = nullptr;
  bool closed_ = false;
  int close_error_ = 0;  // 0: an orderly end of stream
  // Single copy, as writer: references posted, and whether the last send found no free slot.
  std::uint64_t references_posted_ = 0;
  bool references_full_ = false;
  // As reader: references done, and how much of the current one is copied.
  std::uint64_t references_taken_ = 0;
  std::uint64_t reference_offset_ = 0;
};

// Removes segment names left by creators that no longer exist (killed between creating a segment
// and its opener's unlink). A name whose process id was reused by a live process stays until that
// process ends.
inline void remove_stale_segments() {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kShmNamePrefix)) continue;
    const std::string rest = name.substr(kShmNamePrefix.size());
    const std::size_t dot = rest.find('.');
    if (dot == std::string::npos) continue;
    long pid = 0;
    try {
      pid = std::stol(rest.substr(0, dot));
    } catch (const std::exception&) {
      continue;
    }
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      ::shm_unlink(("/" + name).c_str());
  }
}

// A fresh segment of two rings of `ring_bytes`, named for this process, mapped, its header
// written with `nonce`. Both ends map with MAP_POPULATE: faulting the rings' pages in one by one
// as the first bytes pass cost a 64 KB allreduce three times its time. Throws CommError, naming the
// segment, when the system refuses.
inline ShmMapping create_segment(const std::string& name, std::size_t ring_bytes,
                                 std::uint64_t nonce) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw CommError("shared memory: cannot create /dev/shm" + name + ": " +
                    std::generic_category().message(errno));
  }
  const std::size_t bytes = shm_segment_bytes(ring_bytes);
  void* base = MAP_FAILED;
  // Allocated now, not as bytes first pass: a full /dev/shm (a container's is often 64 MB) is then
  // an error here, and TCP is used, instead of a SIGBUS in the middle of a collective.
  int error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (error == 0) {
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) error = errno;
  }
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    throw CommError("shared memory: cannot allocate or map /dev/shm" + name + " (" +
                    std::to_string(bytes) + " bytes): " + std::generic_category().message(error));
  }
  ShmMapping mapping(base, bytes);
  new (mapping.base() + kShmPage) ShmRingState;
  new (mapping.base() + 2 * kShmPage) ShmRingState;
  // The opener reads the header after this rank's offer, sent over the socket afterwards.
  new (mapping.base()) ShmSegmentHeader{kShmMagic, nonce, ring_bytes};
  return mapping;
}

// Maps the segment `name` that a peer created; empty, with `why` set, when it cannot be opened or
// does not hold `nonce` (not the same memory: another host's /dev/shm, or a stranger's file).
inline ShmMapping open_segment(const std::string& name, std::size_t ring_bytes, std::uint64_t nonce,
                               std::string& why) {
  if (!std::has_single_bit(ring_bytes) || ring_bytes < kShmMinRingBytes ||
      ring_bytes > kShmMaxRingBytes) {
    why = "ring size " + std::to_string(ring_bytes) + " out of range";
    return {};
  }
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = "cannot open /dev/shm" + name + ": " + std::generic_category().message(errno);
    return {};
  }
  const std::size_t bytes = shm_segment_bytes(ring_bytes);
  struct stat info {};
  void* base = MAP_FAILED;
  if (::fstat(fd, &info) != 0 || static_cast<std::size_t>(info.st_size) != bytes) {
    why = "/dev/shm" + name + " has " + std::to_string(info.st_size) + " bytes, expected " +
          std::to_string(bytes);
  } else {
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED)
      why = "cannot map /dev/shm" + name + ": " + std::generic_category().message(errno);
  }
  ::close(fd);
  if (base == MAP_FAILED) return {};
  ShmMapping mapping(base, bytes);
  ShmSegmentHeader header;
  std::memcpy(&header, mapping.base(), sizeof header);
  if (header.magic != kShmMagic || header.nonce != nonce || header.ring_bytes != ring_bytes) {
    why = "/dev/shm" + name + " does not hold the segment the peer wrote";
    return {};
  }
  return mapping;
}

// A segment name no other process uses: this process's id (for remove_stale_segments) and 64
// random bits.
inline std::string fresh_segment_name(std::mt19937_64& random) {
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(random()));
  return "/" + std::string(kShmNamePrefix) + std::to_string(::getpid()) + "." + suffix;
}

// A word of this process's memory whose address and value its peers are told at setup: reading it
// back with process_vm_readv proves that single copy works from this process to them.
inline const std::uint64_t& single_copy_probe() {
  static const std::uint64_t word =
      (static_cast<std::uint64_t>(std::random_device{}()) << 32 | std::random_device{}()) | 1;
  return word;
}

// Whether this process can read `value` at `address` in process `pid`.
inline bool reads_memory_of(pid_t pid, std::uint64_t address, std::uint64_t value) {
  std::uint64_t got = 0;
  iovec local{&got, sizeof got};
  iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), sizeof got};
  return pid > 0 &&
         ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof got) &&
         got == value;
}

}  // namespace coltrain::comm::detail
