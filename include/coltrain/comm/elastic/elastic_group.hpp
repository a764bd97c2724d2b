#pragma once
// ElasticGroup: a TCP job whose membership may change while it runs. It holds the current
// communicator ("generation") and forms the next one when ranks die (shrink) or when processes
// started later ask to join (grow back), over fresh connections, without the launcher's help.
// How a generation forms, and what membership does and does not promise:
// comm/elastic/elastic_membership.hpp and docs/fault-tolerance.md.
//
// This header declares the class only; its work (the rendezvous, the handshakes) is compiled where
// the Communicator's is: inline in header-only builds, once in <coltrain/src.hpp> under separate
// compilation.

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/elastic/elastic_options.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/launch_env.hpp>

#include <memory>
#include <vector>

namespace coltrain::comm {

namespace detail {
class ElasticMembership;
}  // namespace detail

class ElasticGroup {
 public:
  // Forms the first generation from the launcher's environment: the ranks of WORLD_SIZE that reach
  // rank 0 within COLTRAIN_TIMEOUT (at least min_ranks), or, with `elastic.join`, joins a running
  // job. Throws CommError or TimeoutError, ConfigError for bad addresses.
  ElasticGroup(const LaunchEnv& env, CommOptions options = comm_options_from_env(),
               ElasticOptions elastic = {});
  ~ElasticGroup();
  ElasticGroup(const ElasticGroup&) = delete;
  ElasticGroup& operator=(const ElasticGroup&) = delete;

  Communicator& communicator();
  int rank() const;
  int size() const;
  int generation() const;
  const ElasticOptions& options() const;

  // After a collective failed: closes the communicator and forms the next generation of the ranks
  // that are alive, expecting all but `failed` (ranks of this generation known dead). Returns what
  // changed. Throws CommError naming the count when fewer than min_ranks remain, and when this rank
  // was left out.
  MembershipChange regroup(const std::vector<int>& failed);

  // The leader: how many processes wait at its door to join; 0 on the other ranks. Never blocks.
  int joiners_waiting();

  // Every rank, once they agreed that joiners wait (an epoch start): closes the communicator and
  // forms the next generation with them.
  MembershipChange admit_joiners();

  // Whether this rank leads: rank 0 of the generation, or the leader of a regroup that failed.
  bool leading() const;

 private:
  std::unique_ptr<detail::ElasticMembership> membership_;
};

}  // namespace coltrain::comm

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/comm/impl/elastic_group.ipp>
#endif
