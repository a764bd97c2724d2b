#pragma once
// The open-file limit a TCP job needs: one socket per peer, so a job of p ranks needs p
// descriptors a rank beyond those already open. Checked before a rank opens any socket: a soft
// limit below that is raised to what the hard limit allows (as Open MPI and MPICH's Hydra do); a
// hard limit below it is a ConfigError that names RLIMIT_NOFILE, both limits and how to raise
// them. Ranks started alike share their limits, so every rank stops at once with the same message
// instead of one failing in the middle of the mesh and the others waiting on it.

#include <coltrain/core/error.hpp>

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <system_error>

namespace coltrain::comm::detail {

// Room for the listeners and what the process opens meanwhile (a log, a checkpoint, the port
// file), beyond the sockets to peers.
inline constexpr std::uint64_t kDescriptorHeadroom = 16;

// Descriptors this process has open now (from /proc/self/fd; 3 if it cannot be read).
inline std::uint64_t open_descriptor_count() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 3;
  std::uint64_t count = 0;
  while (const dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.') ++count;
  ::closedir(dir);
  return count > 0 ? count - 1 : 0;  // less the directory's own descriptor
}

// What to do about the limit: nothing (raise_to 0), raise the soft limit to raise_to, or fail
// with `error`.
struct DescriptorLimitPlan {
  std::uint64_t needed = 0;
  rlim_t raise_to = 0;
  std::string error;
};

inline DescriptorLimitPlan plan_descriptor_limit(std::uint64_t open_now, int peers, rlim_t soft,
                                                 rlim_t hard) {
  DescriptorLimitPlan plan;
  plan.needed = open_now + static_cast<std::uint64_t>(peers) + kDescriptorHeadroom;
  if (soft == RLIM_INFINITY || soft >= plan.needed) return plan;
  if (hard == RLIM_INFINITY || hard >= plan.needed) {
    plan.raise_to = hard;
    return plan;
  }
  const std::string n = std::to_string(plan.needed);
  plan.error = "a job of " + std::to_string(peers + 1) + " ranks needs about " + n +
               " open descriptors in each rank (a socket per peer, " + std::to_string(open_now) +
               " open already), but RLIMIT_NOFILE allows " + std::to_string(soft) +
               " (hard limit " + std::to_string(hard) +
               "); raise it where the ranks are started: `ulimit -n " + n +
               "` in the job script (an administrator raises the hard limit in "
               "/etc/security/limits.conf or a systemd unit's LimitNOFILE=), Slurm's "
               "`srun --propagate=NOFILE`, or a container's `--ulimit nofile=" +
               n + "`";
  return plan;
}

// Makes room for `peers` more sockets, or throws ConfigError (see the top of this header).
inline void ensure_descriptor_limit(int peers, const ErrorContext& context) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;  // nothing known to check against
  const DescriptorLimitPlan plan =
      plan_descriptor_limit(open_descriptor_count(), peers, limit.rlim_cur, limit.rlim_max);
  if (!plan.error.empty()) throw ConfigError(plan.error, context);
  if (plan.raise_to == 0) return;
  const rlim_t soft = limit.rlim_cur;
  limit.rlim_cur = plan.raise_to;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0)
    throw ConfigError("RLIMIT_NOFILE: cannot raise the soft limit from " + std::to_string(soft) +
                          " to " + std::to_string(plan.raise_to) + " for a job of " +
                          std::to_string(peers + 1) +
                          " ranks: " + std::generic_category().message(errno),
                      context);
}

}  // namespace coltrain::comm::detail
