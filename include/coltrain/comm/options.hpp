#pragma once
// Settings of a communicator that users change through the environment, as with NCCL_* and GLOO_*:
// COLTRAIN_TIMEOUT, COLTRAIN_SOCKET_IFNAME, COLTRAIN_JOB_ID, COLTRAIN_TRACE_DIR, COLTRAIN_SHM,
// COLTRAIN_SHM_SINGLE_COPY, COLTRAIN_HOST_ID, COLTRAIN_PORT_FILE, COLTRAIN_TUNING_FILE,
// COLTRAIN_DETERMINISTIC, and the shared secret of
// comm/rendezvous/auth.hpp (COLTRAIN_AUTH_TOKEN, COLTRAIN_AUTH_FILE, COLTRAIN_AUTH).

#include <coltrain/comm/rendezvous/auth_settings.hpp>
#include <coltrain/core/config.hpp>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

namespace coltrain::comm {

// Call sizes in bytes, from `from` up to, not including, `below`; kNoCallSizes holds none.
struct CallSizeRange {
  static constexpr std::size_t kUnbounded = std::numeric_limits<std::size_t>::max();
  std::size_t from = 0;
  std::size_t below = kUnbounded;
  bool contains(std::size_t bytes) const { return bytes >= from && bytes < below; }
  bool empty() const { return from >= below; }
  friend bool operator==(const CallSizeRange&, const CallSizeRange&) = default;
};
inline constexpr CallSizeRange kNoCallSizes{0, 0};

struct CommOptions {
  // Bound on every blocking wait and on the connect-and-retry window of the TCP rendezvous.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Network interface whose address (IPv4 or IPv6) the TCP transport listens on and advertises;
  // empty: the address this host uses to reach MASTER_ADDR.
  std::string socket_ifname;
  // Identifies the job in TCP handshakes, so processes of another job that reach our ports are
  // turned away. The same on every rank: COLTRAIN_JOB_ID, else SLURM_JOB_ID, else
  // TORCHELASTIC_RUN_ID.
  std::string job_id;
  // Where the flight recorder writes its file when a call fails or SIGUSR1 arrives
  // (comm/protocol/flight_recorder.hpp); empty: nowhere. COLTRAIN_TRACE_DIR.
  std::string trace_dir;
  // The job's shared secret: with one, every TCP connection of the job proves it both ways.
  AuthSettings auth;
  // Whether the TCP backend moves the bytes of ranks on one host through shared memory
  // (comm/transport/shm/shm_channel.hpp); both ranks of a pair must want it. COLTRAIN_SHM=0 turns
  // it off.
  bool shared_memory = true;
  // Whether payloads of at least single_copy_bytes between ranks that share memory are copied
  // once, straight from the sender's memory (process_vm_readv), instead of twice through a ring;
  // used only where a probe at setup shows it works. COLTRAIN_SHM_SINGLE_COPY=0 turns it off.
  bool shared_memory_single_copy = true;
  // Below this size the reader's system call costs more than the ring's second copy.
  std::size_t single_copy_bytes = std::size_t{64} << 10;
  // Where single copy pays (measured with 2 ranks, docs/benchmarks.md). Allreduce, reduce_scatter
  // and allgather(v), which exchange pieces both ways and reduce or forward them at once, in calls
  // whose size (the caller's count) lies in single_copy_exchanges for payloads on huge pages
  // (on_huge_pages(): coltrain's own tensors and buffers), in
  // single_copy_exchanges_on_small_pages for payloads on 4 KiB pages. Alltoall, gather, scatter
  // and send/recv on huge pages at any size. Broadcast, reduce and the tree allreduce, where bytes
  // flow one way, never: the rings' two copies then run on both sides at once. Machines differ:
  // on one 2-core VM below 2 MiB the data sat in cache, where each side copying into its ring and
  // out of the other at memcpy speed won, and on 4 KiB pages the reader's process_vm_readv lost at
  // every size (1.2-2.2x at 1-16 MiB); on another single copy won from 128 KiB on huge pages and
  // from 128 KiB to 8 MiB on 4 KiB pages. The defaults are the first machine's;
  // benchmarks/coltrain_tune measures both ranges into a tuning file, which replaces them
  // (comm/tuning/tuning_file.hpp). false: every piece of at least single_copy_bytes goes by
  // single copy (COLTRAIN_SHM_SINGLE_COPY=always).
  bool single_copy_where_it_pays = true;
  CallSizeRange single_copy_exchanges{std::size_t{2} << 20};
  CallSizeRange single_copy_exchanges_on_small_pages = kNoCallSizes;
  // Replaces the host identity that decides which ranks share memory (as NCCL_HOSTID does): ranks
  // with the same COLTRAIN_HOST_ID try shared memory (a segment that is not in fact shared falls
  // back to TCP), ranks with different ones use TCP. At most 60 characters.
  std::string host_id;
  // Where rank 0 publishes the port of its rendezvous, and why it failed if it could not start
  // one; the other ranks wait for it there (comm/rendezvous/port_file.hpp). Needed with
  // MASTER_PORT=0 (rank 0 listens on a port the kernel picks, which nothing can take before it).
  // COLTRAIN_PORT_FILE.
  std::string port_file;
  // Deterministic mode: every allreduce, reduce and reduce_scatter of host buffers runs
  // Algorithm::kRankOrder, whatever algorithm the call names, so each element is reduced in one
  // fixed tree over the ranks and its bits depend on the inputs and the number of ranks alone
  // (comm/algorithms/rank_order.hpp). The same on every rank. COLTRAIN_DETERMINISTIC=1.
  bool deterministic = false;
  // A tuning file that benchmarks/coltrain_tune wrote (comm/tuning/tuning_file.hpp): kAutomatic
  // then chooses from what was measured there. Empty: the built-in cost model.
  // COLTRAIN_TUNING_FILE.
  std::string tuning_file;
  // How long a TCP rank waiting for its peers keeps polling before it sleeps in poll(); unset:
  // 2 ms where the host's ranks have a core each, 50 us where they outnumber its cores
  // (comm/transport/tcp/spin_policy.hpp). Set it short where ranks share cores the launcher does
  // not know about (other jobs, hosts simulated in namespaces). COLTRAIN_SPIN_US.
  std::optional<std::chrono::microseconds> spin_before_sleep;
};

namespace detail {

inline const char* nonempty_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

}  // namespace detail

// CommOptions from the environment variables above (defaults where unset); ConfigError for a value
// it cannot take.
COLTRAIN_DECL CommOptions comm_options_from_env();

}  // namespace coltrain::comm

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/comm/impl/options.ipp>
#endif
