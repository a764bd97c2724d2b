#pragma once
// Tuning from measurement: what `coltrain_tune` (benchmarks/coltrain_tune.cpp) measured on the
// user's own machines, kept in a JSON file that a Communicator loads (COLTRAIN_TUNING_FILE, or
// Communicator::use_tuning). Per backend it holds the cost model's constants fitted to the
// measurements, and per collective and job shape (backend, ranks, hosts) that was measured, the
// fastest algorithm from each message size on, as Open MPI's dynamic rules give an algorithm per
// communicator size and message size. Algorithm::kAutomatic follows a rule where one matches the
// call and the cost model, with the file's constants, everywhere else. It also holds the sizes at
// which single copy between ranks of a host paid for exchanges there. docs/collectives.md shows
// the format; one file serves every rank of a job and every job on the machines it was measured on.

#include <coltrain/comm/options.hpp>
#include <coltrain/comm/tuning/cost_model.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace coltrain::comm {

// From `from_bytes` on (up to the next rule's), `algorithm` was the fastest.
struct SizeRule {
  std::size_t from_bytes = 0;
  Algorithm algorithm = Algorithm::kRing;
  friend bool operator==(const SizeRule&, const SizeRule&) = default;
};

// The rules of one collective on one job shape; `sizes` ascend and the first starts at 0.
struct CollectiveRules {
  Backend backend = Backend::kTcp;
  Collective collective = Collective::kAllreduce;
  int ranks = 1;
  int hosts = 1;
  std::vector<SizeRule> sizes;
  friend bool operator==(const CollectiveRules&, const CollectiveRules&) = default;
};

struct TuningFile {
  static constexpr int kVersion = 1;

  std::map<Backend, CostModel> cost_models;  // fitted constants, per backend measured
  std::vector<CollectiveRules> rules;
  // The call sizes where exchanges between ranks of a host went faster by single copy than through
  // the rings, for payloads on huge pages and on 4 KiB pages: they replace CommOptions'
  // single_copy_exchanges and single_copy_exchanges_on_small_pages. Unset: not measured.
  std::optional<CallSizeRange> single_copy_exchanges;
  std::optional<CallSizeRange> single_copy_exchanges_on_small_pages;
  // Where, when and how it was measured, as JSON text (empty: nothing recorded); kept, not
  // interpreted. Text rather than a Json value keeps the JSON parser out of this header.
  std::string measured;

  // The fitted constants of `backend`, or null where the file has none.
  const CostModel* cost_model_for(Backend backend) const {
    const auto found = cost_models.find(backend);
    return found == cost_models.end() ? nullptr : &found->second;
  }

  // The measured algorithm for a call, where a rule covers its backend, collective and shape.
  std::optional<Algorithm> rule_for(Backend backend, Collective collective, int ranks, int hosts,
                                    std::size_t bytes) const {
    for (const CollectiveRules& r : rules) {
      if (r.backend != backend || r.collective != collective || r.ranks != ranks ||
          r.hosts != hosts || r.sizes.empty())
        continue;
      Algorithm chosen = r.sizes.front().algorithm;
      for (const SizeRule& size : r.sizes) {
        if (size.from_bytes > bytes) break;
        chosen = size.algorithm;
      }
      return chosen;
    }
    return std::nullopt;
  }
};

// The tuning file in `text`; `source` names it in errors (ConfigError, naming the field).
COLTRAIN_DECL TuningFile parse_tuning_file(std::string_view text, const std::string& source);

// `file` as the JSON text that parse_tuning_file reads.
COLTRAIN_DECL std::string tuning_file_text(const TuningFile& file);

COLTRAIN_DECL TuningFile load_tuning_file(const std::string& path);

// Writes `file` to `path` atomically: a reader sees the old file or the new one, never a part.
COLTRAIN_DECL void save_tuning_file(const std::string& path, const TuningFile& file);

}  // namespace coltrain::comm

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/comm/impl/tuning_file.ipp>
#endif
