#pragma once
// What an elastic job is told (ElasticOptions) and what it reports after each membership change
// (MembershipChange): comm/elastic/elastic_group.hpp.

#include <chrono>
#include <vector>

namespace coltrain::comm {

struct ElasticOptions {
  // Fewer ranks than this after a failure: the job stops (ElasticGroup::regroup throws).
  int min_ranks = 1;
  // How long a leader waits for the ranks it expects, and a rank for a leader candidate to answer.
  std::chrono::milliseconds regroup_window{std::chrono::seconds(5)};
  // This process joins a running job (grow back) instead of starting one: it waits up to
  // join_timeout for the leader to admit it, which happens at the job's next epoch boundary.
  bool join = false;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
};

// What a membership change did, for the trainer's log line.
struct MembershipChange {
  int generation = 0;
  int previous_size = 0;
  int size = 0;
  std::vector<int> departed;  // ranks of the previous generation that are not in this one
  int joined = 0;             // processes that came in as joiners
  double seconds = 0;         // from the start of the regroup to the new communicator
};

}  // namespace coltrain::comm
