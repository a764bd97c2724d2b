#pragma once
// Elastic training's hand-over: after the ranks changed (comm/elastic/elastic_group.hpp), every
// rank takes one rank's training state from memory, so no checkpoint is read. A step completes
// only with every old rank's gradients, so the state after any rank's last completed step is a
// state of the run; but the survivors need not have completed the same steps: a collective can
// complete on some ranks and fail on others (a rank killed just after its last send loses the
// bytes still on their way to a slower peer with its connection), leaving them one step apart. The
// state handed over is that of the lowest rank among those that completed the most steps
// (most_advanced_rank), so no completed step is trained twice. Rank 0's parameters and buffers
// travel with the new DataParallel's start (another rank's are broadcast after it); this header
// carries the rest: where in the epoch the run stands, the step counters, and the optimizer's
// state (moments, fp32 masters, loss scale).
//
// The rest of the epoch is shared anew among the ranks left (data/epoch_plan.hpp), from where the
// handing rank stood. The learning rate is left as it was: each rank's gradients are averaged, so
// with fewer ranks a step averages fewer samples (the global batch shrinks with the ranks) at the
// same rate, which is what Horovod elastic and torchrun do unless the user rescales
// (docs/fault-tolerance.md). In deterministic mode (DataParallelOptions::micro_shards) the global
// batch stays the same instead: each rank's block of it grows as ranks leave, a failed step is
// computed again by the ranks left, and the run keeps the bits of one that never changed its
// ranks (train/trainer.hpp).

#include <coltrain/comm/communicator.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/optim/precision.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace coltrain::train {

// Where a run stands, as rank 0 hands it over.
struct ElasticPosition {
  std::int64_t epoch = 0;          // the epoch in progress (0-based)
  std::int64_t taken = 0;          // samples each rank took of the epoch's current plan
  bool trained = false;            // the epoch's steps are done; its evaluation is not
  std::int64_t global_step = 0;    // steps completed
  std::uint64_t context_step = 0;  // the network's random-mask counter
  double train_seconds = 0;
  // Deterministic mode: the epoch's summed global-batch losses and samples so far, the same on
  // every rank that completed the same steps (the Trainer counts them once, on rank 0).
  double loss_sum = 0;
  double samples = 0;
};

namespace detail {

// Rank `root`'s text to every rank: the length, then the bytes in 8-byte words. Collective.
inline std::string broadcast_text(comm::Communicator& comm, std::string text, int root) {
  std::int64_t length = static_cast<std::int64_t>(text.size());
  comm.broadcast(std::span(&length, 1), root);
  std::vector<std::int64_t> words(static_cast<std::size_t>((length + 7) / 8));
  if (comm.rank() == root && length > 0) std::memcpy(words.data(), text.data(), text.size());
  comm.broadcast(std::span(words), root);
  text.resize(static_cast<std::size_t>(length));
  if (length > 0) std::memcpy(text.data(), words.data(), text.size());
  return text;
}

}  // namespace detail

// The rank whose state every rank takes: the lowest of those that completed the most steps
// (`completed_steps`, this rank's count). Collective.
inline int most_advanced_rank(comm::Communicator& comm, std::int64_t completed_steps) {
  std::vector<std::int64_t> steps(static_cast<std::size_t>(comm.size()));
  comm.allgather(std::span<const std::int64_t>(&completed_steps, 1), std::span(steps));
  return static_cast<int>(std::max_element(steps.begin(), steps.end()) - steps.begin());
}

// Rank `source`'s position and optimizer state to every rank; returns its position. The optimizer
// must be built over the same parameters on every rank. Collective.
template <class Policy, class Optimizer>
ElasticPosition share_training_state(comm::Communicator& comm,
                                     optim::PrecisionOptimizer<Policy, Optimizer>& optimizer,
                                     const ElasticPosition& mine, int source = 0) {
  using Snapshot = typename optim::PrecisionOptimizer<Policy, Optimizer>::Snapshot;
  // The header travels as JSON text: dump() writes the shortest text that reads back to the same
  // double, so positions and the loss scale arrive bit for bit.
  Json header;
  std::vector<optim::master_t<Policy>> values;
  if (comm.rank() == source) {
    const Snapshot snapshot = optimizer.export_state();
    header = Json::object({{"epoch", mine.epoch},
                           {"taken", mine.taken},
                           {"trained", mine.trained},
                           {"global_step", mine.global_step},
                           {"context_step", mine.context_step},
                           {"train_seconds", mine.train_seconds},
                           {"loss_sum", mine.loss_sum},
                           {"samples", mine.samples}});
    Json& step_counts = header["step_counts"] = Json::array();
    // Element by element: the snapshot's type depends on the policy, and cudafe++ mistranslates
    // braced lists of dependent members (as checkpoint.hpp's AdamRecord says).
    const auto pair = [](Json first, Json second) {
      Json out = Json::array();
      out.push_back(std::move(first));
      out.push_back(std::move(second));
      return out;
    };
    for (const auto& [name, count] : snapshot.step_counts) step_counts.push_back(pair(name, count));
    for (const auto& [key, tensors] :
         {std::pair{"state", &snapshot.state}, std::pair{"masters", &snapshot.masters}}) {
      Json& entries = header[key] = Json::array();
      for (const typename Snapshot::Tensor& t : *tensors) {
        entries.push_back(pair(t.name, t.values.size()));
        values.insert(values.end(), t.values.begin(), t.values.end());
      }
    }
    if (snapshot.loss_scale) {
      header["loss_scale"] = pair(snapshot.loss_scale->scale, snapshot.loss_scale->growth_tracker);
    }
  }
  header = Json::parse(
      detail::broadcast_text(comm, comm.rank() == source ? header.dump() : std::string(), source));
  std::size_t total = 0;
  for (const char* key : {"state", "masters"})
    for (const auto& entry : header[key]) total += entry[1].get<std::size_t>();
  values.resize(total);
  comm.broadcast(std::span(values), source);

  ElasticPosition position;
  position.epoch = header["epoch"].get<std::int64_t>();
  position.taken = header["taken"].get<std::int64_t>();
  position.trained = header["trained"].get<bool>();
  position.global_step = header["global_step"].get<std::int64_t>();
  position.context_step = header["context_step"].get<std::uint64_t>();
  position.train_seconds = header["train_seconds"].get<double>();
  position.loss_sum = header["loss_sum"].get<double>();
  position.samples = header["samples"].get<double>();
  if (comm.rank() == source) return position;

  Snapshot snapshot;
  for (const Json& entry : header["step_counts"])
    snapshot.step_counts.emplace_back(entry[0].as_string(), entry[1].get<std::int64_t>());
  std::size_t next = 0;
  for (const auto& [key, tensors] :
       {std::pair{"state", &snapshot.state}, std::pair{"masters", &snapshot.masters}}) {
    for (const Json& entry : header[key]) {
      const auto size = entry[1].template get<std::size_t>();
      tensors->push_back({entry[0].template get<std::string>(),
                          std::vector(values.begin() + static_cast<std::ptrdiff_t>(next),
                                      values.begin() + static_cast<std::ptrdiff_t>(next + size))});
      next += size;
    }
  }
  if (header.contains("loss_scale"))
    snapshot.loss_scale = optim::DynamicLossScaler::State{
        header["loss_scale"][0].get<float>(), header["loss_scale"][1].get<std::int64_t>()};
  optimizer.import_state(snapshot);
  return position;
}

}  // namespace coltrain::train
