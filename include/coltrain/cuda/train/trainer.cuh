#pragma once
// DeviceTrainer: train::Trainer for a network on the GPU. The same epoch lines, progress bar, run
// records, time-to-accuracy goal, checkpoints and exact resume (the epoch loop's bookkeeping is
// train/epoch_loop.hpp's, shared with the CPU trainer), with every step on the device:
//
//   train::DeviceDataParallel ddp(net, comm);
//   optim::DevicePrecisionOptimizer<optim::MixedFp16, optim::Sgd> opt(net, optim::Sgd({...}));
//   train::DeviceTrainer trainer(net, opt, ddp, schedule, {.epochs = 10, .cuda_graph = true});
//   train::FitResult result = trainer.fit(train_loader, validation_loader);   // host Loaders
//
// A step: the next batch (copied to the device during the previous step, data::DeviceLoader),
// forward, loss and its gradient (scaled by the device-resident loss scale), backward (gradient
// buckets reduced on a communication stream while it runs), the overflow flag max-reduced across
// ranks on the device, and the optimizer's update (skipped on every rank together on overflow).
// The host never waits for the device within an epoch: the loss and accuracy are counted on the
// device (DeviceClassificationCounters) and read once per epoch. With `cuda_graph`, the first
// full-size step runs eagerly (sizing every tensor and choosing cuDNN's algorithms), the step is
// then captured, and each later full-size batch is copied into the graph's input and the graph
// replayed; a smaller last batch runs eagerly. When device memory has been allocated or freed since
// the recording (an evaluation batch larger than the training batch grows the activations), the
// step is recorded again before its next replay.
//
// Before every evaluation (and so before every checkpoint, which follows it) BatchNorm's running
// statistics are averaged across ranks. Rank 0 writes checkpoints in the CPU's format
// (cuda/train/checkpoint.cuh), which the CPU trainer and PyTorch load as well.

#if !defined(__CUDACC__)
#error "coltrain/cuda/train/trainer.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/device_memory.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/terminal.hpp>
#include <coltrain/cuda/nn/loss.cuh>
#include <coltrain/cuda/optim/device_optimizer.cuh>
#include <coltrain/cuda/train/checkpoint.cuh>
#include <coltrain/cuda/train/data_parallel.cuh>
#include <coltrain/cuda/train/metrics.cuh>
#include <coltrain/data/device_loader.hpp>
#include <coltrain/data/loader.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/cuda_graph.hpp>
#include <coltrain/train/epoch_loop.hpp>
#include <coltrain/train/metrics.hpp>
#include <coltrain/train/phase_tracker.hpp>
#include <coltrain/train/trainer_options.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>

namespace coltrain::train {

template <class Net, class Policy, class Optimizer>
class DeviceTrainer {
  using T = typename Net::value_type;
  static constexpr int kClasses = static_cast<int>(Net::Output::kDims[0]);

 public:
  using Schedule = std::function<double(std::int64_t step)>;

  // The network, optimizer and data-parallel wrapper must outlive the trainer. Throws
  // InvalidArgument for invalid options, and for cuda_graph with a staged backend on several
  // ranks (its collectives block the host, which a graph cannot replay).
  DeviceTrainer(Net& network, optim::DevicePrecisionOptimizer<Policy, Optimizer>& optimizer,
                DeviceDataParallel<Net>& ddp, Schedule schedule, TrainerOptions options = {})
      : network_(network),
        optimizer_(optimizer),
        ddp_(ddp),
        schedule_(std::move(schedule)),
        options_(std::move(options)),
        train_counts_(kClasses),
        eval_counts_(kClasses) {
    detail::check_trainer_options(options_, "DeviceTrainer");
    if (options_.grad_accum > 1 || options_.clip_grad_norm || options_.eval_only)
      throw InvalidArgument(
          "DeviceTrainer: grad_accum > 1, clip_grad_norm and eval_only are the CPU trainer's "
          "(train/trainer.hpp) for now; the GPU trainer does not have them yet");
    if (options_.cuda_graph && !ddp_.capturable())
      throw InvalidArgument(
          "DeviceTrainer: cuda_graph needs collectives that do not block the host (the NCCL "
          "backend, or one rank); this communicator stages device buffers through the host");
    progress_ = rank0() && options_.progress.value_or(writes_to_terminal());
  }

  template <class Transform>
  FitResult fit(data::Loader<T, Transform>& train, data::Loader<T, Transform>& validation) {
    EpochLoop loop(options_, kClasses);
    const auto load = [&] {
      return load_checkpoint(detail::checkpoint_source(options_), network_, optimizer_,
                             checkpoint_options());
    };
    if (const auto state = loop.resume(rank0(), load)) global_step_ = state->global_step;
    context_step_at_start_ = network_.context().step();
    steps_this_fit_ = 0;
    loop.open_log(ddp_);

    data::DeviceLoader<T, Transform> train_batches(train, stream());
    data::DeviceLoader<T, Transform> validation_batches(validation, stream());
    std::int64_t epoch = loop.first_epoch();
    while (epoch < options_.epochs) {
      loop.start_epoch();
      train_epoch(train_batches, epoch, loop);
      const EpochCounts counts = [&] {  // the one wait of the epoch: its counts on the device
        auto timed = loop.phases().time(Phase::kAllreduceWait);
        return read_training_counts(loop);
      }();
      loop.count_training(ddp_, counts);
      ClassificationMetrics metrics = [&] {
        auto timed = loop.phases().time(Phase::kOther);
        return evaluate(validation_batches);
      }();
      std::optional<double> loss_scale;
      if constexpr (Policy::kLossScaling) loss_scale = optimizer_.loss_scale();
      const EpochEnd end = loop.end_epoch(++epoch, std::move(metrics), global_step_,
                                          schedule_(std::max<std::int64_t>(0, global_step_ - 1)),
                                          loss_scale, rank0());
      if (end.checkpoint && rank0()) {
        auto timed = loop.phases().time(Phase::kOther);
        sync_context_step();
        save_checkpoint(options_.checkpoint_dir, network_, optimizer_,
                        loop.state(epoch, global_step_), checkpoint_options());
      }
      if (end.stop) break;
    }
    sync_context_step();
    return loop.finish(epoch, global_step_, ddp_.world_size(), rank0());
  }

  // Validation over each rank's shard, summed across ranks: the whole set's metrics on every rank.
  // BatchNorm's running statistics are averaged across ranks first.
  template <class Transform>
  ClassificationMetrics evaluate(data::DeviceLoader<T, Transform>& loader) {
    ddp_.average_buffers();
    network_.eval();
    eval_counts_.reset(stream());
    loader.start_epoch(0);
    while (const data::DeviceBatch<T>* batch = loader.next()) {
      const auto logits = network_.forward(batch->images);
      loss_.forward<T>(logits, batch->labels, stream());
      eval_counts_.add_batch<T>(logits, batch->labels, loss_.mean_loss(), stream());
    }
    ClassificationMetrics metrics(kClasses);
    wait_for_device();
    eval_counts_.read_into(metrics, stream());
    loss_.check_labels(stream());
    metrics.allreduce(ddp_);
    network_.train();
    return metrics;
  }

  std::int64_t global_step() const { return global_step_; }
  // Training steps replayed from the CUDA graph so far (0 without cuda_graph).
  std::int64_t graph_replays() const { return graph_replays_; }
  // Times the step was recorded: once, and again after device memory moved (a larger evaluation
  // batch's first pass, say).
  std::int64_t graph_recordings() const { return graph_recordings_; }

 private:
  bool rank0() const { return ddp_.rank() == 0; }
  cudaStream_t stream() { return network_.context().stream(); }

  // The epoch's steps, queued on the device; nothing waits for them here.
  template <class Transform>
  void train_epoch(data::DeviceLoader<T, Transform>& batches, std::int64_t epoch, EpochLoop& loop) {
    PhaseTracker& phases = loop.phases();
    network_.train();
    train_counts_.reset(stream());
    batches.start_epoch(static_cast<std::uint64_t>(epoch));
    const std::int64_t total = batches.batches_per_epoch();
    for (std::int64_t b = 0;; ++b) {
      const data::DeviceBatch<T>* batch = nullptr;
      {
        auto timed = phases.time(Phase::kData);
        batch = batches.next();
      }
      if (!batch) break;
      run_step(*batch, phases);
      if (progress_ && (b % 10 == 0 || b + 1 == total))
        *options_.out << detail::progress_bar(
                             epoch + 1, options_.epochs, b + 1, total, loss_.read_loss(stream()),
                             double((b + 1) * batch->size()) / loop.seconds_since_epoch_start())
                      << std::flush;
    }
  }

  // Waits for the epoch's steps and reads their counts (which follow every step on the stream);
  // its training time is the epoch's wall time up to the end of that wait.
  EpochCounts read_training_counts(const EpochLoop& loop) {
    ClassificationMetrics train_metrics(kClasses);
    wait_for_device();
    train_counts_.read_into(train_metrics, stream());
    loss_.check_labels(stream());
    const double step_seconds = loop.seconds_since_epoch_start();
    if (progress_) *options_.out << '\r' << std::string(80, ' ') << '\r';
    const auto counts = train_metrics.counters();
    EpochCounts epoch;
    epoch.loss_sum = counts[ClassificationMetrics::kLossSum];
    epoch.correct = counts[ClassificationMetrics::kTop1];
    epoch.samples = counts[ClassificationMetrics::kSamples];
    epoch.step_seconds = step_seconds;
    return epoch;
  }

  // Waits, with the communicator's deadline, for the collectives queued on the network's stream,
  // then for the stream itself.
  void wait_for_device() {
    comm::Communicator& comm = ddp_.communicator();
    comm.set_stream(stream());
    comm.synchronize();
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream()));
  }

  // Dropout draws its masks from the context's step, which graph replays advance on the device
  // only: the host's count is set right before anything eager reads it.
  void sync_context_step() {
    network_.context().set_step(context_step_at_start_ +
                                static_cast<std::uint64_t>(steps_this_fit_));
  }

  void run_step(const data::DeviceBatch<T>& batch, PhaseTracker& phases) {
    optimizer_.set_lr(schedule_(global_step_));
    const bool full = batch.size() == full_batch_ || full_batch_ == 0;
    if (options_.cuda_graph && full && graph_) {
      {
        auto timed = phases.time(Phase::kData);
        // An evaluation batch larger than the training batch grows activations and workspaces:
        // the recorded step would touch freed memory, so it is recorded again.
        if (device_memory_generation() != graph_generation_) record_graph();
        copy_into_graph_input(batch);
      }
      auto timed = phases.time(Phase::kForward);
      graph_->replay(stream());
      ++graph_replays_;
    } else {
      sync_context_step();
      enqueue_step(batch.images, batch.labels, phases);
      if (options_.cuda_graph && full && !graph_) capture_graph(batch);
    }
    ++steps_this_fit_;
    ++global_step_;
  }

  void enqueue_step(tensor::TensorView<const T, tensor::Cuda> images,
                    tensor::TensorView<const std::int32_t, tensor::Cuda> labels,
                    PhaseTracker& phases) {
    tensor::TensorView<const T, tensor::Cuda> logits;
    {
      auto timed = phases.time(Phase::kForward);
      logits = network_.forward(images);
    }
    {
      auto timed = phases.time(Phase::kLoss);
      grad_.resize(logits.shape());
      loss_.forward_backward<T>(logits, labels, grad_.view(), optimizer_.loss_scale_device(),
                                stream());
    }
    {
      auto timed = phases.time(Phase::kBackward);
      network_.backward(grad_.view());
    }
    phases.add_seconds(Phase::kAllreduceWait, ddp_.finish_gradient_sync());
    {
      auto timed = phases.time(Phase::kOptimizer);
      optimizer_.unscale_and_check();
      ddp_.agree_on_overflow(optimizer_.found_inf());
      optimizer_.apply();  // also zeroes the gradients
    }
    train_counts_.add_batch<T>(logits, labels, loss_.mean_loss(), stream());
  }

  // After the first full-size eager step: the step recorded, reading the graph's own input.
  void capture_graph(const data::DeviceBatch<T>& batch) {
    full_batch_ = batch.size();
    graph_images_.resize(batch.images.shape());
    graph_labels_.resize(batch.labels.shape());
    record_graph();
  }

  // Every tensor already has its size for the training batch, so recording allocates nothing.
  void record_graph() {
    PhaseTracker ignored;
    graph_.reset();
    graph_.emplace(CudaGraph::capture(
        stream(), [&] { enqueue_step(graph_images_.view(), graph_labels_.view(), ignored); }));
    graph_generation_ = device_memory_generation();
    ++graph_recordings_;
  }

  void copy_into_graph_input(const data::DeviceBatch<T>& batch) {
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(graph_images_.data(), batch.images.data(),
                                        static_cast<std::size_t>(batch.images.numel()) * sizeof(T),
                                        cudaMemcpyDeviceToDevice, stream()));
    COLTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(graph_labels_.data(), batch.labels.data(),
                        static_cast<std::size_t>(batch.labels.numel()) * sizeof(std::int32_t),
                        cudaMemcpyDeviceToDevice, stream()));
  }

  CheckpointOptions checkpoint_options() const {
    CheckpointOptions options;
    options.model_name = options_.model_name;
    return options;
  }

  Net& network_;
  optim::DevicePrecisionOptimizer<Policy, Optimizer>& optimizer_;
  DeviceDataParallel<Net>& ddp_;
  Schedule schedule_;
  TrainerOptions options_;
  bool progress_ = false;
  nn::DeviceSoftmaxCrossEntropy loss_;
  tensor::Tensor<T, tensor::Cuda> grad_;
  DeviceClassificationCounters train_counts_;
  DeviceClassificationCounters eval_counts_;
  std::int64_t global_step_ = 0;
  std::uint64_t context_step_at_start_ = 0;
  std::int64_t steps_this_fit_ = 0;

  // CUDA-graph replay of full-size steps.
  std::int64_t full_batch_ = 0;
  tensor::Tensor<T, tensor::Cuda> graph_images_;
  tensor::Tensor<std::int32_t, tensor::Cuda> graph_labels_;
  std::optional<CudaGraph> graph_;
  std::uint64_t graph_generation_ = 0;  // device_memory_generation() when graph_ was recorded
  std::int64_t graph_replays_ = 0;
  std::int64_t graph_recordings_ = 0;
};

}  // namespace coltrain::train
