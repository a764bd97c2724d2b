#pragma once
// How long a TCP rank waiting for its peers spins (non-blocking attempts) before it sleeps in
// poll(). TcpTransport asks spin_before_sleep() once, at construction, unless CommOptions
// (COLTRAIN_SPIN_US) sets it.

#include <coltrain/core/launch_env.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

namespace coltrain::comm::detail {

// How long a waiting rank keeps making non-blocking attempts before it sleeps in poll(). Waking up
// costs up to milliseconds on a VM (a halted vCPU must be rescheduled), which halves the bandwidth
// of a pipelined ring, so a rank with a core of its own spins through the gaps between chunks.
// Ranks that outnumber the cores spin only a little longer than a loopback round trip, so that they
// do not starve each other.
inline constexpr auto kSpinWithOwnCore = std::chrono::microseconds(2000);
inline constexpr auto kSpinWhenSharingCores = std::chrono::microseconds(50);

inline std::chrono::microseconds spin_before_sleep(const LaunchEnv& env) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const auto local_ranks = static_cast<unsigned>(env.local_world_size.value_or(env.world_size));
  return local_ranks <= cores ? kSpinWithOwnCore : kSpinWhenSharingCores;
}

}  // namespace coltrain::comm::detail
