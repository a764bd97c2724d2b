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
// Elastic (the constructor that takes a comm::ElasticGroup, TCP): when ranks die, the survivors
// regroup, take the lowest survivor's state from memory and share the rest of the epoch, and the
// run goes on; processes that ask to join come in at an epoch start (docs/fault-tolerance.md).

#include <coltrain/comm/elastic/elastic_group.hpp>
#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/core/terminal.hpp>
#include <coltrain/core/timeline.hpp>
#include <coltrain/data/epoch_plan.hpp>
#include <coltrain/data/loader.hpp>
#include <coltrain/nn/loss.hpp>
#include <coltrain/optim/gradient_clipping.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/data_parallel.hpp>
#include <coltrain/train/early_stopping.hpp>
#include <coltrain/train/elastic.hpp>
#include <coltrain/train/metrics.hpp>
#include <coltrain/train/phase_tracker.hpp>
#include <coltrain/train/run_log.hpp>
#include <coltrain/train/zero_optimizer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::train {

struct TrainerOptions {
  std::int64_t epochs = 10;
  // Stop after the first epoch whose validation top-1 accuracy reaches this (MLBench's goal).
  std::optional<double> target_accuracy{};
  // Run records (config.json, metrics.jsonl, result.json), written by rank 0; empty: none.
  std::filesystem::path log_dir{};
  // Checkpoints every `checkpoint_every` epochs and at the end, written by rank 0; empty: none.
  std::filesystem::path checkpoint_dir{};
  std::int64_t checkpoint_every = 1;
  std::string model_name{};  // recorded in checkpoints and checked on resume
  // Continue from the newest complete checkpoint in resume_from, or in checkpoint_dir when that is
  // empty (a fresh start if there is none).
  bool resume = false;
  std::filesystem::path resume_from{};
  // Instead of training, fit() evaluates the newest checkpoint in resume_from (or checkpoint_dir)
  // on the validation loader and returns its metrics; rank 0 prints them and, with a log_dir,
  // writes evaluation.json there. No checkpoint there is an error.
  bool eval_only = false;
  // The progress bar; unset: when rank 0's standard output is a terminal.
  std::optional<bool> progress{};
  // Print the profile table and the confusion matrix at the end (rank 0).
  bool report = true;
  // GPU trainer (DeviceTrainer): replay each full-size training step as one CUDA graph. Needs a
  // step that never blocks the host: NCCL, or one rank.
  bool cuda_graph = false;
  // Gradient accumulation: the gradients of this many consecutive batches are summed (all but the
  // last backward pass without communication, as DDP's no_sync()) before one optimizer step, each
  // batch's loss divided by the batches in its group, so a step sees their mean. The last group
  // of an epoch may be shorter. The learning-rate schedule counts optimizer steps.
  std::int64_t grad_accum = 1;
  // Clip the averaged, unscaled gradients to this global L2 norm before each optimizer step
  // (optim/gradient_clipping.hpp, as torch.nn.utils.clip_grad_norm_).
  std::optional<double> clip_grad_norm{};
  // Stop when the validation loss has not improved for this many epochs (train/early_stopping.hpp);
  // its state travels in checkpoints.
  std::optional<std::int64_t> early_stopping_patience{};
  Json config = Json::object();  // recorded in config.json
  std::ostream* out = &std::cout;
};

struct FitResult {
  std::int64_t epochs = 0;  // completed, including those before a resume
  std::int64_t global_step = 0;
  double train_seconds = 0;  // training steps only, this process (no evaluation, no checkpoints)
  double total_seconds = 0;  // wall time of fit()
  double images_per_second = 0;            // training images of all ranks per training second
  std::optional<double> time_to_target{};  // training seconds until the target was reached
  std::optional<std::int64_t> target_epoch{};
  bool stopped_early = false;           // by TrainerOptions::early_stopping_patience
  ClassificationMetrics validation{1};  // the last evaluation
};

namespace detail {

// "epoch: 01/10  training loss: 0.0040  training accuracy 0.9228  validation loss: ..." (the
// seeds' form; the missing colon after "training accuracy" is theirs).
inline std::string epoch_line(std::int64_t epoch, std::int64_t epochs, double train_loss,
                              double train_accuracy, const ClassificationMetrics& validation) {
  std::ostringstream line;
  const int width = std::max<int>(2, static_cast<int>(std::to_string(epochs).size()));
  line << "epoch: " << std::setw(width) << std::setfill('0') << epoch << '/' << std::setw(width)
       << epochs << std::setfill(' ') << std::fixed << std::setprecision(4)
       << "  training loss: " << train_loss << "  training accuracy " << train_accuracy
       << "  validation loss: " << validation.mean_loss()
       << "  validation accuracy: " << validation.top1();
  return line.str();
}

inline std::string progress_bar(std::int64_t epoch, std::int64_t epochs, std::int64_t done,
                                std::int64_t total, double loss, double images_per_second) {
  constexpr int kWidth = 30;
  const auto filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::ostringstream bar;
  bar << "\repoch " << epoch << '/' << epochs << " ["
      << std::string(static_cast<std::size_t>(filled), '=')
      << std::string(static_cast<std::size_t>(kWidth - filled), ' ') << "] " << done << '/' << total
      << std::fixed << std::setprecision(4) << "  loss " << loss << std::setprecision(0) << "  "
      << images_per_second << " img/s ";
  return bar.str();
}

// Where resume and eval_only read checkpoints: resume_from, else checkpoint_dir.
inline const std::filesystem::path& checkpoint_source(const TrainerOptions& options) {
  return options.resume_from.empty() ? options.checkpoint_dir : options.resume_from;
}

// The checks both trainers (this one and cuda/train/trainer.cuh's) make on their options; throws
// InvalidArgument naming the option.
inline void check_trainer_options(const TrainerOptions& options, const std::string& trainer) {
  if (options.epochs < 1 || options.checkpoint_every < 1)
    throw InvalidArgument(trainer + ": epochs and checkpoint_every must be >= 1 (got " +
                          std::to_string(options.epochs) + " and " +
                          std::to_string(options.checkpoint_every) + ")");
  if ((options.resume || options.eval_only) && checkpoint_source(options).empty())
    throw InvalidArgument(trainer + ": " + (options.eval_only ? "eval_only" : "resume") +
                          " needs a checkpoint directory (resume_from or checkpoint_dir)");
  if (options.grad_accum < 1)
    throw InvalidArgument(trainer + ": grad_accum must be >= 1 (got " +
                          std::to_string(options.grad_accum) + ")");
  if (options.clip_grad_norm && !(*options.clip_grad_norm > 0))
    throw InvalidArgument(trainer + ": clip_grad_norm must be > 0 (got " +
                          std::to_string(*options.clip_grad_norm) + ")");
  if (options.early_stopping_patience && *options.early_stopping_patience < 1)
    throw InvalidArgument(trainer + ": early_stopping_patience must be >= 1 (got " +
                          std::to_string(*options.early_stopping_patience) + ")");
}

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

// Rank 0 opens the run log (and writes the configuration); every rank learns whether that worked,
// through `ddp` (a DataParallel or DeviceDataParallel) before training's first collective, so a
// refused log directory stops all ranks at once instead of leaving the others in an allreduce
// until COLTRAIN_TIMEOUT.
template <class Ddp>
std::optional<RunLog> open_run_log(const TrainerOptions& options, std::int64_t first_epoch,
                                   bool rank0, Ddp& ddp) {
  std::optional<RunLog> log;
  std::exception_ptr failure;
  if (rank0 && !options.log_dir.empty()) {
    try {
      RunLogOptions log_options;
      if (first_epoch > 0) log_options.resume_after_epoch = first_epoch;
      log.emplace(options.log_dir, log_options);
      log->write_config(options.config);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  double ok = failure == nullptr ? 1.0 : 0.0;
  ddp.allreduce(std::span<double>(&ok, 1), comm::ReduceOp::kMin);
  if (ok == 1.0) return log;
  if (failure) std::rethrow_exception(failure);
  ErrorContext context;
  context.operation = "Trainer::fit";
  context.rank = 0;
  throw Error("rank 0 could not open the run log in " + options.log_dir.string() +
                  "; its own error says why",
              context);
}

// Rank 0's end of fit(): the time to target, throughput, profile, confusion matrix and result.json.
inline void report_fit(const TrainerOptions& options, const FitResult& result,
                       const PhaseTracker& phases, std::optional<RunLog>& log, int world_size,
                       double train_loss, double train_accuracy) {
  std::ostream& out = *options.out;
  if (options.target_accuracy) {
    if (result.time_to_target)
      out << "time to " << *options.target_accuracy << " validation accuracy: " << std::fixed
          << std::setprecision(2) << *result.time_to_target << " s of training (epoch "
          << *result.target_epoch << ")\n";
    else
      out << "target " << *options.target_accuracy << " not reached in " << result.epochs
          << " epochs\n";
  }
  out << std::fixed << std::setprecision(0) << "training: " << result.images_per_second
      << " images/s over " << world_size << (world_size == 1 ? " rank" : " ranks") << ", "
      << std::setprecision(2) << result.train_seconds << " s\n";
  if (options.report) {
    out << '\n' << phases.report() << '\n';
    out << "confusion matrix (rows: true class, columns: predicted)\n"
        << result.validation.format_confusion_matrix() << '\n';
  }
  if (log) {
    RunResult record;
    record.epochs = result.epochs;
    record.global_step = result.global_step;
    record.total_seconds = result.total_seconds;
    record.world_size = world_size;
    record.backend = options.config.value("backend", "unknown").as_string();
    record.train_loss = train_loss;
    record.train_accuracy = train_accuracy;
    record.validation = result.validation.to_json(true);
    record.target_accuracy = options.target_accuracy;
    record.extra["train_seconds"] = result.train_seconds;
    record.extra["images_per_second"] = result.images_per_second;
    if (options.early_stopping_patience) record.extra["stopped_early"] = result.stopped_early;
    log->write_result(record);
    out << "run record: " << options.log_dir.string() << '\n';
  }
  out << std::flush;
}

}  // namespace detail

template <class Net, class Policy, class Optimizer>
class Trainer {
  using T = typename Net::value_type;

 public:
  using Schedule = std::function<double(std::int64_t step)>;

  // The network, optimizer and data-parallel wrapper must outlive the trainer; the optimizer was
  // built from the network's parameters, the schedule maps the global step to a learning rate.
  Trainer(Net& network, optim::PrecisionOptimizer<Policy, Optimizer>& optimizer,
          DataParallel<Net>& ddp, Schedule schedule, TrainerOptions options = {})
      : network_(network),
        optimizer_(optimizer),
        ddp_(&ddp),
        schedule_(std::move(schedule)),
        options_(std::move(options)) {
    check_options();
  }

  // ZeRO-1 (train/zero_optimizer.hpp): the optimizer state sharded across the ranks of `ddp`,
  // which must be built with zero_stage = 1. Checkpoints gather the full state (every rank takes
  // part, rank 0 writes) in the unsharded format, so they resume at any world size.
  Trainer(Net& network, ZeroOptimizer<Net, Policy, Optimizer>& optimizer, DataParallel<Net>& ddp,
          Schedule schedule, TrainerOptions options = {})
      : network_(network),
        optimizer_(optimizer.local()),
        zero_(&optimizer),
        ddp_(&ddp),
        schedule_(std::move(schedule)),
        options_(std::move(options)) {
    check_options();
  }

  // Elastic training over `group` (comm/elastic/elastic_group.hpp): the trainer keeps its own
  // DataParallel (built here, collectively, with `ddp_options`) on the group's communicator. When
  // ranks die, fit() regroups the survivors, hands rank 0's state to all (train/elastic.hpp),
  // shares the rest of the epoch among them and goes on; below the group's min_ranks it writes a
  // final checkpoint (with a checkpoint directory) and throws. At every epoch start it admits
  // processes waiting to join. A joining process (ElasticOptions::join) takes the state first.
  Trainer(Net& network, optim::PrecisionOptimizer<Policy, Optimizer>& optimizer,
          comm::ElasticGroup& group, Schedule schedule, TrainerOptions options = {},
          DataParallelOptions ddp_options = {})
      : network_(network),
        optimizer_(optimizer),
        group_(&group),
        ddp_options_(ddp_options),
        schedule_(std::move(schedule)),
        options_(std::move(options)),
        joining_(group.options().join) {
    elastic_ddp_.emplace(network_, group.communicator(), ddp_options_);
    ddp_ = &*elastic_ddp_;
    check_options();
    // Rank 0's optimizer state too (fp32 masters built before its weights were broadcast); a
    // joiner takes the running job's position here, as the others hand it over.
    joined_at_ = share_training_state(group.communicator(), optimizer_, ElasticPosition{});
    global_step_ = joined_at_.global_step;
    network_.context().set_step(joined_at_.context_step);
  }

  template <class Transform>
  FitResult fit(data::Loader<T, Transform>& train, data::Loader<T, Transform>& validation) {
    const auto started = std::chrono::steady_clock::now();
    PhaseTracker phases;
    FitResult result;
    std::int64_t first_epoch = 0;
    double train_seconds_before = 0;  // across a resume
    if (group_) {
      check_elastic_loaders(train, validation);
      share_validation(validation);
    }
    if (options_.eval_only) return evaluate_checkpoint(validation, started);
    if (options_.early_stopping_patience)
      early_stopping_.emplace(*options_.early_stopping_patience);
    const bool joined = joining_;
    if (joining_) {
      joining_ = false;
      first_epoch = joined_at_.epoch;
      train_seconds_before = joined_at_.train_seconds;
    } else if (options_.resume) {
      const std::filesystem::path& source = detail::checkpoint_source(options_);
      if (find_latest_checkpoint(source)) {
        const TrainingState state = load_latest_checkpoint();
        first_epoch = state.epoch;
        global_step_ = state.global_step;
        train_seconds_before = state.extra.value("train_seconds", 0.0).get<double>();
        if (early_stopping_)
          early_stopping_->from_json(state.extra.value("early_stopping", Json()));
        if (rank0())
          *options_.out << "resuming after epoch " << first_epoch << " (step " << global_step_
                        << ") from " << source.string() << '\n';
      } else if (rank0()) {
        *options_.out << "no checkpoint in " << source.string() << "; starting from scratch\n";
      }
    }
    std::optional<RunLog> log;
    if (!joined) log = detail::open_run_log(options_, first_epoch, rank0(), *ddp_);

    double train_seconds = train_seconds_before;
    double last_train_loss = 0, last_train_accuracy = 0;
    std::int64_t images = 0;
    std::int64_t epoch = first_epoch;
    bool epoch_begins = true;  // false after a hand-over into the middle of an epoch
    double loss_sum = 0, correct = 0, seen = 0, step_seconds = 0;
    auto epoch_started = std::chrono::steady_clock::now();
    double totals[4] = {};
    ClassificationMetrics metrics(static_cast<int>(Net::Output::kDims[0]));
    while (epoch < options_.epochs) {
      try {
        if (epoch_begins) {
          phases.start_epoch();
          epoch_started = std::chrono::steady_clock::now();
          loss_sum = correct = seen = step_seconds = 0;
          if (group_ && epoch > first_epoch) admit_joiners(epoch, train_seconds, validation);
          begin_epoch(train, epoch);
          epoch_begins = false;
        }
        network_.train();
        if (!trained_) {
          // The ranks start the epoch's steps together, so that waiting for another rank's work
          // between epochs (rank 0's log line and checkpoint, an uneven evaluation) is not counted
          // as training time, which a rank alone would not count either.
          if (ddp_->world_size() > 1) ddp_->barrier();
          const std::int64_t batches = train.batches_this_epoch();
          for (std::int64_t b = 0;; ++b) {
            const auto step_started = std::chrono::steady_clock::now();
            const data::Batch<T>* batch = nullptr;
            {
              auto timed = phases.time(Phase::kData);
              batch = train.next();
            }
            if (!batch) break;
            const double loss = step(*batch, phases, b, batches);
            taken_ += batch->size();
            loss_sum += loss * static_cast<double>(batch->size());
            correct += static_cast<double>(nn::topk_correct<T>(output_, batch->labels, 1));
            seen += static_cast<double>(batch->size());
            step_seconds +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - step_started)
                    .count();
            if (progress_ && (b % 10 == 0 || b + 1 == batches))
              *options_.out << detail::progress_bar(epoch + 1, options_.epochs, b + 1, batches,
                                                    loss_sum / seen, seen / step_seconds)
                            << std::flush;
          }
          if (progress_) *options_.out << '\r' << std::string(80, ' ') << '\r';
          trained_ = true;
        }
        // The ranks' training counts, and their slowest training time (they wait for each other).
        totals[0] = loss_sum;
        totals[1] = correct;
        totals[2] = seen;
        ddp_->allreduce(std::span<double>(totals, 3), comm::ReduceOp::kSum);
        totals[3] = step_seconds;
        ddp_->allreduce(std::span<double>(totals + 3, 1), comm::ReduceOp::kMax);
        auto timed = phases.time(Phase::kOther);
        metrics = evaluate(validation);
      } catch (const CommError& e) {
        if (!group_ || dynamic_cast<const MismatchError*>(&e) != nullptr) throw;
        ElasticPosition mine{epoch, taken_, trained_, global_step_, step_context_, train_seconds};
        if (!in_step_) mine.context_step = network_.context().step();
        const ElasticPosition at = recover(e, mine, validation);
        // Nothing of the epoch taken: it starts again with the ranks of now.
        epoch_begins = at.taken == 0 && !at.trained;
        if (!epoch_begins) resume_epoch(train, at);
        epoch = at.epoch;
        continue;
      }
      train_seconds += totals[3];
      images += static_cast<std::int64_t>(totals[2]);
      last_train_loss = totals[2] > 0 ? totals[0] / totals[2] : 0.0;
      last_train_accuracy = totals[2] > 0 ? totals[1] / totals[2] : 0.0;

      ++epoch;
      epoch_begins = true;
      const bool reached = options_.target_accuracy && metrics.top1() >= *options_.target_accuracy;
      if (reached && !result.time_to_target) {
        result.time_to_target = train_seconds;
        result.target_epoch = epoch;
      }
      if (rank0()) {
        *options_.out << detail::epoch_line(epoch, options_.epochs, last_train_loss,
                                            last_train_accuracy, metrics)
                      << '\n'
                      << std::flush;
        if (log) {
          EpochRecord record;
          record.epoch = epoch;
          record.global_step = global_step_;
          record.train_loss = last_train_loss;
          record.train_accuracy = last_train_accuracy;
          record.set_validation(metrics);
          record.lr = schedule_(std::max<std::int64_t>(0, global_step_ - 1));
          record.images_per_second = totals[3] > 0 ? totals[2] / totals[3] : 0.0;
          record.epoch_seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_started)
                  .count();
          record.elapsed_seconds = train_seconds;
          record.phase_seconds = phases.epoch_json();
          if constexpr (Policy::kLossScaling) record.loss_scale = optimizer_.loss_scale();
          log->append_epoch(record);
        }
      }
      // Every rank evaluated the same (summed) metrics, so every rank decides alike.
      result.stopped_early = early_stopping_ && early_stopping_->update(metrics.mean_loss(), epoch);
      const bool last = epoch == options_.epochs || reached || result.stopped_early;
      if (!options_.checkpoint_dir.empty() && (last || epoch % options_.checkpoint_every == 0)) {
        auto timed = phases.time(Phase::kOther);
        // The buffers are the ranks' average: evaluate() averaged them in this epoch.
        if (rank0() || zero_) save(epoch, train_seconds);  // ZeRO: every rank gathers
      }
      result.validation = std::move(metrics);
      metrics = ClassificationMetrics(static_cast<int>(Net::Output::kDims[0]));
      if (result.stopped_early && rank0() && !reached)
        *options_.out << "early stopping after epoch " << epoch << ": " << early_stopping_->reason()
                      << '\n';
      if (reached || result.stopped_early) break;
    }

    result.epochs = epoch;
    result.global_step = global_step_;
    result.train_seconds = train_seconds;
    result.total_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const double this_run = train_seconds - train_seconds_before;
    result.images_per_second = this_run > 0 ? static_cast<double>(images) / this_run : 0.0;
    if (rank0())
      detail::report_fit(options_, result, phases, log, ddp_->world_size(), last_train_loss,
                         last_train_accuracy);
    Timeline::instance().write();  // every rank's spans so far, when the timeline is on
    return result;
  }

  // Validation over each rank's shard, summed across ranks: the whole set's metrics on every rank.
  // Averages the running statistics across ranks first (DataParallel::average_buffers), so every
  // rank evaluates the same network. Collective.
  template <class Transform>
  ClassificationMetrics evaluate(data::Loader<T, Transform>& loader) {
    ddp_->average_buffers();
    network_.eval();
    ClassificationMetrics metrics(static_cast<int>(Net::Output::kDims[0]));
    loader.start_epoch(0);
    while (const data::Batch<T>* batch = loader.next()) {
      const auto logits = network_.forward(batch->images.view());
      metrics.add_batch(logits, batch->labels, loss_.loss(logits, batch->labels));
    }
    metrics.allreduce(*ddp_);
    network_.train();
    return metrics;
  }

  std::int64_t global_step() const { return global_step_; }

 private:
  void check_options() {
    detail::check_trainer_options(options_, "Trainer");
    // A regroup inside an accumulation would lose the partial sums, and a joiner would not know
    // the early-stopping count.
    if (group_ && (options_.grad_accum > 1 || options_.early_stopping_patience))
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
    return zero_ ? load_checkpoint(source, network_, *zero_, load_options)
                 : load_checkpoint(source, network_, optimizer_, load_options);
  }

  // TrainerOptions::eval_only: the newest checkpoint, evaluated.
  template <class Transform>
  FitResult evaluate_checkpoint(data::Loader<T, Transform>& validation,
                                std::chrono::steady_clock::time_point started) {
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
    if (rank0()) detail::report_evaluation(options_, state, result.validation, ddp_->world_size());
    return result;
  }

  bool rank0() const { return ddp_->rank() == 0; }

  // Batch `b` of the `batches` in this epoch: a whole step, or under gradient accumulation one
  // micro-batch of a group, whose last one synchronises and steps.
  double step(const data::Batch<T>& batch, PhaseTracker& phases, std::int64_t b,
              std::int64_t batches) {
    const std::int64_t k = options_.grad_accum;
    const std::int64_t micro = b % k;
    const std::int64_t in_group = k == 1 ? 1 : std::min(k, batches - (b - micro));
    const bool synchronised = micro + 1 >= in_group;
    if (group_) keep_step_start();
    if (micro == 0) network_.zero_grad();
    {
      auto timed = phases.time(Phase::kForward);
      output_ = network_.forward(batch.images.view());
    }
    double loss = 0;
    {
      auto timed = phases.time(Phase::kLoss);
      grad_.resize(output_.shape());
      loss = loss_.loss_and_grad(output_, batch.labels, grad_.view(),
                                 optimizer_.loss_scale() / static_cast<float>(in_group));
    }
    {
      auto timed = phases.time(Phase::kBackward);
      if (!synchronised) {
        auto local_only = ddp_->no_sync();
        network_.backward(grad_.view());
        in_step_ = false;
        return loss;
      }
      network_.backward(grad_.view());
    }
    phases.add_seconds(Phase::kAllreduceWait, ddp_->finish_gradient_sync());
    {
      auto timed = phases.time(Phase::kOptimizer);
      // Every rank takes the same decision on an overflowed fp16 step: by construction where the
      // averaged gradients are identical on every rank, else by a one-flag allreduce.
      const bool local_finite = optimizer_.unscale_and_check();
      const bool finite =
          ddp_->gradients_identical_on_every_rank() ? local_finite : ddp_->all_finite(local_finite);
      if (finite && options_.clip_grad_norm) clip_gradients();
      if (zero_)
        zero_->apply(finite, schedule_(global_step_));  // then every rank's shard to all
      else
        optimizer_.apply(finite, schedule_(global_step_));
    }
    ++global_step_;
    in_step_ = false;
    return loss;
  }

  // Scales the averaged, unscaled gradients to clip_grad_norm when their global norm exceeds it.
  // Under ZeRO-1 each rank holds its shard of them: the norm sums the shards'.
  void clip_gradients() {
    double sum_of_squares = optimizer_.gradient_sum_of_squares();
    if (zero_) ddp_->allreduce(std::span<double>(&sum_of_squares, 1), comm::ReduceOp::kSum);
    const double coefficient =
        optim::clip_coefficient(std::sqrt(sum_of_squares), *options_.clip_grad_norm);
    if (coefficient < 1.0) optimizer_.scale_gradients(coefficient);
  }

  void save(std::int64_t epoch, double train_seconds) {
    TrainingState state;
    state.epoch = epoch;
    state.global_step = global_step_;
    state.extra["train_seconds"] = train_seconds;
    if (early_stopping_) state.extra["early_stopping"] = early_stopping_->to_json();
    if (zero_)
      save_checkpoint(options_.checkpoint_dir, network_, *zero_, state, checkpoint_options());
    else
      save_checkpoint(options_.checkpoint_dir, network_, optimizer_, state, checkpoint_options());
  }

  // Starts epoch `epoch` with every rank's share: the loader's sampler, or under elastic training
  // the sampler's order of the epoch shared among the ranks of now.
  template <class Transform>
  void begin_epoch(data::Loader<T, Transform>& train, std::int64_t epoch) {
    taken_ = 0;
    trained_ = false;
    if (!group_) return train.start_epoch(static_cast<std::uint64_t>(epoch));
    data::DistributedSampler sampler = *train.sampler();
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    plan_ = sampler.plan();
    plan_.replicas = ddp_->world_size();
    train.start_epoch(static_cast<std::uint64_t>(epoch), plan_.share(ddp_->rank()));
  }

  // After a hand-over into epoch `at.epoch`: the rest of it shared among the ranks of now.
  template <class Transform>
  void resume_epoch(data::Loader<T, Transform>& train, const ElasticPosition& at) {
    plan_ = plan_.remainder(at.trained ? plan_.per_rank() : at.taken, ddp_->world_size());
    taken_ = 0;
    trained_ = at.trained;
    train.start_epoch(static_cast<std::uint64_t>(at.epoch),
                      at.trained ? std::vector<std::int64_t>{} : plan_.share(ddp_->rank()));
  }

  template <class Transform>
  void check_elastic_loaders(const data::Loader<T, Transform>& train,
                             const data::Loader<T, Transform>& validation) const {
    if (!train.sampler() || validation.sampler()) {
      throw InvalidArgument(
          "Trainer (elastic): the training loader needs a DistributedSampler (its order is "
          "shared anew when the ranks change) and the validation loader a fixed order (rank r "
          "of R evaluates samples r, r + R, ...)");
    }
  }

  // The buffers and the random-mask counter as a step found them: a step that fails leaves its
  // forward pass's running statistics behind, which the run must not keep.
  void keep_step_start() {
    in_step_ = true;
    step_context_ = network_.context().step();
    step_buffers_.clear();
    network_.visit_buffers([&](const std::string&, auto& buffer) {
      const auto bytes = std::as_bytes(buffer.span());
      step_buffers_.insert(step_buffers_.end(), bytes.begin(), bytes.end());
    });
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

  // A collective failed: regroups the survivors and takes rank 0's state. Below the group's
  // min_ranks the leader writes a final checkpoint, and every rank throws.
  template <class Transform>
  ElasticPosition recover(const CommError& error, ElasticPosition mine,
                          data::Loader<T, Transform>& validation) {
    const int old_rank = ddp_->rank();
    std::vector<int> failed;
    if (error.context().peer && *error.context().peer != old_rank)
      failed.push_back(*error.context().peer);
    ddp_ = nullptr;
    elastic_ddp_.reset();  // waits for its issued buckets; the old communicator goes next
    optimizer_.abandon_step();
    if (in_step_) restore_step_start();
    network_.train();
    comm::MembershipChange change;
    try {
      change = group_->regroup(failed);
    } catch (const CommError&) {
      if (group_->leading() && !options_.checkpoint_dir.empty()) {
        save(mine.epoch, mine.train_seconds);
        *options_.out << "elastic: final checkpoint (weights after step " << global_step_
                      << ", in epoch " << mine.epoch + 1 << ") in "
                      << options_.checkpoint_dir.string() << "\n"
                      << std::flush;
      }
      throw;
    }
    return adopt_state(change, validation, mine, error.message());
  }

  // At an epoch start: lets waiting processes join (every rank regroups with them).
  template <class Transform>
  void admit_joiners(std::int64_t epoch, double train_seconds,
                     data::Loader<T, Transform>& validation) {
    double waiting = static_cast<double>(group_->joiners_waiting());
    ddp_->allreduce(std::span(&waiting, 1), comm::ReduceOp::kMax);
    if (waiting == 0) return;
    ddp_ = nullptr;
    elastic_ddp_.reset();
    const comm::MembershipChange change = group_->admit_joiners();
    adopt_state(change, validation,
                {epoch, 0, false, global_step_, network_.context().step(), train_seconds});
  }

  // Rank r of R evaluates validation samples r, r + R, ...
  template <class Transform>
  void share_validation(data::Loader<T, Transform>& validation) const {
    std::vector<std::int64_t> shard;
    for (std::int64_t i = ddp_->rank(); i < validation.dataset().size(); i += ddp_->world_size())
      shard.push_back(i);
    validation.set_order(std::move(shard));
  }

  // Rank 0's parameters, buffers (DataParallel's start), position and optimizer state to every
  // rank of the new generation (a joiner's constructor takes them likewise); the validation set
  // shared among its ranks.
  template <class Transform>
  ElasticPosition adopt_state(const comm::MembershipChange& change,
                              data::Loader<T, Transform>& validation, const ElasticPosition& mine,
                              const std::string& cause = {}) {
    elastic_ddp_.emplace(network_, group_->communicator(), ddp_options_);
    ddp_ = &*elastic_ddp_;
    const ElasticPosition at = share_training_state(group_->communicator(), optimizer_, mine);
    global_step_ = at.global_step;
    network_.context().set_step(at.context_step);
    share_validation(validation);
    if (rank0()) {
      if (!cause.empty()) *options_.out << "elastic: " << cause << '\n';
      *options_.out << "elastic: generation " << change.generation << ", " << change.previous_size
                    << " -> " << change.size << " ranks";
      if (!change.departed.empty()) {
        *options_.out << " (lost";
        for (const int r : change.departed) *options_.out << " rank " << r;
        *options_.out << ")";
      }
      if (change.joined > 0) *options_.out << " (" << change.joined << " joined)";
      *options_.out << std::fixed << std::setprecision(2) << " in " << change.seconds
                    << " s; continuing in epoch " << at.epoch + 1 << " after "
                    << (at.trained ? std::string("its steps")
                                   : std::to_string(at.taken) + " samples per rank")
                    << ", step " << at.global_step << '\n'
                    << std::flush;
    }
    return at;
  }

  CheckpointOptions checkpoint_options() const {
    CheckpointOptions options;
    options.model_name = options_.model_name;
    return options;
  }

  Net& network_;
  // The optimizer, or under ZeRO-1 this rank's shard of it (zero_ steps it and gathers).
  optim::PrecisionOptimizer<Policy, Optimizer>& optimizer_;
  ZeroOptimizer<Net, Policy, Optimizer>* zero_ = nullptr;
  DataParallel<Net>* ddp_ = nullptr;
  comm::ElasticGroup* group_ = nullptr;  // elastic training only, as below
  DataParallelOptions ddp_options_;
  std::optional<DataParallel<Net>> elastic_ddp_;
  Schedule schedule_;
  TrainerOptions options_;
  bool joining_ = false;
  ElasticPosition joined_at_;  // a joiner's start, as rank 0 handed it over
  data::EpochPlan plan_;       // the current epoch's samples and ranks
  std::int64_t taken_ = 0;     // samples this rank took of plan_
  bool trained_ = false;       // the epoch's steps are done
  bool in_step_ = false;
  std::uint64_t step_context_ = 0;
  std::vector<std::byte> step_buffers_;
  bool progress_ = false;
  std::optional<EarlyStopping> early_stopping_;
  nn::SoftmaxCrossEntropy loss_;
  tensor::TensorView<const T> output_;
  tensor::Tensor<T> grad_;
  std::int64_t global_step_ = 0;
};

}  // namespace coltrain::train
