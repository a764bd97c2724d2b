#pragma once
// The sample trainers' command line (Options), its record in config.json, the learning-rate
// schedule it describes, and the choices compiled into this binary.
//
// Compile-time choices, and why: every model at every precision is one more instantiation of the
// whole training stack, minutes of compile time for cifar_resnet.cpp's twelve. So the one-line
// build compiles one precision (fp32 unless -DCOLTRAIN_SAMPLE_PRECISION=fp16 or bf16 says
// otherwise; =all for every one), and a run-time choice outside it is an error naming the macro to
// rebuild with. cifar_resnet.cpp chooses its models the same way (COLTRAIN_SAMPLE_MODEL), and the
// device likewise (COLTRAIN_SAMPLE_DEVICE: cuda under nvcc, cpu otherwise; =all compiles both into
// an nvcc build). CMake takes the same macros as cache variables (samples/CMakeLists.txt).

#include "command_line.hpp"

#include <coltrain/coltrain.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#ifndef COLTRAIN_SAMPLE_PRECISION
#define COLTRAIN_SAMPLE_PRECISION fp32
#endif
#ifndef COLTRAIN_SAMPLE_DEVICE
#if defined(__CUDACC__)
#define COLTRAIN_SAMPLE_DEVICE cuda
#else
#define COLTRAIN_SAMPLE_DEVICE cpu
#endif
#endif
#define COLTRAIN_SAMPLE_STRING(x) COLTRAIN_SAMPLE_STRING_IMPL(x)
#define COLTRAIN_SAMPLE_STRING_IMPL(x) #x

namespace sample {

namespace ct = coltrain;

// The precision this binary was compiled for, or "all".
inline constexpr std::string_view kCompiledPrecisions =
    COLTRAIN_SAMPLE_STRING(COLTRAIN_SAMPLE_PRECISION);
static_assert(kCompiledPrecisions == "fp32" || kCompiledPrecisions == "fp16" ||
                  kCompiledPrecisions == "bf16" || kCompiledPrecisions == "all",
              "COLTRAIN_SAMPLE_PRECISION must be fp32, fp16, bf16 or all");

// Whether `choice` is among `compiled` (one choice, or "all").
constexpr bool is_compiled(std::string_view compiled, std::string_view choice) {
  return compiled == "all" || compiled == choice;
}

// Throws ConfigError unless `choice`, given to `option`, is among `compiled`; the message names
// the macro to rebuild with.
inline void require_compiled(std::string_view option, std::string_view choice,
                             std::string_view macro, std::string_view compiled) {
  if (is_compiled(compiled, choice)) return;
  throw ct::ConfigError(std::string(option) + " " + std::string(choice) +
                        ": this binary was compiled for " + std::string(compiled) +
                        " alone; rebuild it with -D" + std::string(macro) + "=" +
                        std::string(choice) + " (or =all, which compiles longer)");
}

// Whether the compiler was nvcc, which the CUDA training path needs.
#if defined(__CUDACC__)
inline constexpr bool kBuiltWithCuda = true;
#else
inline constexpr bool kBuiltWithCuda = false;
#endif

// The device this binary trains on, or "all" (both, under nvcc).
inline constexpr std::string_view kCompiledDevices = COLTRAIN_SAMPLE_STRING(COLTRAIN_SAMPLE_DEVICE);
static_assert(kCompiledDevices == "cpu" || kCompiledDevices == "cuda" || kCompiledDevices == "all",
              "COLTRAIN_SAMPLE_DEVICE must be cpu, cuda or all");
static_assert(kBuiltWithCuda || kCompiledDevices == "cpu",
              "COLTRAIN_SAMPLE_DEVICE=cuda or all needs nvcc");

struct Options {
  // mpi, tcp, nccl, or auto (on the CPU: MPI under an MPI launcher, else TCP; on the GPU: NCCL
  // when this build has it, else the same)
  std::string backend = "auto";
  std::string device;  // cpu or cuda; empty until resolved (COLTRAIN_DEVICE, else the compiled one)
  std::optional<int> cuda_device;  // this rank's CUDA device, resolved from the launcher
  int epochs = 10;
  std::int64_t batch_size = 64;  // per rank
  // For the whole (global) batch; under --scale-lr for one rank's batch, multiplied by the ranks
  // and --grad-accum (effective_lr).
  double lr = 0.05;
  std::string schedule = "cosine";
  std::optional<int> warmup_epochs;  // unset: 0, or with --scale-lr the rule's (warmup_epochs_of)
  double momentum = 0.9;
  double weight_decay = 0;
  bool nesterov = false;
  // The compiled precision when there is one, else fp32.
  std::string precision{kCompiledPrecisions == "all" ? "fp32" : kCompiledPrecisions};
  std::string data;  // dataset directory; MNIST defaults to the subset shipped in data/mnist
  std::string log_dir;
  std::string trace;  // Chrome trace file (core/timeline.hpp); COLTRAIN_TRACE does the same
  std::optional<double> target_accuracy;
  std::string checkpoint_dir;
  int checkpoint_every = 1;
  bool resume = false;
  std::string resume_from;  // --resume DIR; empty: the checkpoint directory
  bool eval_only = false;
  int grad_accum = 1;
  std::optional<double> clip_grad_norm;
  std::optional<int> early_stopping_patience;
  bool scale_lr = false;
  int threads = 1;  // per rank
  std::uint64_t seed = 1;
  std::optional<bool> progress;  // unset: on a terminal (core/terminal.hpp)
  bool cuda_graph = false;       // replay each training step as a CUDA graph (--device cuda)
  // How the CPU trainer's gradient allreduces travel: none (f32), bf16 or fp16 (half the bytes,
  // reduced in f32: comm/algorithms/compressed_allreduce.hpp).
  std::string grad_compression = "none";
  // ZeRO stage: 1 shards the optimizer state across the ranks (train/zero_optimizer.hpp).
  int zero = 0;
  // Deterministic mode (comm/algorithms/rank_order.hpp): the gradient allreduces reduce every
  // element in one fixed tree over the ranks, so a run's bits do not depend on algorithms, sizes
  // or timing.
  bool deterministic = false;
  // > 0: the same bits on 1, 2, 4 or 8 ranks (train/data_parallel.hpp, deterministic mode): this
  // many samples a step whatever the world size, each rank's share cut into micro-shards.
  std::int64_t global_batch = 0;
  int micro_shards = 8;
  // Elastic training over TCP (comm/elastic/elastic_group.hpp): go on with the survivors when ranks
  // die, down to min_ranks; `join` enters a running elastic job at its next epoch.
  bool elastic = false;
  int min_ranks = 1;
  bool join = false;
};

// The options every sample takes; `o` holds the sample's own recipe as their defaults.
inline void add_options(CommandLine& app, Options& o) {
  app.option("--backend", o.backend, "mpi, tcp, nccl (--device cuda) or auto")
      .choices({"auto", "mpi", "tcp", "nccl"})
      .show_default();
  app.option("--grad-compression", o.grad_compression,
             "gradients on the wire (--device cpu): none, bf16 or fp16, reduced in f32")
      .choices({"none", "bf16", "fp16"})
      .show_default();
  app.option("--zero", o.zero,
             "ZeRO stage (--device cpu): 1 shards the optimizer state (momentum, masters) "
             "across the ranks")
      .choices({0, 1})
      .show_default();
  app.option("--device", o.device, "cpu or cuda (default: $COLTRAIN_DEVICE, else cpu)")
      .choices({"cpu", "cuda"});
  app.option("--epochs", o.epochs, "training epochs").positive().show_default();
  app.option("--batch-size", o.batch_size, "batch size per rank").positive().show_default();
  app.option("--lr", o.lr, "learning rate (for the global batch; with --scale-lr, for one rank's)")
      .show_default();
  app.flag("--scale-lr", o.scale_lr,
           "linear scaling rule: --lr times ranks times --grad-accum, warmed up from --lr over "
           "--warmup-epochs (default: a fifth of the epochs, 1 to 5)");
  app.option("--schedule", o.schedule, "cosine, step (/10 at 50% and 75%) or constant")
      .choices({"cosine", "step", "constant"})
      .show_default();
  app.option("--warmup-epochs", o.warmup_epochs, "linear warm-up epochs (default 0)")
      .non_negative();
  app.option("--momentum", o.momentum, "SGD momentum").show_default();
  app.option("--weight-decay", o.weight_decay, "SGD weight decay").show_default();
  app.flag("--nesterov", o.nesterov, "Nesterov momentum");
  app.option("--precision", o.precision,
             "fp32, fp16 or bf16 (mixed, fp32 master weights); compiled in: " +
                 std::string(kCompiledPrecisions))
      .choices({"fp32", "fp16", "bf16"})
      .show_default();
  app.option("--data", o.data, "dataset directory");
  app.option("--log-dir", o.log_dir, "write config.json, metrics.jsonl and result.json here");
  app.option("--trace", o.trace,
             "write a Chrome trace (Perfetto) of collectives and training phases to this file "
             "(several ranks: FILE.rank<R>.json)");
  app.option("--target-accuracy", o.target_accuracy,
             "stop when validation accuracy reaches this (exit status 2 if never)");
  app.option("--checkpoint-dir", o.checkpoint_dir, "save checkpoints here");
  app.option("--checkpoint-every", o.checkpoint_every, "epochs between checkpoints")
      .positive()
      .show_default();
  app.optional_value(
      "--resume", "DIR",
      [&o](const std::string& dir) {
        o.resume = true;
        o.resume_from = dir;
      },
      "continue from the newest checkpoint in DIR (default: --checkpoint-dir)");
  app.flag("--eval-only", o.eval_only,
           "evaluate the newest checkpoint of --resume DIR (or --checkpoint-dir) on the "
           "validation set instead of training (the run's --seed and --precision)");
  app.option("--grad-accum", o.grad_accum,
             "batches whose gradients are summed before each optimizer step (--device cpu)")
      .positive()
      .show_default();
  app.option("--clip-grad-norm", o.clip_grad_norm,
             "clip the gradients' global L2 norm to this (--device cpu)")
      .positive();
  app.option("--early-stopping-patience", o.early_stopping_patience,
             "stop when the validation loss has not improved for this many epochs")
      .positive();
  app.option("--threads", o.threads, "CPU threads per rank").positive().show_default();
  app.option("--seed", o.seed, "initialisation, data order and dropout").show_default();
  app.flag(
      "--progress", [&o] { o.progress = true; },
      "progress bar (default: only when standard output is a terminal)");
  app.flag(
      "--no-progress", [&o] { o.progress = false; }, "no progress bar");
  app.flag("--cuda-graph", o.cuda_graph,
           "replay each training step as one CUDA graph (--device cuda; NCCL or one rank)");
  app.flag("--deterministic", o.deterministic,
           "reduce every gradient element in one fixed order (COLTRAIN_DETERMINISTIC=1): the same "
           "bits whatever the algorithm, sizes and timing, for a given number of ranks");
  app.option("--global-batch", o.global_batch,
             "the same bits on any number of ranks that divides --micro-shards into a power of "
             "two (--device cpu): this many samples a step whatever the ranks (replaces "
             "--batch-size), each rank's share cut into micro-shards trained one after another, "
             "BatchNorm per micro-shard")
      .positive();
  app.option("--micro-shards", o.micro_shards,
             "--global-batch: micro-shards a global batch (8: the same bits on 1, 2, 4 or 8 ranks)")
      .positive()
      .show_default();
  app.flag("--elastic", o.elastic,
           "keep training on the surviving ranks when ranks die (TCP backend, CPU)");
  app.option("--min-ranks", o.min_ranks, "--elastic: stop when fewer ranks are left")
      .positive()
      .show_default();
  app.flag("--join", o.join,
           "--elastic: join the running job at MASTER_ADDR:MASTER_PORT at its next epoch");
}

// Fills o.device from COLTRAIN_DEVICE when --device was not given (when that is unset too: cpu, or
// cuda in a binary compiled for cuda alone), then checks that this binary can run what the options
// ask for. `program` is the sample's name, for the nvcc line. Throws ConfigError.
inline void resolve_and_check(Options& o, const std::string& program) {
  if (o.device.empty()) {
    const char* from_env = std::getenv("COLTRAIN_DEVICE");
    const bool from_env_set = from_env != nullptr && *from_env != '\0';
    o.device = from_env_set ? from_env : kCompiledDevices == "cuda" ? "cuda" : "cpu";
    if (o.device != "cpu" && o.device != "cuda")
      throw ct::ConfigError("COLTRAIN_DEVICE=" + o.device + ": must be cpu or cuda");
  }
  if (o.device == "cuda" && !kBuiltWithCuda) {
    throw ct::ConfigError(
        "--device cuda: this binary was compiled without CUDA; compile the sample with nvcc to "
        "train on GPUs: nvcc -ccbin mpicxx -x cu -std=c++20 -O2 -arch=sm_90 -I include samples/" +
        program + ".cpp -lz -lcublas -lcudnn -lnccl -o " + program);
  }
  require_compiled("--device", o.device, "COLTRAIN_SAMPLE_DEVICE", kCompiledDevices);
  require_compiled("--precision", o.precision, "COLTRAIN_SAMPLE_PRECISION", kCompiledPrecisions);
  if (o.join) o.elastic = true;
  if (o.elastic && (o.device != "cpu" || (o.backend != "auto" && o.backend != "tcp")))
    throw ct::ConfigError(
        "--elastic trains on the CPU over the TCP backend (--device cpu, "
        "--backend tcp); MPI aborts and NCCL cannot shrink in this build "
        "(docs/fault-tolerance.md)");
  if (o.deterministic && o.device == "cuda" && o.backend != "mpi" && o.backend != "tcp")
    throw ct::ConfigError(
        "--deterministic with --device cuda needs --backend mpi or tcp (device buffers staged "
        "through the host): NCCL's reductions add in orders of their own");
  if (o.device != "cuda" && (o.cuda_graph || o.backend == "nccl"))
    throw ct::ConfigError(std::string(o.cuda_graph ? "--cuda-graph" : "--backend nccl") +
                          " trains on the GPU: give --device cuda too");
  if (o.zero != 0 && (o.device != "cpu" || o.elastic || o.grad_compression != "none"))
    throw ct::ConfigError(
        "--zero 1 shards the CPU trainer's optimizer state; it does not combine with " +
        std::string(o.device != "cpu" ? "--device cuda (the GPU trainer keeps it whole)"
                    : o.elastic ? "--elastic (the survivors would lose the dead ranks' shards)"
                                : "--grad-compression (the reduce-scatter is uncompressed)"));
  if (o.global_batch > 0 && (o.device != "cpu" || o.grad_compression != "none" || o.scale_lr)) {
    throw ct::ConfigError(
        "--global-batch trains the same bits on any number of ranks on the CPU trainer; it does "
        "not combine with " +
        std::string(o.device != "cpu" ? "--device cuda"
                    : o.scale_lr      ? "--scale-lr (the batch does not grow with the ranks)"
                                      : "--grad-compression (the fold adds in f32, uncompressed)"));
  }
  if (o.global_batch > 0 && o.global_batch % o.micro_shards != 0)
    throw ct::ConfigError("--global-batch " + std::to_string(o.global_batch) +
                          " is not a multiple of --micro-shards " + std::to_string(o.micro_shards));
  if (o.eval_only && !o.resume && o.checkpoint_dir.empty())
    throw ct::ConfigError(
        "--eval-only evaluates a checkpoint: give --resume DIR (or --checkpoint-dir)");
  if (o.eval_only) o.resume = true;
  if (o.elastic && (o.grad_accum > 1 || o.early_stopping_patience))
    throw ct::ConfigError(
        std::string(o.grad_accum > 1 ? "--grad-accum" : "--early-stopping-patience") +
        " does not combine with --elastic (a regroup would lose the partial sums; a joiner would "
        "not know the count)");
  if (o.device == "cuda" && (o.grad_accum > 1 || o.clip_grad_norm || o.eval_only))
    throw ct::ConfigError(
        std::string(o.grad_accum > 1   ? "--grad-accum"
                    : o.clip_grad_norm ? "--clip-grad-norm"
                                       : "--eval-only") +
        " is the CPU trainer's for now; the GPU trainer does not have it yet (use --device cpu)");
  if (o.device == "cuda" && o.grad_compression != "none")
    throw ct::ConfigError("--grad-compression " + o.grad_compression +
                          " compresses the CPU trainer's host allreduces; the GPU trainer's "
                          "device buffers travel uncompressed (use --device cpu)");
}

// The learning rate the schedule reaches: --lr, or under --scale-lr (Goyal et al. 2017) --lr times
// the ranks and --grad-accum: the global batch is that many times one rank's.
inline double effective_lr(const Options& o, int world_size) {
  return o.scale_lr ? ct::optim::scale_lr_linearly(o.lr, world_size * o.grad_accum) : o.lr;
}

// --warmup-epochs, or when not given 0, and under --scale-lr a fifth of the epochs (at least 1, at
// most Goyal et al.'s 5): a large scaled rate from the first step diverges.
inline int warmup_epochs_of(const Options& o) {
  if (o.warmup_epochs) return *o.warmup_epochs;
  return o.scale_lr ? std::clamp(o.epochs / 5, 1, 5) : 0;
}

inline ct::Json to_json(const Options& o, const std::string& model, int world_size,
                        const std::string& backend) {
  ct::Json config;
  config["model"] = model;
  config["backend"] = backend;
  config["world_size"] = world_size;
  config["device"] = o.device;
  config["cuda_device"] = o.cuda_device;
  config["cuda_graph"] = o.cuda_graph;
  config["grad_compression"] = o.grad_compression;
  config["zero"] = o.zero;
  config["deterministic"] = o.deterministic;
  config["epochs"] = o.epochs;
  config["batch_size_per_rank"] =
      o.global_batch > 0 ? o.global_batch / std::max(world_size, 1) : o.batch_size;
  config["global_batch"] = o.global_batch > 0 ? ct::Json(o.global_batch) : ct::Json();
  config["micro_shards"] = o.global_batch > 0 ? ct::Json(o.micro_shards) : ct::Json();
  config["lr"] = o.lr;
  config["scale_lr"] = o.scale_lr;
  config["effective_lr"] = effective_lr(o, world_size);
  config["schedule"] = o.schedule;
  config["warmup_epochs"] = warmup_epochs_of(o);
  config["grad_accum"] = o.grad_accum;
  config["clip_grad_norm"] = o.clip_grad_norm;
  config["early_stopping_patience"] = o.early_stopping_patience;
  config["momentum"] = o.momentum;
  config["weight_decay"] = o.weight_decay;
  config["nesterov"] = o.nesterov;
  config["precision"] = o.precision;
  config["data"] = o.data;
  config["target_accuracy"] = o.target_accuracy;
  config["threads_per_rank"] = o.threads;
  config["seed"] = o.seed;
  config["elastic"] = o.elastic;
  if (o.elastic) config["min_ranks"] = o.min_ranks;
  return config;
}

// The trainer's options the command line gives (the GPU trainer adds --cuda-graph).
inline ct::train::TrainerOptions trainer_options(const Options& o, const std::string& model,
                                                 int world_size, const std::string& backend) {
  return {.epochs = o.epochs,
          .target_accuracy = o.target_accuracy,
          .log_dir = o.log_dir,
          .checkpoint_dir = o.checkpoint_dir,
          .checkpoint_every = o.checkpoint_every,
          .model_name = model,
          .resume = o.resume,
          .resume_from = o.resume_from,
          .eval_only = o.eval_only,
          .progress = o.progress,
          .grad_accum = o.grad_accum,
          .clip_grad_norm = o.clip_grad_norm,
          .early_stopping_patience = o.early_stopping_patience,
          .config = to_json(o, model, world_size, backend)};
}

// The learning rate at each optimizer step: warm-up, then cosine, step or constant, at
// effective_lr. `batches_per_epoch` is one rank's; with --grad-accum N an optimizer step takes N of
// them. Warm-up starts at a tenth of the rate, or under --scale-lr at the unscaled --lr (Goyal et
// al.'s gradual warm-up).
inline std::function<double(std::int64_t)> make_schedule(const Options& o, int world_size,
                                                         std::int64_t batches_per_epoch) {
  const std::int64_t steps_per_epoch = (batches_per_epoch + o.grad_accum - 1) / o.grad_accum;
  const int warmup_epochs = warmup_epochs_of(o);
  const double lr = effective_lr(o, world_size);
  const std::int64_t warmup = warmup_epochs * steps_per_epoch;
  const std::int64_t rest = std::max<std::int64_t>(1, (o.epochs - warmup_epochs) * steps_per_epoch);
  std::function<double(std::int64_t)> after;
  if (o.schedule == "cosine")
    after = ct::optim::CosineAnnealingLr{.base_lr = lr, .t_max = rest};
  else if (o.schedule == "step")
    after = ct::optim::MultiStepLr{.base_lr = lr, .milestones = {rest / 2, rest * 3 / 4}};
  else
    after = ct::optim::ConstantLr{.base_lr = lr};
  return ct::optim::LinearWarmup<std::function<double(std::int64_t)>>{
      .warmup_steps = warmup,
      .start_factor = o.scale_lr ? o.lr / lr : 0.1,
      .inner = std::move(after)};
}

}  // namespace sample
