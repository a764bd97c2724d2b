#pragma once
// Trainer: the epoch loop of data-parallel classification training, with what users of PyTorch
// Lightning and MLBench expect around it: one line per epoch on rank 0, a progress bar on a
// terminal, validation metrics (top-1, top-5, macro precision/recall/F1, the confusion matrix at
// the end), a profile of where the time went, a time-to-accuracy goal, run records and
// checkpoints with exact resume.
//
//   train::DataParallel ddp(net, comm);
//   optim::PrecisionOptimizer<optim::Fp32, optim::Sgd> sgd(optim::parameters_of(net), ...);
//   train::Trainer trainer(net, sgd, ddp, optim::CosineAnnealingLr{...}, {.epochs = 10});
//   train::FitResult result = trainer.fit(train_loader, validation_loader);
//
// A step: forward, loss (scaled under fp16), backward (gradient buckets are allreduced while it
// runs), wait for the last buckets, agree across ranks on whether the gradients are finite, and
// step the optimizer (or skip it and back off the loss scale). Each rank trains on its own shard
// (the loaders' samplers); validation runs on each rank's shard and the counts are summed, so the
// metrics are those of the whole validation set. Before it, BatchNorm's running statistics
// (which each rank gathered on its own shard) are averaged across ranks, so that every rank
// evaluates the same network and rank 0's checkpoint, written after the evaluation, holds it.
//
// Resume: with `resume` and a checkpoint directory, fit() loads the newest complete checkpoint
// (weights, optimizer state, loss scale, the network's step counter) on every rank and continues
// after its epoch; data order and learning rate are functions of (seed, epoch) and the step, so on
// the CPU the result equals an uninterrupted run's, bit for bit, buffers included (every rank of
// the uninterrupted run holds the checkpoint's averaged statistics at that point too).
//
// Deterministic mode (a DataParallel with micro_shards, train/data_parallel.hpp): each loader
// batch is this rank's block of a global batch (a sampler with global_batch = batch size x world
// size, data/sampler.hpp), cut into the rank's micro-shards, each a forward and backward pass of
// its own; weights, buffers, losses and checkpoints are then the same bits on 1, 2, 4 or 8 ranks
// (micro_shards = 8), gradient accumulation included. The epoch's training loss is rank 0's count
// of the global losses, the others adding none, so that it too does not depend on the world size.
//
// Elastic (the constructor that takes a comm::ElasticGroup, TCP): when ranks die, the survivors
// regroup, take the most advanced survivor's state from memory and share the rest of the epoch,
// and the run goes on; processes that ask to join come in at an epoch start
// (docs/fault-tolerance.md). In deterministic mode the global batch stays the same whatever the
// ranks (each loader's batch follows its block), so a run that shrinks and grows ends with the
// bits of one that did not; only the epoch's training accuracy counts the hits of the survivors
// alone in an epoch where ranks died.
//
// What the CPU and GPU trainers share (resume, the epoch's counts across ranks, the epoch line,
// run records, the target, early stopping, the report) is train/epoch_loop.hpp's EpochLoop; the
// optimizer's placement (whole on every rank, or ZeRO-1 shards) is a strategy of
// train/optimizer_sharding.hpp.

#include <coltrain/comm/elastic/elastic_group.hpp>
#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/core/terminal.hpp>
#include <coltrain/core/timer.hpp>
#include <coltrain/data/epoch_plan.hpp>
#include <coltrain/data/loader.hpp>
#include <coltrain/nn/loss.hpp>
#include <coltrain/optim/gradient_clipping.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/data_parallel.hpp>
#include <coltrain/train/elastic.hpp>
#include <coltrain/train/elastic_training.hpp>
#include <coltrain/train/epoch_loop.hpp>
#include <coltrain/train/metrics.hpp>
#include <coltrain/train/optimizer_sharding.hpp>
#include <coltrain/train/phase_tracker.hpp>
#include <coltrain/train/trainer_options.hpp>
#include <coltrain/train/zero_optimizer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace coltrain::train {

namespace detail {

// Rank 0's report of an evaluated checkpoint (TrainerOptions::eval_only): one line, the confusion
// matrix, and with a log directory evaluation.json there, written atomically.
inline void report_evaluation(const TrainerOptions& options, const TrainingState& state,
                              const ClassificationMetrics& metrics, int world_size) {
  std::ostream& out = *options.out;
  out << "checkpoint " << checkpoint_source(options).string() << " (epoch " << state.epoch
      << ", step " << state.global_step << "): " << std::fixed << std::setprecision(4)
      << "validation loss: " << metrics.mean_loss() << "  validation accuracy: " << metrics.top1();
  if (const std::optional<double> top5 = metrics.top5()) out << "  top-5: " << *top5;
  out << "  macro F1: " << metrics.macro_f1() << '\n';
  if (options.report)
    out << "confusion matrix (rows: true class, columns: predicted)\n"
        << metrics.format_confusion_matrix() << '\n';
  if (!options.log_dir.empty()) {
    Json record;
    record["checkpoint"] = checkpoint_source(options).string();
    record["epoch"] = state.epoch;
    record["global_step"] = state.global_step;
    record["world_size"] = world_size;
    record["validation"] = metrics.to_json(true);
    std::filesystem::create_directories(options.log_dir);
    write_file_atomically(options.log_dir / "evaluation.json", record.dump(2) + "\n",
                          "write evaluation record");
    out << "evaluation record: " << (options.log_dir / "evaluation.json").string() << '\n';
  }
  out << std::flush;
}

}  // namespace detail

template <class Net, class Policy, class Optimizer>
class Trainer {
  using T = typename Net::value_type;
  static constexpr int kClasses = static_cast<int>(Net::Output::kDims[0]);

 public:
  using Schedule = std::function<double(std::int64_t step)>;

  // The network, optimizer and data-parallel wrapper must outlive the trainer; the optimizer was
  // built from the network's parameters, the schedule maps the global step to a learning rate.
  Trainer(Net& network, optim::PrecisionOptimizer<Policy, Optimizer>& optimizer,
          DataParallel<Net>& ddp, Schedule schedule, TrainerOptions options = {})
      : network_(network),
        optimizer_(optimizer),
        sharding_(ReplicatedOptimizer<Net, Policy, Optimizer>(optimizer)),
        ddp_(&ddp),
        schedule_(std::move(schedule)),
        options_(std::move(options)) {
    use_network_threads();
    check_options();
  }

  // ZeRO-1 (train/zero_optimizer.hpp): the optimizer state sharded across the ranks of `ddp`,
  // which must be built with zero_stage = 1. Checkpoints gather the full state (every rank takes
  // part, rank 0 writes) in the unsharded format, so they resume at any world size.
  Trainer(Net& network, ZeroOptimizer<Net, Policy, Optimizer>& optimizer, DataParallel<Net>& ddp,
          Schedule schedule, TrainerOptions options = {})
      : network_(network),
        optimizer_(optimizer.local()),
        sharding_(ShardedOptimizer<Net, Policy, Optimizer>(optimizer)),
        ddp_(&ddp),
        schedule_(std::move(schedule)),
        options_(std::move(options)) {
    use_network_threads();
    check_options();
  }

  // Elastic training over `group` (comm/elastic/elastic_group.hpp): the trainer keeps its own
  // DataParallel (built here, collectively, with `ddp_options`) on the group's communicator. When
  // ranks die, fit() regroups the survivors, hands the most advanced survivor's state to all
  // (train/elastic.hpp), shares the rest of the epoch among them and goes on; below the group's
  // min_ranks it writes a final checkpoint (with a checkpoint directory) and throws. At every
  // epoch start it admits processes waiting to join. A joining process (ElasticOptions::join)
  // takes the state first.
  Trainer(Net& network, optim::PrecisionOptimizer<Policy, Optimizer>& optimizer,
          comm::ElasticGroup& group, Schedule schedule, TrainerOptions options = {},
          DataParallelOptions ddp_options = {})
      : network_(network),
        optimizer_(optimizer),
        sharding_(ReplicatedOptimizer<Net, Policy, Optimizer>(optimizer)),
        schedule_(std::move(schedule)),
        options_(std::move(options)) {
    use_network_threads();
    elastic_.emplace(network_, optimizer_, group, ddp_options);
    global_step_ = elastic_->start().global_step;
    check_options();
  }

  template <class Transform>
  FitResult fit(data::Loader<T, Transform>& train, data::Loader<T, Transform>& validation) {
    if (elastic_) elastic_->prepare(train, validation);
    if (options_.eval_only) return evaluate_checkpoint(validation);
    loop_.emplace(options_, kClasses);
    if (elastic_ && elastic_->take_joining()) {  // rank 0 keeps the job's run log
      loop_->join_at(elastic_->start().epoch, elastic_->start().train_seconds);
    } else {
      if (const auto state = loop_->resume(rank0(), [&] { return load_latest_checkpoint(); }))
        global_step_ = state->global_step;
      loop_->open_log(ddp());
    }
    std::int64_t epoch = loop_->first_epoch();
    bool epoch_begins = true;  // false after a hand-over into the middle of an epoch
    EpochCounts counts;
    while (epoch < options_.epochs) {
      ClassificationMetrics metrics(kClasses);
      try {
        if (epoch_begins) {
          loop_->start_epoch();
          counts = {};
          if (elastic_ && epoch > loop_->first_epoch()) admit_joiners(epoch, validation);
          begin_epoch(train, epoch);
          epoch_begins = false;
        }
        network_.train();
        if (!trained_) train_epoch(train, epoch, counts);
        loop_->count_training(ddp(), contribution(counts));
        auto timed = loop_->phases().time(Phase::kOther);
        metrics = evaluate(validation);
      } catch (const CommError& e) {
        if (!elastic_ || dynamic_cast<const MismatchError*>(&e) != nullptr) throw;
        const ElasticPosition at = recover(e, epoch, counts, validation);
        // Nothing taken: the epoch starts again, unless an earlier hand-over in it had already
        // shared out only its rest (a second failure before the regrouped ranks took a step).
        epoch_begins = at.taken == 0 && !at.trained && !(resumed_ && at.epoch == epoch);
        if (!epoch_begins) resume_epoch(train, at);
        epoch = at.epoch;
        continue;
      }
      std::optional<double> loss_scale;
      if constexpr (Policy::kLossScaling) loss_scale = optimizer_.loss_scale();
      const EpochEnd end = loop_->end_epoch(++epoch, std::move(metrics), global_step_,
                                            schedule_(std::max<std::int64_t>(0, global_step_ - 1)),
                                            loss_scale, rank0());
      if (end.checkpoint && writes_checkpoints()) {
        auto timed = loop_->phases().time(Phase::kOther);
        save(loop_->state(epoch, global_step_));  // the buffers: evaluate() averaged them
      }
      epoch_begins = true;
      if (end.stop) break;
    }
    return loop_->finish(epoch, global_step_, ddp().world_size(), rank0());
  }

  // Validation over each rank's shard, summed across ranks: the whole set's metrics on every rank.
  // Averages the running statistics across ranks first (DataParallel::average_buffers), so every
  // rank evaluates the same network. Collective.
  template <class Transform>
  ClassificationMetrics evaluate(data::Loader<T, Transform>& loader) {
    ddp().average_buffers();
    network_.eval();
    ClassificationMetrics metrics(kClasses);
    loader.start_epoch(0);
    while (const data::Batch<T>* batch = loader.next()) {
      const auto logits = network_.forward(batch->images.view());
      metrics.add_batch(logits, batch->labels, loss_.loss(logits, batch->labels));
    }
    metrics.allreduce(ddp());
    network_.train();
    return metrics;
  }

  std::int64_t global_step() const { return global_step_; }

 private:
  // The optimizer's elementwise passes run on the network's threads: the same bits, and the
  // gradients the workers wrote are updated where they lie.
  void use_network_threads() { optimizer_.use_threads(&network_.context().pool()); }

  void check_options() {
    detail::check_trainer_options(options_, "Trainer");
    // A regroup inside an accumulation would lose the partial sums, and a joiner would not know
    // the early-stopping count.
    if (elastic_ && (options_.grad_accum > 1 || options_.early_stopping_patience))
      throw InvalidArgument(
          "Trainer (elastic): grad_accum > 1 and early_stopping_patience are not available with "
          "elastic training");
    progress_ = rank0() && options_.progress.value_or(writes_to_terminal());
  }

  TrainingState load_latest_checkpoint() {
    const std::filesystem::path& source = detail::checkpoint_source(options_);
    CheckpointOptions load_options = checkpoint_options();
    // An evaluation takes no step: the optimizer's settings need not be the run's.
    if (options_.eval_only) load_options.check_hyperparameters = false;
    return std::visit([&](auto& held) { return held.load(source, network_, load_options); },
                      sharding_);
  }

  // TrainerOptions::eval_only: the newest checkpoint, evaluated.
  template <class Transform>
  FitResult evaluate_checkpoint(data::Loader<T, Transform>& validation) {
    const auto started = std::chrono::steady_clock::now();
    if (!find_latest_checkpoint(detail::checkpoint_source(options_)))
      throw InvalidArgument("Trainer: eval_only: no complete checkpoint to evaluate in " +
                            detail::checkpoint_source(options_).string());
    const TrainingState state = load_latest_checkpoint();
    global_step_ = state.global_step;
    FitResult result;
    result.epochs = state.epoch;
    result.global_step = state.global_step;
    result.validation = evaluate(validation);
    result.total_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (rank0()) detail::report_evaluation(options_, state, result.validation, ddp().world_size());
    return result;
  }

  DataParallel<Net>& ddp() { return elastic_ ? elastic_->ddp() : *ddp_; }
  const DataParallel<Net>& ddp() const { return elastic_ ? elastic_->ddp() : *ddp_; }
  bool rank0() const { return ddp().rank() == 0; }

  // The epoch's steps on this rank's share, counted into `counts`.
  template <class Transform>
  void train_epoch(data::Loader<T, Transform>& train, std::int64_t epoch, EpochCounts& counts) {
    PhaseTracker& phases = loop_->phases();
    // The ranks start the epoch's steps together, so that waiting for another rank's work between
    // epochs (rank 0's log line and checkpoint, an uneven evaluation) is not counted as training
    // time, which a rank alone would not count either.
    if (ddp().world_size() > 1) ddp().barrier();
    const std::int64_t batches = train.batches_this_epoch();
    double shown_loss_sum = 0;  // the progress bar's: this rank's batches' losses and samples
    double shown_samples = 0;
    for (std::int64_t b = 0;; ++b) {
      const auto step_started = std::chrono::steady_clock::now();
      const data::Batch<T>* batch = nullptr;
      {
        auto timed = phases.time(Phase::kData);
        batch = train.next();
      }
      if (!batch) break;
      const auto samples = static_cast<double>(batch->size());
      const StepOutcome outcome = ddp().deterministic()
                                      ? deterministic_step(*batch, phases, b, batches)
                                      : step(*batch, phases, b, batches);
      taken_ += batch->size();
      shown_loss_sum += outcome.loss * samples;
      shown_samples += samples;
      if (ddp().deterministic()) {  // the global batch's mean loss, the same on every rank
        const double global = samples * static_cast<double>(ddp().world_size());
        counts.loss_sum += outcome.loss * global;
        counts.samples += global;
      } else {
        counts.loss_sum += outcome.loss * samples;
        counts.samples += samples;
      }
      counts.correct += static_cast<double>(outcome.correct);
      counts.step_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_started).count();
      if (progress_ && (b % 10 == 0 || b + 1 == batches))
        *options_.out << detail::progress_bar(epoch + 1, options_.epochs, b + 1, batches,
                                              shown_loss_sum / shown_samples,
                                              shown_samples / counts.step_seconds)
                      << std::flush;
    }
    if (progress_) *options_.out << '\r' << std::string(80, ' ') << '\r';
    trained_ = true;
  }

  // What this rank adds to the epoch's counts across ranks: in deterministic mode every rank counts
  // the global batches' losses and samples, so rank 0 alone adds them (the same bits on every
  // world size, and after a hand-over, whichever rank is rank 0 then).
  EpochCounts contribution(EpochCounts counts) const {
    if (ddp().deterministic() && !rank0()) counts.loss_sum = counts.samples = 0;
    return counts;
  }

  // A batch's mean loss and top-1 hits (deterministic mode: the global batch's mean loss and
  // this rank's hits).
  struct StepOutcome {
    double loss = 0;
    std::int64_t correct = 0;
  };

  // Where batch `b` of the `batches` in this epoch lies under gradient accumulation: its index in
  // its group, the group's size, and whether it is the group's last (which synchronises and steps).
  struct AccumulationPlace {
    std::int64_t micro = 0;
    std::int64_t in_group = 1;
    bool synchronised = true;
  };
  AccumulationPlace place_of(std::int64_t b, std::int64_t batches) const {
    const std::int64_t k = options_.grad_accum;
    AccumulationPlace place;
    place.micro = b % k;
    place.in_group = k == 1 ? 1 : std::min(k, batches - (b - place.micro));
    place.synchronised = place.micro + 1 >= place.in_group;
    return place;
  }

  // Batch `b` of the `batches` in this epoch: a whole step, or under gradient accumulation one
  // micro-batch of a group, whose last one synchronises and steps.
  StepOutcome step(const data::Batch<T>& batch, PhaseTracker& phases, std::int64_t b,
                   std::int64_t batches) {
    const AccumulationPlace place = place_of(b, batches);
    if (elastic_) elastic_->begin_step();
    if (place.micro == 0) network_.zero_grad();
    {
      auto timed = phases.time(Phase::kForward);
      output_ = network_.forward(batch.images.view());
    }
    StepOutcome outcome;
    outcome.correct = nn::topk_correct<T>(output_, batch.labels, 1);
    {
      auto timed = phases.time(Phase::kLoss);
      grad_.resize(output_.shape());
      outcome.loss =
          loss_.loss_and_grad(output_, batch.labels, grad_.view(),
                              optimizer_.loss_scale() / static_cast<float>(place.in_group));
    }
    {
      auto timed = phases.time(Phase::kBackward);
      if (!place.synchronised) {
        auto local_only = ddp().no_sync();
        network_.backward(grad_.view());
        if (elastic_) elastic_->end_step();
        return outcome;
      }
      network_.backward(grad_.view());
    }
    phases.add_seconds(Phase::kAllreduceWait, ddp().finish_gradient_sync());
    optimizer_step(phases);
    if (elastic_) elastic_->end_step();
    return outcome;
  }

  // Deterministic mode's step(): the batch, this rank's block of the global batch, cut into the
  // rank's micro-shards, each passed forward and backward inside DataParallel::compute_gradients,
  // which folds them with the other ranks'. Dropout masks are keyed by the micro-batch's number
  // (global step x grad_accum + its index in the group) and the shard. The fold's time counts as
  // the allreduce wait.
  StepOutcome deterministic_step(const data::Batch<T>& batch, PhaseTracker& phases, std::int64_t b,
                                 std::int64_t batches) {
    const AccumulationPlace place = place_of(b, batches);
    const std::int64_t shards = ddp().local_shards();
    if (batch.size() % shards != 0) {
      throw InvalidArgument(
          "Trainer: deterministic mode: a batch of " + std::to_string(batch.size()) +
          " samples does not divide into this rank's " + std::to_string(shards) +
          " micro-shards; the loader's batch must be the sampler's block (global_batch / world "
          "size), a multiple of micro_shards / world size");
    }
    const std::int64_t size = batch.size() / shards;
    const float scale = optimizer_.loss_scale() / static_cast<float>(place.in_group);
    StepOutcome outcome;
    double pass_seconds = 0;
    const Stopwatch whole;
    const auto pass_number =
        static_cast<std::uint64_t>(global_step_ * options_.grad_accum + place.micro);
    outcome.loss = ddp().compute_gradients(
        pass_number,
        [&](int shard) {
          const Stopwatch watch;
          const std::int64_t begin = (shard - ddp().first_shard()) * size;
          const std::span<const std::int32_t> labels(batch.labels.data() + begin,
                                                     static_cast<std::size_t>(size));
          tensor::TensorView<const T> output;
          {
            auto timed = phases.time(Phase::kForward);
            output = network_.forward(batch.images.view().slice(begin, begin + size));
          }
          outcome.correct += nn::topk_correct<T>(output, labels, 1);
          double loss = 0;
          {
            auto timed = phases.time(Phase::kLoss);
            grad_.resize(output.shape());
            loss = loss_.loss_and_grad(output, labels, grad_.view(), scale);
          }
          {
            auto timed = phases.time(Phase::kBackward);
            network_.backward(grad_.view());
          }
          pass_seconds += watch.seconds();
          return loss;
        },
        place.micro > 0);
    phases.add_seconds(Phase::kAllreduceWait, std::max(0.0, whole.seconds() - pass_seconds));
    if (place.synchronised) optimizer_step(phases);
    return outcome;
  }

  // After a synchronised backward pass: every rank agrees whether the gradients are finite, then
  // steps the optimizer at the schedule's rate (or skips the step and backs off the loss scale).
  void optimizer_step(PhaseTracker& phases) {
    {
      auto timed = phases.time(Phase::kOptimizer);
      // Every rank takes the same decision on an overflowed fp16 step: by construction where the
      // averaged gradients are identical on every rank, else by a one-flag allreduce.
      const bool local_finite = optimizer_.unscale_and_check();
      const bool finite =
          std::visit([&](auto& held) { return held.all_finite(ddp(), local_finite); }, sharding_);
      if (finite && options_.clip_grad_norm) clip_gradients();
      const double lr = schedule_(global_step_);
      std::visit([&](auto& held) { held.apply(finite, lr); }, sharding_);
    }
    ++global_step_;
  }

  // Scales the averaged, unscaled gradients to clip_grad_norm when their global norm exceeds it.
  // Under ZeRO-1 each rank holds its shard of them: the norm sums the shards'.
  void clip_gradients() {
    const double sum_of_squares =
        std::visit([&](auto& held) { return held.gradient_sum_of_squares(ddp()); }, sharding_);
    const double coefficient =
        optim::clip_coefficient(std::sqrt(sum_of_squares), *options_.clip_grad_norm);
    if (coefficient < 1.0) optimizer_.scale_gradients(coefficient);
  }

  // Whether this rank takes part in writing checkpoints: rank 0, and under ZeRO-1 every rank
  // (each gathers its shard into rank 0's file).
  bool writes_checkpoints() const {
    return std::visit([&](const auto& held) { return held.saves_on(ddp().rank()); }, sharding_);
  }

  void save(const TrainingState& state) {
    std::visit(
        [&](auto& held) {
          held.save(options_.checkpoint_dir, network_, state, checkpoint_options());
        },
        sharding_);
  }

  // Starts epoch `epoch` with every rank's share: the loader's sampler, or under elastic training
  // the sampler's order of the epoch shared among the ranks of now.
  template <class Transform>
  void begin_epoch(data::Loader<T, Transform>& train, std::int64_t epoch) {
    taken_ = 0;
    trained_ = false;
    resumed_ = false;
    if (elastic_)
      elastic_->begin_epoch(train, epoch);
    else
      train.start_epoch(static_cast<std::uint64_t>(epoch));
  }

  // After a hand-over into epoch `at.epoch`: the rest of it shared among the ranks of now.
  template <class Transform>
  void resume_epoch(data::Loader<T, Transform>& train, const ElasticPosition& at) {
    taken_ = 0;
    trained_ = at.trained;
    resumed_ = true;
    elastic_->resume_epoch(train, at);
  }

  // A collective failed in epoch `epoch` of an elastic run: the survivors regroup and take the
  // most advanced survivor's state (in deterministic mode its epoch counts of loss and samples
  // too, into `counts`). Below the group's min_ranks the leader writes a final checkpoint, and
  // every rank throws.
  template <class Transform>
  ElasticPosition recover(const CommError& error, std::int64_t epoch, EpochCounts& counts,
                          data::Loader<T, Transform>& validation) {
    const ElasticPosition mine =
        elastic_->position({epoch, taken_, trained_, global_step_, 0, loop_->train_seconds(),
                            counts.loss_sum, counts.samples});
    const ElasticPosition at =
        elastic_->recover(error, mine, validation, *options_.out, [&](const ElasticPosition& last) {
          if (options_.checkpoint_dir.empty()) return;
          save(loop_->state(last.epoch, global_step_));
          *options_.out << "elastic: final checkpoint (weights after step " << global_step_
                        << ", in epoch " << last.epoch + 1 << ") in "
                        << options_.checkpoint_dir.string() << "\n"
                        << std::flush;
        });
    global_step_ = at.global_step;
    if (ddp().deterministic()) {
      counts.loss_sum = at.loss_sum;
      counts.samples = at.samples;
    }
    return at;
  }

  // At an epoch start of an elastic run: lets waiting processes join. Collective.
  template <class Transform>
  void admit_joiners(std::int64_t epoch, data::Loader<T, Transform>& validation) {
    const ElasticPosition mine{epoch, 0, false, global_step_, 0, loop_->train_seconds()};
    if (const auto at = elastic_->admit_joiners(mine, validation, *options_.out))
      global_step_ = at->global_step;
  }

  CheckpointOptions checkpoint_options() const {
    CheckpointOptions options;
    options.model_name = options_.model_name;
    return options;
  }

  Net& network_;
  // The optimizer, or under ZeRO-1 this rank's shard of it; sharding_ steps and saves it.
  optim::PrecisionOptimizer<Policy, Optimizer>& optimizer_;
  std::variant<ReplicatedOptimizer<Net, Policy, Optimizer>,
               ShardedOptimizer<Net, Policy, Optimizer>>
      sharding_;
  DataParallel<Net>* ddp_ = nullptr;  // the caller's, unless elastic_ holds its own
  std::optional<ElasticTraining<Net, optim::PrecisionOptimizer<Policy, Optimizer>>> elastic_;
  Schedule schedule_;
  TrainerOptions options_;
  std::int64_t taken_ = 0;  // samples this rank took in the current epoch (elastic: of its plan)
  bool trained_ = false;    // the epoch's steps are done
  bool resumed_ = false;    // elastic: the current epoch's plan is the rest after a hand-over
  bool progress_ = false;
  std::optional<EpochLoop> loop_;  // the current fit()'s
  nn::SoftmaxCrossEntropy loss_;
  tensor::TensorView<const T> output_;
  tensor::Tensor<T> grad_;
  std::int64_t global_step_ = 0;
};

}  // namespace coltrain::train
