#pragma once
// The memory a rank may still take before a limit stops it: the memory cgroups it runs in (a
// container's --memory, Slurm's --mem, a Kubernetes pod's limit; cgroup v2's memory.max or v1's
// memory.limit_in_bytes, at its own level and every level above) and its address-space limit
// (RLIMIT_AS, `ulimit -v`). A cgroup over its limit is ended by the kernel's OOM killer with
// SIGKILL and no message, and shared-memory rings are charged to the cgroup of the rank that
// allocates them (8 ranks' full rings are 112 MiB). So the shared-memory setup sizes a host's rings
// within a quarter of the smallest headroom its ranks report (transport/shm/shm_setup.hpp), and a
// rank whose headroom cannot hold even its TCP buffers stops before it connects, with a ConfigError
// that names the limit and how to raise it (ensure_memory_limit).
//
// In use means what the kernel cannot reclaim: usage less the page cache of files (active and
// inactive), which a rank that has read its data set holds in plenty. Shared memory is not file
// cache there (it is swap-backed), so rings already made count as in use.

#include <coltrain/core/error.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace coltrain::comm::detail {

inline constexpr std::uint64_t kUnlimitedMemory = std::numeric_limits<std::uint64_t>::max();
// What a rank needs beyond its peers' inboxes before it connects: socket and message buffers, the
// flight recorder, the address tables (a few MiB; 8.7 MiB resident for a whole rendezvous_bench
// rank, its libraries included, on 2026-12-06).
inline constexpr std::uint64_t kMemoryFloorBytes = 4 << 20;
// And for each peer: the receive inbox its channel allocates with its first message
// (transport/tcp/tcp_peer_channel.hpp checks that it fits).
inline constexpr std::uint64_t kMemoryPerPeerBytes = 16 << 10;

// What a rank may still allocate, and what limits it.
struct MemoryHeadroom {
  std::uint64_t bytes = kUnlimitedMemory;
  std::string limit;  // e.g. "the memory cgroup /job_7 (limit 64 MiB, 40 MiB in use)"
  std::string fix;    // how to raise it
};

inline std::string mebibytes(std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// The whole number after `key` and blanks at the start of a line of `text` (memory.stat's "key
// value", /proc/self/status's "VmSize:\t 1234 kB"); nullopt when absent.
inline std::optional<std::uint64_t> keyed_value(std::string_view text, std::string_view key) {
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    if (line.size() > key.size() && line.substr(0, key.size()) == key &&
        (line[key.size()] == ' ' || line[key.size()] == '\t')) {
      const std::size_t digits = line.find_first_not_of(" \t", key.size());
      std::uint64_t value = 0;
      if (digits != std::string_view::npos &&
          std::from_chars(line.data() + digits, line.data() + line.size(), value).ec == std::errc{})
        return value;
    }
    at = end + 1;
  }
  return std::nullopt;
}

inline std::optional<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// This process's cgroup paths, from /proc/self/cgroup's text: cgroup v2's ("0::/path") and the
// path in v1's memory hierarchy ("N:memory:/path", the controller possibly listed with others).
struct CgroupPaths {
  std::optional<std::string> unified;
  std::optional<std::string> memory_v1;
};

inline CgroupPaths parse_proc_cgroup(std::string_view text) {
  CgroupPaths paths;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    const std::size_t first = line.find(':');
    const std::size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view controllers = line.substr(first + 1, second - first - 1);
    const std::string path(line.substr(second + 1));
    if (line.substr(0, first) == "0" && controllers.empty()) {
      paths.unified = path;
      continue;
    }
    std::size_t c = 0;
    while (c <= controllers.size()) {
      const std::size_t comma = std::min(controllers.find(',', c), controllers.size());
      if (controllers.substr(c, comma - c) == "memory") paths.memory_v1 = path;
      c = comma + 1;
    }
  }
  return paths;
}

// The file names of one cgroup version's memory controller.
struct CgroupMemoryFiles {
  const char* limit;
  const char* usage;
  const char* active_file;    // in memory.stat
  const char* inactive_file;  // in memory.stat
};
inline constexpr CgroupMemoryFiles kCgroupV2Files{"memory.max", "memory.current", "active_file",
                                                  "inactive_file"};
inline constexpr CgroupMemoryFiles kCgroupV1Files{"memory.limit_in_bytes", "memory.usage_in_bytes",
                                                  "total_active_file", "total_inactive_file"};

// The tightest headroom of the cgroup at `path` under the hierarchy mounted at `mount` and of every
// cgroup above it (a parent's limit binds its children). A level without a limit ("max" in v2, v1's
// page-counter maximum) or whose files cannot be read adds nothing.
inline MemoryHeadroom cgroup_headroom(const std::string& mount, std::string path,
                                      const CgroupMemoryFiles& files) {
  MemoryHeadroom tightest;
  // v1 reports "no limit" as the largest page count times the page size, just under 2^63.
  constexpr std::uint64_t kNoLimit = std::uint64_t{1} << 62;
  while (true) {
    const std::string dir = mount + (path == "/" ? "" : path) + "/";
    const auto limit_text = read_small_file(dir + files.limit);
    const auto usage_text = read_small_file(dir + files.usage);
    std::uint64_t limit = 0, usage = 0;
    if (limit_text && usage_text &&
        std::from_chars(limit_text->data(), limit_text->data() + limit_text->size(), limit).ec ==
            std::errc{} &&
        std::from_chars(usage_text->data(), usage_text->data() + usage_text->size(), usage).ec ==
            std::errc{} &&
        limit < kNoLimit) {
      const std::string stat = read_small_file(dir + "memory.stat").value_or("");
      const std::uint64_t file_cache = keyed_value(stat, files.active_file).value_or(0) +
                                       keyed_value(stat, files.inactive_file).value_or(0);
      const std::uint64_t in_use = usage - std::min(usage, file_cache);
      const std::uint64_t headroom = limit - std::min(limit, in_use);
      if (headroom < tightest.bytes) {
        tightest.bytes = headroom;
        tightest.limit = "the memory cgroup " + path + " (" + files.limit + " " + mebibytes(limit) +
                         ", " + mebibytes(in_use) + " in use)";
        tightest.fix =
            "give the job more memory (Slurm's --mem or --mem-per-cpu, a container's --memory, "
            "a Kubernetes pod's resources.limits.memory) or start fewer ranks on each host";
      }
    }
    if (path.empty() || path == "/") break;
    const std::size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return tightest;
}

// RLIMIT_AS less the address space mapped now (VmSize in /proc/self/status).
inline MemoryHeadroom address_space_headroom(rlim_t limit, std::uint64_t mapped) {
  if (limit == RLIM_INFINITY) return {};
  const auto bytes = static_cast<std::uint64_t>(limit);
  return {bytes - std::min(bytes, mapped),
          "RLIMIT_AS (" + mebibytes(bytes) + ", " + mebibytes(mapped) + " of address space mapped)",
          "raise it where the ranks are started (`ulimit -v unlimited` in the job script, Slurm's "
          "`srun --propagate=AS`)"};
}

// The tightest of this process's limits: its cgroups (v2 at `cgroup_root`, or its `unified`
// folder on a hybrid system; v1 at `cgroup_root`/memory) and RLIMIT_AS.
inline MemoryHeadroom memory_headroom(const std::string& proc_cgroup = "/proc/self/cgroup",
                                      const std::string& cgroup_root = "/sys/fs/cgroup") {
  MemoryHeadroom tightest;
  const auto keep = [&](MemoryHeadroom candidate) {
    if (candidate.bytes < tightest.bytes) tightest = std::move(candidate);
  };
  if (const auto text = read_small_file(proc_cgroup)) {
    const CgroupPaths paths = parse_proc_cgroup(*text);
    if (paths.unified) {
      keep(cgroup_headroom(cgroup_root, *paths.unified, kCgroupV2Files));
      keep(cgroup_headroom(cgroup_root + "/unified", *paths.unified, kCgroupV2Files));
    }
    if (paths.memory_v1)
      keep(cgroup_headroom(cgroup_root + "/memory", *paths.memory_v1, kCgroupV1Files));
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const std::string status = read_small_file("/proc/self/status").value_or("");
    const std::uint64_t mapped_kib = keyed_value(status, "VmSize:").value_or(0);
    keep(address_space_headroom(limit.rlim_cur, mapped_kib << 10));
  }
  return tightest;
}

// The ConfigError's text when `headroom` cannot hold what a rank needs to connect to its `peers`
// peers; empty when it can.
inline std::string memory_limit_error(const MemoryHeadroom& headroom, int peers) {
  const std::uint64_t needed =
      kMemoryFloorBytes + static_cast<std::uint64_t>(std::max(peers, 0)) * kMemoryPerPeerBytes;
  if (headroom.bytes >= needed) return {};
  return "a rank of a job of " + std::to_string(peers + 1) + " ranks needs about " +
         std::to_string(needed >> 10) + " KiB more memory to connect to its peers, but " +
         headroom.limit + " leaves " + std::to_string(headroom.bytes >> 10) + " KiB; " +
         headroom.fix;
}

// Throws ConfigError, before any socket is opened, when this process's memory limits cannot hold
// what connecting to `peers` peers takes (see the top of this header).
inline void ensure_memory_limit(int peers, const ErrorContext& context) {
  const std::string error = memory_limit_error(memory_headroom(), peers);
  if (!error.empty()) throw ConfigError(error, context);
}

}  // namespace coltrain::comm::detail
