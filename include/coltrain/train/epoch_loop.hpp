#pragma once
// EpochLoop: the bookkeeping around both trainers' steps, so that the CPU trainer
// (train/trainer.hpp) and the GPU trainer (cuda/train/trainer.cuh) resume, count, print, record,
// stop and report alike. Each trainer keeps what differs: how a step runs, how the epoch's counts
// are taken (on the host per batch, or on the device and read once), evaluation, and how a
// checkpoint is written. Its fit() reads:
//
//   EpochLoop loop(options, classes);
//   if (const auto state = loop.resume(rank0, load_checkpoint)) global_step = state->global_step;
//   loop.open_log(ddp);
//   std::int64_t epoch = loop.first_epoch();
//   while (epoch < options.epochs) {
//     loop.start_epoch();
//     ... the epoch's steps, counted into EpochCounts ...
//     loop.count_training(ddp, counts);  // collective
//     const EpochEnd end = loop.end_epoch(++epoch, evaluate(validation), global_step, lr, ...);
//     if (end.checkpoint) save_checkpoint(loop.state(epoch, global_step));
//     if (end.stop) break;
//   }
//   return loop.finish(epoch, global_step, ddp.world_size(), rank0);

#include <coltrain/comm/types.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/core/timeline.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/early_stopping.hpp>
#include <coltrain/train/metrics.hpp>
#include <coltrain/train/phase_tracker.hpp>
#include <coltrain/train/run_log.hpp>
#include <coltrain/train/trainer_options.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>

namespace coltrain::train {

// This rank's counts of one epoch's training steps.
struct EpochCounts {
  double loss_sum = 0;  // the per-sample losses, summed
  double correct = 0;   // top-1 hits
  double samples = 0;
  double step_seconds = 0;  // training time: the steps (their data included), not what is between
};

// What the end of an epoch asks of the trainer.
struct EpochEnd {
  bool checkpoint = false;  // save one now (every checkpoint_every epochs, and after the last)
  bool stop = false;        // the target accuracy was reached, or early stopping stopped the run
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

}  // namespace detail

class EpochLoop {
  using Clock = std::chrono::steady_clock;

 public:
  EpochLoop(const TrainerOptions& options, int classes)
      : options_(options), started_(Clock::now()), validation_(classes) {
    if (options_.early_stopping_patience)
      early_stopping_.emplace(*options_.early_stopping_patience);
  }

  // TrainerOptions::resume: `load` reads the newest complete checkpoint of the resume source into
  // the network and optimizer and returns its state, after which the epochs go on; without one the
  // run starts from scratch. Rank 0 says which. No resume asked for: nothing.
  template <class Load>
  std::optional<TrainingState> resume(bool rank0, Load&& load) {
    if (!options_.resume) return std::nullopt;
    const std::filesystem::path& source = detail::checkpoint_source(options_);
    if (!find_latest_checkpoint(source)) {
      if (rank0)
        *options_.out << "no checkpoint in " << source.string() << "; starting from scratch\n";
      return std::nullopt;
    }
    TrainingState state = load();
    first_epoch_ = state.epoch;
    train_seconds_before_ = train_seconds_ = state.extra.value("train_seconds", 0.0).get<double>();
    if (early_stopping_) early_stopping_->from_json(state.extra.value("early_stopping", Json()));
    if (rank0)
      *options_.out << "resuming after epoch " << first_epoch_ << " (step " << state.global_step
                    << ") from " << source.string() << '\n';
    return state;
  }

  // A process joining an elastic run starts in the job's epoch with the job's training time.
  void join_at(std::int64_t epoch, double train_seconds) {
    first_epoch_ = epoch;
    train_seconds_before_ = train_seconds_ = train_seconds;
  }

  // Rank 0 opens the run log (and writes the configuration); every rank learns whether that
  // worked, through `ddp` (a DataParallel or DeviceDataParallel) before training's first
  // collective, so a refused log directory stops all ranks at once instead of leaving the others
  // in an allreduce until COLTRAIN_TIMEOUT. Collective.
  template <class Ddp>
  void open_log(Ddp& ddp) {
    std::exception_ptr failure;
    if (ddp.rank() == 0 && !options_.log_dir.empty()) {
      try {
        RunLogOptions log_options;
        if (first_epoch_ > 0) log_options.resume_after_epoch = first_epoch_;
        log_.emplace(options_.log_dir, log_options);
        log_->write_config(options_.config);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    double ok = failure == nullptr ? 1.0 : 0.0;
    ddp.allreduce(std::span<double>(&ok, 1), comm::ReduceOp::kMin);
    if (ok == 1.0) return;
    if (failure) std::rethrow_exception(failure);
    ErrorContext context;
    context.operation = "Trainer::fit";
    context.rank = 0;
    throw Error("rank 0 could not open the run log in " + options_.log_dir.string() +
                    "; its own error says why",
                context);
  }

  std::int64_t first_epoch() const { return first_epoch_; }
  double train_seconds() const { return train_seconds_; }  // up to the last completed epoch
  PhaseTracker& phases() { return phases_; }

  void start_epoch() {
    phases_.start_epoch();
    epoch_started_ = Clock::now();
  }
  double seconds_since_epoch_start() const { return seconds(epoch_started_); }

  // The epoch's training counts summed over the ranks, and their slowest training time (they
  // wait for each other). Collective.
  template <class Ddp>
  void count_training(Ddp& ddp, const EpochCounts& counts) {
    totals_ = {counts.loss_sum, counts.correct, counts.samples, counts.step_seconds};
    ddp.allreduce(std::span<double>(totals_.data(), 3), comm::ReduceOp::kSum);
    ddp.allreduce(std::span<double>(totals_.data() + 3, 1), comm::ReduceOp::kMax);
  }

  // Epoch `epoch` (counted from 1) is over and evaluated: its training time counted, rank 0's line
  // and run record written, the target and early stopping checked (every rank holds the same
  // summed metrics, so every rank decides alike). `lr` is the learning rate of the epoch's last
  // step; `loss_scale` is recorded under fp16 loss scaling.
  EpochEnd end_epoch(std::int64_t epoch, ClassificationMetrics metrics, std::int64_t global_step,
                     double lr, std::optional<double> loss_scale, bool rank0) {
    const auto [loss_sum, correct, samples, step_seconds] = totals_;
    train_seconds_ += step_seconds;
    images_ += static_cast<std::int64_t>(samples);
    train_loss_ = samples > 0 ? loss_sum / samples : 0.0;
    train_accuracy_ = samples > 0 ? correct / samples : 0.0;
    const bool reached = options_.target_accuracy && metrics.top1() >= *options_.target_accuracy;
    if (reached && !time_to_target_) {
      time_to_target_ = train_seconds_;
      target_epoch_ = epoch;
    }
    if (rank0) {
      *options_.out << detail::epoch_line(epoch, options_.epochs, train_loss_, train_accuracy_,
                                          metrics)
                    << '\n'
                    << std::flush;
      if (log_) {
        EpochRecord record;
        record.epoch = epoch;
        record.global_step = global_step;
        record.train_loss = train_loss_;
        record.train_accuracy = train_accuracy_;
        record.set_validation(metrics);
        record.lr = lr;
        record.images_per_second = step_seconds > 0 ? samples / step_seconds : 0.0;
        record.epoch_seconds = seconds(epoch_started_);
        record.elapsed_seconds = train_seconds_;
        record.phase_seconds = phases_.epoch_json();
        record.loss_scale = loss_scale;
        log_->append_epoch(record);
      }
    }
    stopped_early_ = early_stopping_ && early_stopping_->update(metrics.mean_loss(), epoch);
    if (stopped_early_ && rank0 && !reached)
      *options_.out << "early stopping after epoch " << epoch << ": " << early_stopping_->reason()
                    << '\n';
    validation_ = std::move(metrics);
    EpochEnd end;
    end.stop = reached || stopped_early_;
    end.checkpoint = !options_.checkpoint_dir.empty() && (end.stop || epoch == options_.epochs ||
                                                          epoch % options_.checkpoint_every == 0);
    return end;
  }

  // What a checkpoint after epoch `epoch` records besides the weights and the optimizer.
  TrainingState state(std::int64_t epoch, std::int64_t global_step) const {
    TrainingState state;
    state.epoch = epoch;
    state.global_step = global_step;
    state.extra["train_seconds"] = train_seconds_;
    if (early_stopping_) state.extra["early_stopping"] = early_stopping_->to_json();
    return state;
  }

  // The run's result after `epochs` completed epochs; rank 0 reports it (time to target,
  // throughput, profile, confusion matrix, result.json) and every rank writes its timeline.
  FitResult finish(std::int64_t epochs, std::int64_t global_step, int world_size, bool rank0) {
    FitResult result;
    result.epochs = epochs;
    result.global_step = global_step;
    result.train_seconds = train_seconds_;
    result.total_seconds = seconds(started_);
    const double this_run = train_seconds_ - train_seconds_before_;
    result.images_per_second = this_run > 0 ? static_cast<double>(images_) / this_run : 0.0;
    result.time_to_target = time_to_target_;
    result.target_epoch = target_epoch_;
    result.stopped_early = stopped_early_;
    result.validation = std::move(validation_);
    if (rank0) report(result, world_size);
    Timeline::instance().write();  // every rank's spans so far, when the timeline is on
    return result;
  }

 private:
  static double seconds(Clock::time_point since) {
    return std::chrono::duration<double>(Clock::now() - since).count();
  }

  void report(const FitResult& result, int world_size) {
    std::ostream& out = *options_.out;
    if (options_.target_accuracy) {
      if (result.time_to_target)
        out << "time to " << *options_.target_accuracy << " validation accuracy: " << std::fixed
            << std::setprecision(2) << *result.time_to_target << " s of training (epoch "
            << *result.target_epoch << ")\n";
      else
        out << "target " << *options_.target_accuracy << " not reached in " << result.epochs
            << " epochs\n";
    }
    out << std::fixed << std::setprecision(0) << "training: " << result.images_per_second
        << " images/s over " << world_size << (world_size == 1 ? " rank" : " ranks") << ", "
        << std::setprecision(2) << result.train_seconds << " s\n";
    if (options_.report) {
      out << '\n' << phases_.report() << '\n';
      out << "confusion matrix (rows: true class, columns: predicted)\n"
          << result.validation.format_confusion_matrix() << '\n';
    }
    if (log_) {
      RunResult record;
      record.epochs = result.epochs;
      record.global_step = result.global_step;
      record.total_seconds = result.total_seconds;
      record.world_size = world_size;
      record.backend = options_.config.value("backend", "unknown").as_string();
      record.train_loss = train_loss_;
      record.train_accuracy = train_accuracy_;
      record.validation = result.validation.to_json(true);
      record.target_accuracy = options_.target_accuracy;
      record.extra["train_seconds"] = result.train_seconds;
      record.extra["images_per_second"] = result.images_per_second;
      if (options_.early_stopping_patience) record.extra["stopped_early"] = result.stopped_early;
      log_->write_result(record);
      out << "run record: " << options_.log_dir.string() << '\n';
    }
    out << std::flush;
  }

  const TrainerOptions& options_;
  Clock::time_point started_;
  Clock::time_point epoch_started_ = Clock::now();
  PhaseTracker phases_;
  std::optional<RunLog> log_;
  std::optional<EarlyStopping> early_stopping_;
  std::int64_t first_epoch_ = 0;
  double train_seconds_before_ = 0;  // training time of the run before a resume or a join
  double train_seconds_ = 0;
  std::int64_t images_ = 0;         // training images of all ranks in this fit()
  std::array<double, 4> totals_{};  // the last count_training(): EpochCounts' fields across ranks
  double train_loss_ = 0, train_accuracy_ = 0;  // the last epoch's, across ranks
  std::optional<double> time_to_target_{};
  std::optional<std::int64_t> target_epoch_{};
  bool stopped_early_ = false;
  ClassificationMetrics validation_;  // the last evaluation
};

}  // namespace coltrain::train
