#pragma once
// The options and the result of both trainers' fit(): train::Trainer (train/trainer.hpp, the CPU)
// and train::DeviceTrainer (cuda/train/trainer.cuh, the GPU), and the checks they share.

#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/train/metrics.hpp>

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <ostream>
#include <string>

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

// Where resume and eval_only read checkpoints: resume_from, else checkpoint_dir.
inline const std::filesystem::path& checkpoint_source(const TrainerOptions& options) {
  return options.resume_from.empty() ? options.checkpoint_dir : options.resume_from;
}

// The checks both trainers make on their options; throws
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

}  // namespace detail

}  // namespace coltrain::train
