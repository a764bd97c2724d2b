#pragma once
// ElasticTraining: train::Trainer's strategy for elastic training over a comm::ElasticGroup. It
// owns what only an elastic run has: the DataParallel on the group's current communicator (built
// anew each generation), the epoch's plan shared among the ranks of now (data/epoch_plan.hpp), the
// network's buffers as the current step found them, and the hand-over of the training state
// (train/elastic.hpp) when ranks die or join. The trainer calls it at four points: an epoch's
// start (joiners come in, the plan is shared), a step's start, a failed collective (regroup and
// hand-over), and fit()'s start (the loaders' checks). In deterministic mode the plan shares
// whole global batches and each rank's loader batch follows its block of them; a world size that
// would change the bits (micro_shards_fit) is refused: joiners wait, and a regroup to such a size
// ends the run with the leader's final checkpoint.

#include <coltrain/comm/elastic/elastic_group.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/epoch_plan.hpp>
#include <coltrain/data/loader.hpp>
#include <coltrain/train/data_parallel.hpp>
#include <coltrain/train/deterministic_gradients.hpp>
#include <coltrain/train/elastic.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::train {

template <class Net, class LocalOptimizer>
class ElasticTraining {
  using T = typename Net::value_type;

 public:
  // Builds the DataParallel on the group's communicator (collective) and takes the running ranks'
  // state (take_state): the optimizer state (fp32 masters built before the weights were
  // broadcast) and, for a joiner (ElasticOptions::join), the running job's position, as start()
  // returns it.
  ElasticTraining(Net& network, LocalOptimizer& optimizer, comm::ElasticGroup& group,
                  DataParallelOptions ddp_options)
      : network_(network),
        optimizer_(optimizer),
        group_(group),
        ddp_options_(ddp_options),
        joining_(group.options().join) {
    ddp_.emplace(network_, group_.communicator(), ddp_options_);
    start_ = take_state(ElasticPosition{});
    network_.context().set_step(start_.context_step);
  }

  DataParallel<Net>& ddp() { return *ddp_; }
  const DataParallel<Net>& ddp() const { return *ddp_; }
  // Where the run stood when this process took the state: a joiner's start.
  const ElasticPosition& start() const { return start_; }
  // True once, in a joiner's first fit(): it starts at start() and writes no run log.
  bool take_joining() { return std::exchange(joining_, false); }

  // fit()'s start: the loaders fit elastic training, and the validation set is shared among the
  // ranks of now.
  template <class Transform>
  void prepare(const data::Loader<T, Transform>& train, data::Loader<T, Transform>& validation) {
    if (!train.sampler() || validation.sampler()) {
      throw InvalidArgument(
          "Trainer (elastic): the training loader needs a DistributedSampler (its order is "
          "shared anew when the ranks change) and the validation loader a fixed order (rank r "
          "of R evaluates samples r, r + R, ...)");
    }
    const std::int64_t global_batch = train.sampler()->options().global_batch;
    if (ddp_options_.micro_shards > 0 &&
        (global_batch <= 0 || global_batch % ddp_options_.micro_shards != 0)) {
      throw InvalidArgument(
          "Trainer (elastic, deterministic): the training sampler's global_batch is " +
          std::to_string(global_batch) + "; it must be a positive multiple of the " +
          std::to_string(ddp_options_.micro_shards) +
          " micro-shards, so that every world size takes the same global batches");
    }
    share_validation(validation);
  }

  // Starts epoch `epoch`: the sampler's order of it shared among the ranks of now.
  template <class Transform>
  void begin_epoch(data::Loader<T, Transform>& train, std::int64_t epoch) {
    data::DistributedSampler sampler = *train.sampler();
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    plan_ = sampler.plan();
    plan_.replicas = ddp_->world_size();
    follow_block(train);
    train.start_epoch(static_cast<std::uint64_t>(epoch), plan_.share(ddp_->rank()));
  }

  // After a hand-over into epoch `at.epoch`: the rest of it shared among the ranks of now.
  template <class Transform>
  void resume_epoch(data::Loader<T, Transform>& train, const ElasticPosition& at) {
    plan_ = plan_.remainder(at.trained ? plan_.per_rank() : at.taken, ddp_->world_size());
    follow_block(train);
    train.start_epoch(static_cast<std::uint64_t>(at.epoch),
                      at.trained ? std::vector<std::int64_t>{} : plan_.share(ddp_->rank()));
  }

  // The buffers and the random-mask counter as a step found them: a step that fails leaves its
  // forward pass's running statistics behind, which the run must not keep.
  void begin_step() {
    in_step_ = true;
    step_context_ = network_.context().step();
    step_buffers_.clear();
    network_.visit_buffers([&](const std::string&, auto& buffer) {
      const auto bytes = std::as_bytes(buffer.span());
      step_buffers_.insert(step_buffers_.end(), bytes.begin(), bytes.end());
    });
  }
  void end_step() { in_step_ = false; }

  // This rank's position for a hand-over: `mine` with the random-mask counter as the last
  // completed step left it.
  ElasticPosition position(ElasticPosition mine) const {
    mine.context_step = in_step_ ? step_context_ : network_.context().step();
    return mine;
  }

  // A collective failed: regroups the survivors and takes the state handed over (take_state),
  // which it returns (the network's weights, buffers and counter and the optimizer's state are set
  // already). Below the group's min_ranks, the leader calls last_words(mine) (the trainer's final
  // checkpoint), and every rank throws the regroup's error.
  template <class Transform, class LastWords>
  ElasticPosition recover(const CommError& error, const ElasticPosition& mine,
                          data::Loader<T, Transform>& validation, std::ostream& out,
                          LastWords&& last_words) {
    const int old_rank = ddp_->rank();
    std::vector<int> failed;
    if (error.context().peer && *error.context().peer != old_rank)
      failed.push_back(*error.context().peer);
    ddp_.reset();  // waits for its issued buckets; the old communicator goes next
    optimizer_.abandon_step();
    if (in_step_) restore_step_start();
    network_.train();
    comm::MembershipChange change;
    try {
      change = group_.regroup(failed);
    } catch (const CommError&) {
      if (group_.leading()) last_words(mine);
      throw;
    }
    if (!fits(change.size)) {
      if (group_.leading()) last_words(mine);
      throw InvalidArgument("Trainer (elastic, deterministic): " + std::to_string(change.size) +
                            " ranks left after " + error.message() + "; " + fit_rule());
    }
    return adopt_state(change, validation, mine, out, error.message());
  }

  // At an epoch start: lets waiting processes join (every rank regroups with them). Returns the
  // position handed over, or nothing when none waited. Collective.
  template <class Transform>
  std::optional<ElasticPosition> admit_joiners(const ElasticPosition& mine,
                                               data::Loader<T, Transform>& validation,
                                               std::ostream& out) {
    double waiting = static_cast<double>(group_.joiners_waiting());
    ddp_->allreduce(std::span(&waiting, 1), comm::ReduceOp::kMax);
    if (waiting == 0) return std::nullopt;
    const int size = ddp_->world_size() + static_cast<int>(waiting);
    if (!fits(size)) {  // they wait on; a later arrival may make a size that fits
      if (ddp_->rank() == 0) {
        out << "elastic: " << waiting << " waiting to join not admitted: " << size << " ranks; "
            << fit_rule() << '\n'
            << std::flush;
      }
      return std::nullopt;
    }
    ddp_.reset();
    const comm::MembershipChange change = group_.admit_joiners();
    if (!fits(change.size)) {
      throw InvalidArgument("Trainer (elastic, deterministic): " + std::to_string(change.size) +
                            " ranks after admitting " + std::to_string(change.joined) + "; " +
                            fit_rule());
    }
    return adopt_state(change, validation, position(mine), out);
  }

 private:
  // After the DataParallel's start (rank 0's parameters and buffers on every rank): the state of
  // the most advanced rank (train/elastic.hpp), whose parameters and buffers follow when it is not
  // rank 0. Collective.
  ElasticPosition take_state(const ElasticPosition& mine) {
    comm::Communicator& comm = group_.communicator();
    const int source = most_advanced_rank(comm, mine.global_step);
    if (source != 0) detail::broadcast_parameters_and_buffers(network_, comm, source);
    return share_training_state(comm, optimizer_, mine, source);
  }

  // Deterministic mode: whether `size` ranks keep the run's bits
  // (train/deterministic_gradients.hpp).
  bool fits(int size) const {
    return ddp_options_.micro_shards == 0 || micro_shards_fit(ddp_options_.micro_shards, size);
  }
  std::string fit_rule() const {
    return "deterministic mode's " + std::to_string(ddp_options_.micro_shards) +
           " micro-shards need a world size that divides them into a power of two per rank";
  }

  // Deterministic mode: each rank's batch is its block of the global batch, which depends on the
  // ranks of now.
  template <class Transform>
  void follow_block(data::Loader<T, Transform>& train) const {
    if (plan_.global_batch > 0) train.set_batch_size(plan_.block());
  }

  void restore_step_start() {
    std::size_t next = 0;
    network_.visit_buffers([&](const std::string&, auto& buffer) {
      const auto bytes = std::as_writable_bytes(buffer.span());
      std::copy_n(step_buffers_.begin() + static_cast<std::ptrdiff_t>(next), bytes.size(),
                  bytes.begin());
      next += bytes.size();
    });
    network_.context().set_step(step_context_);
    in_step_ = false;
  }

  // Rank r of R evaluates validation samples r, r + R, ...
  template <class Transform>
  void share_validation(data::Loader<T, Transform>& validation) const {
    std::vector<std::int64_t> shard;
    for (std::int64_t i = ddp_->rank(); i < validation.dataset().size(); i += ddp_->world_size())
      shard.push_back(i);
    validation.set_order(std::move(shard));
  }

  // The handing rank's parameters, buffers, position and optimizer state to every
  // rank of the new generation (a joiner's constructor takes them likewise); the validation set
  // shared among its ranks.
  template <class Transform>
  ElasticPosition adopt_state(const comm::MembershipChange& change,
                              data::Loader<T, Transform>& validation, const ElasticPosition& mine,
                              std::ostream& out, const std::string& cause = {}) {
    ddp_.emplace(network_, group_.communicator(), ddp_options_);
    const ElasticPosition at = take_state(mine);
    network_.context().set_step(at.context_step);
    share_validation(validation);
    if (ddp_->rank() == 0) {
      if (!cause.empty()) out << "elastic: " << cause << '\n';
      out << "elastic: generation " << change.generation << ", " << change.previous_size << " -> "
          << change.size << " ranks";
      if (!change.departed.empty()) {
        out << " (lost";
        for (const int r : change.departed) out << " rank " << r;
        out << ")";
      }
      if (change.joined > 0) out << " (" << change.joined << " joined)";
      out << std::fixed << std::setprecision(2) << " in " << change.seconds
          << " s; continuing in epoch " << at.epoch + 1 << " after "
          << (at.trained ? std::string("its steps")
                         : std::to_string(at.taken) + " samples per rank")
          << ", step " << at.global_step << '\n'
          << std::flush;
    }
    return at;
  }

  Net& network_;
  LocalOptimizer& optimizer_;
  comm::ElasticGroup& group_;
  DataParallelOptions ddp_options_;
  std::optional<DataParallel<Net>> ddp_;
  bool joining_ = false;
  ElasticPosition start_;
  data::EpochPlan plan_;  // the current epoch's samples and ranks
  bool in_step_ = false;
  std::uint64_t step_context_ = 0;
  std::vector<std::byte> step_buffers_;
};

}  // namespace coltrain::train
