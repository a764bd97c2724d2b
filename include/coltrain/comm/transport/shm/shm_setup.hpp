#pragma once
// The shared-memory setup of a freshly connected TCP mesh (shm_channel.hpp has the channels
// themselves): every rank learns every rank's host identity over its sockets, and each pair on one
// host that both want it gets a segment, created by the lower rank, opened and proven by the
// higher, with single copy where each side can read the other's memory. Run once per mesh by the
// TCP transport's constructor, before any other traffic.

#include <coltrain/comm/host_layout.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/memory_limit.hpp>
#include <coltrain/comm/transport/shm/shm_channel.hpp>
#include <coltrain/comm/transport/tcp/socket.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/log.hpp>
#include <coltrain/core/timer.hpp>

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace coltrain::comm::detail {

// The setup's messages, sent over each pair's fresh connection before any other traffic.
struct ShmHello {
  std::uint64_t magic = kShmMagic;
  HostIdentity identity;
  std::uint32_t enabled = 0;      // COLTRAIN_SHM
  std::uint32_t single_copy = 0;  // COLTRAIN_SHM_SINGLE_COPY
  std::int64_t pid = 0;
  std::uint64_t probe_address = 0;  // of single_copy_probe()
  std::uint64_t probe_value = 0;
  std::uint64_t memory_headroom = 0;  // memory_limit.hpp; kUnlimitedMemory when nothing limits it
};

struct ShmOffer {
  std::uint64_t magic = kShmMagic;
  std::array<char, 64> name{};
  std::uint64_t nonce = 0;
  std::uint64_t ring_bytes = 0;
  std::uint64_t reads_your_memory = 0;  // the creator's probe of the opener succeeded
};

struct ShmAnswer {
  std::uint64_t magic = kShmMagic;
  std::uint64_t accepted = 0;
  std::uint64_t reads_your_memory = 0;  // the opener's probe of the creator succeeded
};

template <class Message>
void shm_send(int fd, const Message& message, int peer, const Deadline& deadline,
              ErrorContext context) {
  const IoResult io = send_exact(fd, std::as_bytes(std::span(&message, 1)), deadline);
  if (io.status == IoStatus::kDone) return;
  context.peer = peer;
  throw CommError("shared-memory setup: rank " + std::to_string(context.rank.value_or(-1)) +
                      " could not write to rank " + std::to_string(peer) + " (" +
                      (io.status == IoStatus::kTimedOut ? "timed out" : io.reason) + ")",
                  context);
}

template <class Message>
Message shm_receive(int fd, int peer, const Deadline& deadline, ErrorContext context) {
  Message message{};
  const IoResult io = recv_exact(fd, std::as_writable_bytes(std::span(&message, 1)), deadline);
  std::string problem;
  if (io.status != IoStatus::kDone) {
    problem = io.status == IoStatus::kTimedOut ? "timed out" : io.reason;
  } else if (message.magic != kShmMagic) {
    problem = "it sent something other than the setup's message (another coltrain version?)";
  }
  if (problem.empty()) return message;
  context.peer = peer;
  throw CommError("shared-memory setup: rank " + std::to_string(context.rank.value_or(-1)) +
                      " could not read from rank " + std::to_string(peer) + " (" + problem + ")",
                  context);
}

// What the setup gives the transport: a channel per peer (null: TCP), and every rank's host.
struct SharedMemorySetup {
  std::vector<std::unique_ptr<ShmStream>> streams;
  HostLayout hosts;
  // Whether every rank asked for shared memory (no COLTRAIN_SHM=0 anywhere), so that the ranks of a
  // host talk through it: the same on every rank, from the hellos all of them received. (A pair
  // whose segment cannot be made still falls back to TCP alone.)
  bool every_rank_shares_memory = false;
};

// Run by every rank of a freshly connected mesh (`sockets[p]` reaches rank p; empty at `rank`),
// all at once: every rank learns every rank's host identity, and the pairs that share a host, and
// both want it, get a shared-memory channel. Every message is small, so each phase's writes finish
// without waiting for a reader and no order of ranks deadlocks. Throws CommError, naming the peer,
// when a connection fails or the timeout passes.
inline SharedMemorySetup setup_shared_memory(int rank, const std::vector<FileDescriptor>& sockets,
                                             const CommOptions& options, const Logger& logger) {
  const int size = static_cast<int>(sockets.size());
  SharedMemorySetup setup;
  std::vector<std::unique_ptr<ShmStream>>& streams = setup.streams;
  streams.resize(sockets.size());
  if (size < 2) return setup;
  ErrorContext context;
  context.rank = rank;
  context.operation = "shared-memory setup";
  const Deadline deadline(options.timeout);

  ShmHello mine;
  mine.identity = host_identity(options.host_id);
  mine.enabled = options.shared_memory ? 1 : 0;
  mine.single_copy = options.shared_memory_single_copy ? 1 : 0;
  mine.pid = ::getpid();
  mine.probe_address = reinterpret_cast<std::uintptr_t>(&single_copy_probe());
  mine.probe_value = single_copy_probe();
  // Read before this rank's hello goes out, so before any rank of the host makes a segment: every
  // rank then sizes the rings from the same figures.
  const MemoryHeadroom headroom = memory_headroom();
  mine.memory_headroom = headroom.bytes;
  for (int peer = 0; peer < size; ++peer)
    if (peer != rank)
      shm_send(sockets[static_cast<std::size_t>(peer)].get(), mine, peer, deadline, context);
  std::vector<bool> shared(sockets.size(), false);
  std::vector<bool> readable(sockets.size(), false);  // this rank reads the peer's memory
  std::vector<pid_t> pids(sockets.size(), 0);
  std::vector<HostIdentity> identities(sockets.size());
  identities[static_cast<std::size_t>(rank)] = mine.identity;
  int local_peers = 0;
  setup.every_rank_shares_memory = mine.enabled != 0;
  // The smallest memory headroom on this host (of the ranks that share memory with this one), and
  // the lowest rank that reported it: the one that says so when it shrinks the rings.
  std::uint64_t host_headroom = headroom.bytes;
  int tightest_rank = rank;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const auto theirs = shm_receive<ShmHello>(sockets[static_cast<std::size_t>(peer)].get(), peer,
                                              deadline, context);
    identities[static_cast<std::size_t>(peer)] = theirs.identity;
    setup.every_rank_shares_memory = setup.every_rank_shares_memory && theirs.enabled != 0;
    const auto p = static_cast<std::size_t>(peer);
    shared[p] = mine.enabled != 0 && theirs.enabled != 0 && theirs.identity == mine.identity;
    local_peers += shared[p] ? 1 : 0;
    if (shared[p] && (theirs.memory_headroom < host_headroom ||
                      (theirs.memory_headroom == host_headroom && peer < tightest_rank))) {
      host_headroom = theirs.memory_headroom;
      tightest_rank = peer;
    }
    pids[p] = static_cast<pid_t>(theirs.pid);
    const bool both_want_single_copy =
        shared[p] && mine.single_copy != 0 && theirs.single_copy != 0;
    readable[p] =
        both_want_single_copy && reads_memory_of(pids[p], theirs.probe_address, theirs.probe_value);
    if (both_want_single_copy && !readable[p]) {
      logger.info("rank ", rank, " cannot read the memory of rank ", peer,
                  " (process_vm_readv refused: ptrace policy, seccomp, or another process id "
                  "namespace): their large payloads go through the shared-memory rings");
    }
  }
  // What a stream to `p` sends by reference: only what the peer has proved it can read.
  const auto single_copy = [&](std::size_t p, std::uint64_t peer_reads_mine) {
    return ShmSingleCopy{pids[p], peer_reads_mine != 0 ? options.single_copy_bytes : 0};
  };
  setup.hosts = HostLayout(identities);
  if (local_peers == 0) return setup;

  remove_stale_segments();
  std::mt19937_64 random(std::random_device{}() ^ (static_cast<std::uint64_t>(::getpid()) << 32 |
                                                   static_cast<unsigned>(rank)));
  std::vector<std::string> names(sockets.size());  // segments created here, until unlinked
  std::vector<ShmMapping> created(sockets.size());
  // The host's segments within half of /dev/shm and a quarter of the smallest memory headroom:
  // every rank of the host computes the same size. With none that fits, every creator offers none
  // (an empty name), so the pairs use TCP without a warning each; the host's lowest rank says why
  // once, or for a memory limit the rank that has it.
  const std::uint64_t capacity = shm_capacity();
  const std::size_t dev_shm_ring_bytes = shm_ring_bytes(local_peers, capacity);
  const std::size_t ring_bytes = shm_ring_bytes_within(local_peers, capacity, host_headroom);
  const auto ranks = static_cast<std::uint64_t>(local_peers) + 1;
  const std::uint64_t segments = ranks * (ranks - 1) / 2;
  const std::uint64_t need_mib = (segments * shm_segment_bytes(kShmMinRingBytes) >> 20) + 1;
  if (dev_shm_ring_bytes == 0 &&
      std::none_of(shared.begin(), shared.begin() + rank, std::identity{})) {
    const std::uint64_t enough_mib = 2 * need_mib + 1;
    logger.warn("the ", ranks, " ranks on this host use TCP, not shared memory: /dev/shm holds ",
                capacity >> 20, " MiB, and their ", segments, " segments would need at least ",
                need_mib, " MiB in half of it; give it more (a container's --shm-size=", enough_mib,
                "m, or mount -o remount,size=", enough_mib,
                "m /dev/shm), or set COLTRAIN_SHM=0 to say so");
  } else if (ring_bytes == 0 && tightest_rank == rank) {
    logger.warn("the ", ranks, " ranks on this host use TCP, not shared memory: ", headroom.limit,
                " leaves ", headroom.bytes >> 20, " MiB, and their ", segments,
                " segments would need at least ", need_mib,
                " MiB in a quarter of it; for shared memory, ", headroom.fix,
                "; or set COLTRAIN_SHM=0 to say so");
  } else if (ring_bytes < dev_shm_ring_bytes && tightest_rank == rank) {
    logger.info("the ", ranks, " ranks on this host use shared-memory rings of ", ring_bytes >> 10,
                " KiB, not ", dev_shm_ring_bytes >> 10, " KiB: ", headroom.limit, " leaves ",
                headroom.bytes >> 20, " MiB");
  }
  try {
    // Offers to the higher ranks that share this host.
    for (int peer = rank + 1; peer < size; ++peer) {
      const auto p = static_cast<std::size_t>(peer);
      if (!shared[p]) continue;
      ShmOffer offer;
      offer.nonce = random();
      offer.ring_bytes = ring_bytes;
      offer.reads_your_memory = readable[p] ? 1 : 0;
      if (ring_bytes != 0) {  // 0: declined above
        names[p] = fresh_segment_name(random);
        try {
          created[p] = create_segment(names[p], ring_bytes, offer.nonce);
          std::memcpy(offer.name.data(), names[p].data(),
                      std::min(names[p].size(), offer.name.size() - 1));
        } catch (const CommError& e) {  // no /dev/shm, or it is full: an empty name declines
          names[p].clear();
          logger.warn("rank ", rank, " and rank ", peer, " use TCP: ", e.message());
        }
      }
      shm_send(sockets[p].get(), offer, peer, deadline, context);
    }
    // Offers from the lower ranks: map, prove, answer.
    for (int peer = 0; peer < rank; ++peer) {
      const auto p = static_cast<std::size_t>(peer);
      if (!shared[p]) continue;
      const auto offer = shm_receive<ShmOffer>(sockets[p].get(), peer, deadline, context);
      std::string why;
      const std::string name(offer.name.data(), strnlen(offer.name.data(), offer.name.size()));
      ShmMapping mapping;
      if (!name.empty()) mapping = open_segment(name, offer.ring_bytes, offer.nonce, why);
      ShmAnswer answer;
      answer.accepted = mapping ? 1 : 0;
      answer.reads_your_memory = readable[p] ? 1 : 0;
      shm_send(sockets[p].get(), answer, peer, deadline, context);
      if (mapping) {
        streams[p] = std::make_unique<ShmStream>(std::move(mapping), false, sockets[p].get(),
                                                 single_copy(p, offer.reads_your_memory));
      } else if (!name.empty()) {  // (an empty name: the creator has said why)
        logger.warn("rank ", rank, " and rank ", peer,
                    " share a host but not its shared memory; they use TCP: ", why);
      }
    }
    // The higher ranks' answers: the name goes at once, mapped or not.
    for (int peer = rank + 1; peer < size; ++peer) {
      const auto p = static_cast<std::size_t>(peer);
      if (!shared[p]) continue;
      const auto answer = shm_receive<ShmAnswer>(sockets[p].get(), peer, deadline, context);
      if (names[p].empty()) continue;  // declined above
      ::shm_unlink(names[p].c_str());
      names[p].clear();
      if (answer.accepted != 0)
        streams[p] = std::make_unique<ShmStream>(std::move(created[p]), true, sockets[p].get(),
                                                 single_copy(p, answer.reads_your_memory));
    }
  } catch (...) {
    for (const std::string& name : names)
      if (!name.empty()) ::shm_unlink(name.c_str());
    throw;
  }
  return setup;
}

}  // namespace coltrain::comm::detail
