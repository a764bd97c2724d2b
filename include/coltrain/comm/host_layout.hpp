#pragma once
// Which ranks of a communicator share a host. The TCP transport decides from it which peers get a
// shared-memory channel (shm_channel.hpp), and hierarchical allreduce (algorithms/hierarchical.hpp)
// and the cost model which ranks reduce together before anything crosses between hosts.
//
// A host is what shared memory sees as one: the kernel instance (boot id) and the mount and network
// namespaces, not an address; two containers on one machine see different /dev/shm, and a rank in
// its own network namespace counts as another host. COLTRAIN_HOST_ID (CommOptions::host_id)
// replaces that identity, as NCCL_HOSTID does: ranks that give the same value count as one host
// (and still prove that their memory is shared before they use it).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace coltrain::comm {

namespace detail {

// What identifies this process's host; equal identities are a hint, which the shared segment's
// nonce then proves.
struct HostIdentity {
  std::array<char, 64> host{};  // the boot id, or "id:" and COLTRAIN_HOST_ID
  std::uint64_t mount_namespace = 0;
  std::uint64_t network_namespace = 0;

  bool operator==(const HostIdentity&) const = default;
};

inline HostIdentity host_identity(const std::string& host_id = {}) {
  HostIdentity identity;
  std::string id = "id:" + host_id;
  if (host_id.empty()) {
    // POSIX read rather than <fstream>: this header is on every collective user's include path.
    if (const int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC); fd >= 0) {
      std::array<char, 64> boot{};
      const ssize_t got = ::read(fd, boot.data(), boot.size());
      ::close(fd);
      if (got > 0) id.assign(boot.data(), static_cast<std::size_t>(got));
      if (const auto newline = id.find('\n'); newline != std::string::npos) id.resize(newline);
    }
    struct stat info {};
    if (::stat("/proc/self/ns/mnt", &info) == 0) identity.mount_namespace = info.st_ino;
    if (::stat("/proc/self/ns/net", &info) == 0) identity.network_namespace = info.st_ino;
  }
  std::memcpy(identity.host.data(), id.data(), std::min(id.size(), identity.host.size()));
  return identity;
}

}  // namespace detail

// The ranks of a communicator grouped by host. Hosts are numbered in the order of their lowest
// rank; a host's ranks are listed in rank order. Every rank builds the same layout from the same
// identities.
class HostLayout {
 public:
  // One rank on one host.
  HostLayout() : HostLayout(std::vector<int>{0}) {}

  // From every rank's identity, index = rank.
  explicit HostLayout(std::span<const detail::HostIdentity> identities) {
    std::vector<int> host_of(identities.size());
    std::vector<std::size_t> first_rank_of_host;
    for (std::size_t rank = 0; rank < identities.size(); ++rank) {
      const auto same =
          std::find_if(first_rank_of_host.begin(), first_rank_of_host.end(),
                       [&](std::size_t r) { return identities[r] == identities[rank]; });
      host_of[rank] = static_cast<int>(same - first_rank_of_host.begin());
      if (same == first_rank_of_host.end()) first_rank_of_host.push_back(rank);
    }
    *this = HostLayout(std::move(host_of));
  }

  // From every rank's host number (0, 1, ... in the order of the hosts' lowest ranks). What the
  // cost model asks on every automatic call is worked out here, once.
  explicit HostLayout(std::vector<int> host_of) : host_of_(std::move(host_of)) {
    const auto p = host_of_.size();
    for (std::size_t rank = 0; rank < p; ++rank) {
      const auto host = static_cast<std::size_t>(host_of_[rank]);
      if (host >= ranks_of_host_.size()) ranks_of_host_.resize(host + 1);
      ranks_of_host_[host].push_back(static_cast<int>(rank));
    }
    std::vector<int> leaving(ranks_of_host_.size(), 0);
    for (std::size_t rank = 0; rank < p; ++rank) {
      if (host_of_[rank] != host_of_[(rank + 1) % p])
        ++leaving[static_cast<std::size_t>(host_of_[rank])];
    }
    const std::vector<double> halving_doubling = halving_doubling_shares_leaving();
    for (std::size_t host = 0; host < ranks_of_host_.size(); ++host) {
      largest_host_ = std::max(largest_host_, static_cast<int>(ranks_of_host_[host].size()));
      uniform_ = uniform_ && ranks_of_host_[host].size() == ranks_of_host_[0].size();
      ring_links_leaving_a_host_ = std::max(ring_links_leaving_a_host_, leaving[host]);
      halving_doubling_load_ = std::max(halving_doubling_load_, halving_doubling[host]);
    }
  }

  int ranks() const { return static_cast<int>(host_of_.size()); }
  int hosts() const { return static_cast<int>(ranks_of_host_.size()); }
  int host_of(int rank) const { return host_of_.at(static_cast<std::size_t>(rank)); }
  const std::vector<int>& ranks_on(int host) const {
    return ranks_of_host_.at(static_cast<std::size_t>(host));
  }
  // The position of `rank` among its host's ranks.
  int local_index(int rank) const {
    const std::vector<int>& local = ranks_on(host_of(rank));
    return static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
  }
  // The most ranks any host has.
  int largest_host() const { return largest_host_; }
  // Whether every host has the same number of ranks.
  bool uniform() const { return uniform_; }
  // The most links of the ring over ranks 0, 1, ..., p-1 that leave any one host: 1 when each
  // host's ranks are adjacent (block placement), up to a host's rank count when they alternate
  // with other hosts' (cyclic placement, as srun --distribution=cyclic gives). Those links share
  // the host's network link.
  int ring_links_leaving_a_host() const { return ring_links_leaving_a_host_; }
  // The same for halving-doubling (algorithms/halving_doubling.hpp): what the busiest host sends to
  // other hosts, in units of what one rank sends in all, and at least 1 as the ring's count is. 1
  // with a rank a host; with hosts of adjacent ranks the largest steps (the first halving, the
  // last doubling) cross for every rank: two hosts of 4 give 16/7. With alternating hosts only the
  // smallest steps cross (4/7, counted as 1: the steps inside a host take time too).
  double halving_doubling_load_leaving_a_host() const { return halving_doubling_load_; }

 private:
  // Per host: the bytes its ranks send to other hosts in halving-doubling over the power-of-two
  // ranks that run it (the fold's pairs of neighbours left out), over what one rank sends. The
  // step whose partners differ in bit m sends n m / q bytes each way; a rank sends 2 n (q-1)/q.
  std::vector<double> halving_doubling_shares_leaving() const {
    const auto p = static_cast<int>(host_of_.size());
    const int q = static_cast<int>(std::bit_floor(static_cast<unsigned>(std::max(p, 1))));
    const int extra = p - q;
    const auto real_rank = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
    std::vector<double> shares(ranks_of_host_.size(), 0);
    if (q < 2) return shares;
    for (int v = 0; v < q; ++v) {
      const int host = host_of_[static_cast<std::size_t>(real_rank(v))];
      for (int m = 1; m < q; m *= 2) {
        if (host_of_[static_cast<std::size_t>(real_rank(v ^ m))] != host)
          shares[static_cast<std::size_t>(host)] += static_cast<double>(m) / (q - 1);
      }
    }
    return shares;
  }

  std::vector<int> host_of_;
  std::vector<std::vector<int>> ranks_of_host_;
  int largest_host_ = 0;
  bool uniform_ = true;
  int ring_links_leaving_a_host_ = 1;
  double halving_doubling_load_ = 1;
};

}  // namespace coltrain::comm
