#pragma once
// DataParallel<Net>: synchronous data-parallel training in the manner of PyTorch's
// DistributedDataParallel, for any nn::Network on the CPU and any comm::Communicator backend.
//
//   comm::Communicator comm = comm::Communicator::from_env();
//   nn::Network<Spec> net({.threads = 2, .seed = 1});
//   train::DataParallel ddp(net, comm);        // every rank now holds rank 0's parameters
//   net.zero_grad();
//   net.forward(my_shard);  ...  net.backward(grad_logits);   // buckets reduce during backward
//   ddp.finish_gradient_sync();                // waits; the gradients are the ranks' average
//   sgd.step(lr);
//   ddp.average_buffers();                     // before evaluating or saving: BatchNorm's
//                                              // running statistics, averaged across ranks
//
// Gradients are grouped into buckets in reverse state_dict order (the order in which the backward
// pass finishes them), the first bucket small so that communication starts early. The network
// reports each parameter whose gradient is final (nn::Context's gradient-ready hook); when all of a
// bucket's parameters are in, and all earlier buckets have gone, a non-blocking allreduce
// (ReduceOp::kAvg) of the bucket is issued: the communicator's progress thread reduces it while the
// main thread goes on with the backward pass. finish_gradient_sync() waits. Buckets go in the same
// order on every rank. The network keeps its gradients in one arena in bucket order
// (nn/parameter_arena.hpp), so a bucket is a range of it, reduced in place: no copy into a flat
// buffer and back (DDP's gradient_as_bucket_view). docs/data-parallel.md has details and costs.
//
// 16-bit gradients (half, bfloat16) are widened into f32 bucket buffers, reduced in f32 and
// rounded once, on the way back: the numerics of the communicator's own f16/bf16 path, with one
// copy fewer. Bucket sizes count the gradients' bytes as an allreduce carries them (f32 for 16-bit
// gradients); the allreduce also carries the arena's padding between them, under 64 bytes each.
//
// Deterministic mode (DataParallelOptions::micro_shards = M > 0): the same bits on every world
// size p with M/p a power of two. Each step's global batch is cut into M micro-shards; a rank runs
// its M/p shards through compute_gradients(), one forward and backward pass each, and the shards'
// gradients, running statistics and losses are folded in one fixed tree (train/
// deterministic_gradients.hpp). No buckets reduce during the backward passes then:
//
//   train::DataParallel ddp(net, comm, {.micro_shards = 8});
//   double loss = ddp.compute_gradients(step, [&](int shard) {
//     const auto [begin, end] = ddp.shard_samples(global_batch, shard);
//     ...  // forward, loss_and_grad and backward on those samples of the global batch
//     return shard_mean_loss;
//   });
//   sgd.step(lr);   // the same gradients on every rank, whatever the world size
//
// Threads: while a step is in flight the communicator's progress thread runs its buckets' requests
// (comm/request.hpp); blocking calls on it (the helpers at the end) wait for them first. With the
// MPI backend the program's MPI must allow that (MPI_THREAD_MULTIPLE, which Communicator::from_env
// requests when it initialises MPI itself; SERIALIZED suffices when no other thread calls MPI).

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>
#include <coltrain/tensor/device.hpp>
#include <coltrain/train/arena_shards.hpp>
#include <coltrain/train/deterministic_gradients.hpp>
#include <coltrain/train/gradient_buckets.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace coltrain::train {

struct DataParallelOptions {
  // DDP's defaults: a 1 MiB first bucket gets communication going early in the backward pass; the
  // larger later ones amortise the per-call latency. A bucket closes as soon as it holds at least
  // its cap, so 1 gives one bucket per parameter.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  std::size_t bucket_bytes = std::size_t{25} << 20;
  comm::Algorithm algorithm = comm::Algorithm::kAutomatic;  // of the gradient allreduces
  // How the f32 buckets travel: as f32, or as bf16 or f16 and still reduced in f32
  // (comm/algorithms/compressed_allreduce.hpp; the algorithm must then be automatic).
  comm::WireCompression compression = comm::WireCompression::kNone;
  // 0: every rank gets every averaged gradient (bucketed allreduces during the backward pass).
  // 1: ZeRO-1, for a train::ZeroOptimizer: finish_gradient_sync() reduce-scatters the gradients
  // once the backward pass is done, so that each rank holds the average of its own shard of the
  // parameter arena (train/arena_shards.hpp); its other gradients are then partial sums, for no
  // use. No overlap with the backward pass: the optimizer state, not the step time, is what
  // ZeRO-1 saves (docs/data-parallel.md).
  int zero_stage = 0;
  // > 0: deterministic mode (above), with this many micro-shards a global batch: the world size
  // must divide them into a power of two per rank (8: 1, 2, 4 or 8 ranks). The gradients are then
  // folded by the rank_order allreduce: `algorithm` must be automatic and there is no compression.
  // With zero_stage = 1 every rank still holds the whole folded gradient, and a ZeroOptimizer
  // steps its shard of it (finish_gradient_sync() has nothing to reduce-scatter).
  int micro_shards = 0;
};

// What the last finish_gradient_sync() saw, to show that communication overlapped the backward
// pass: launched_during_backward is exact; reduced_before_wait depends on timing.
struct GradientSyncStats {
  std::size_t buckets = 0;
  std::size_t launched_during_backward = 0;  // issued by the hook during the backward pass
                                             // (all but the last, which the caller reduces)
  std::size_t reduced_before_wait = 0;       // already averaged when the wait began
  double wait_seconds = 0;                   // time finish_gradient_sync() blocked
};

namespace detail {

template <class T>
inline constexpr bool kSixteenBit = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

// The element type of a bucket buffer: f32 for 16-bit gradients.
template <class T>
using bucket_element_t = std::conditional_t<kSixteenBit<T>, float, T>;

// Rethrows as the same type, the message prefixed with `what`, the context completed with the rank.
[[noreturn]] inline void rethrow_with_context(std::exception_ptr error, const std::string& what,
                                              int rank) {
  const auto context_of = [rank](const Error& e) {
    ErrorContext context = e.context();
    if (!context.rank) context.rank = rank;
    return context;
  };
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    throw TimeoutError(what + e.message(), context_of(e));
  } catch (const PeerLostError& e) {
    throw PeerLostError(what + e.message(), context_of(e));
  } catch (const MismatchError& e) {
    throw MismatchError(what + e.message(), context_of(e));
  } catch (const CommError& e) {
    throw CommError(what + e.message(), context_of(e));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(what + e.message(), context_of(e));
  } catch (...) {
    // BackendError (whose message embeds its library and code), std::bad_alloc: as they are.
    throw;
  }
}

// The check of DataParallel::average_buffers (and DeviceDataParallel's) on integer buffers:
// `counts` holds each value as (x, -x), `owner` each value's index in `names`. One kMin allreduce
// gives every rank the smallest and largest value; a difference is a MismatchError naming the
// buffer, on every rank.
template <class Communicator>
void require_equal_counts(Communicator& comm, std::vector<std::int64_t>& counts,
                          const std::vector<std::string>& names,
                          const std::vector<std::size_t>& owner, const ErrorContext& context) {
  if (counts.empty()) return;
  comm.allreduce(std::span<std::int64_t>(counts), comm::ReduceOp::kMin);
  for (std::size_t i = 0; i < owner.size(); ++i) {
    if (counts[2 * i] == -counts[2 * i + 1]) continue;
    throw MismatchError("DataParallel::average_buffers: '" + names[owner[i]] +
                            "' differs across ranks (" + std::to_string(counts[2 * i]) + " to " +
                            std::to_string(-counts[2 * i + 1]) +
                            "); every rank must run the same number of training-mode forward "
                            "passes",
                        context);
  }
}

// Rank `root`'s parameters and buffers to every rank: rank 0's are what both data-parallel
// wrappers start from.
template <class Net>
void broadcast_parameters_and_buffers(Net& network, comm::Communicator& comm, int root = 0) {
  network.visit_parameters(
      [&](const std::string&, auto& parameter) { comm.broadcast(parameter.value.span(), root); });
  network.visit_buffers(
      [&](const std::string&, auto& buffer) { comm.broadcast(buffer.span(), root); });
}

}  // namespace detail

// What DataParallel and DeviceDataParallel (cuda/train/data_parallel.cuh) share: the job and its
// options, the gradient buckets and this step's reports and launches, the failure that left the
// communicator unusable, no_sync()'s scope, and the collectives between steps. `owner` names the
// wrapper in errors.
class GradientSyncState {
 public:
  GradientSyncState(const GradientSyncState&) = delete;
  GradientSyncState& operator=(const GradientSyncState&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  comm::Communicator& communicator() { return comm_; }
  const DataParallelOptions& options() const { return options_; }
  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  const GradientSyncStats& last_sync() const { return last_sync_; }

  // In place across ranks, for metrics (loss sums, correct counts).
  void allreduce(std::span<double> values, comm::ReduceOp op = comm::ReduceOp::kSum) {
    require_idle("allreduce");
    comm_.allreduce(values, op);
  }

  void barrier() {
    require_idle("barrier");
    comm_.barrier();
  }

  // Gradient accumulation without communication, as DDP's no_sync(): backward passes inside the
  // scope only add to the local gradients; the first synchronised backward pass after it reduces
  // the accumulated sums.
  class [[nodiscard]] NoSyncScope {
   public:
    NoSyncScope(const NoSyncScope&) = delete;
    NoSyncScope& operator=(const NoSyncScope&) = delete;
    ~NoSyncScope() { owner_.sync_enabled_ = previous_; }

   private:
    friend class GradientSyncState;
    explicit NoSyncScope(GradientSyncState& owner) : owner_(owner), previous_(owner.sync_enabled_) {
      owner_.sync_enabled_ = false;
    }
    GradientSyncState& owner_;
    bool previous_;
  };

 protected:
  GradientSyncState(const char* owner, comm::Communicator& communicator,
                    DataParallelOptions options)
      : owner_(owner),
        comm_(communicator),
        options_(options),
        rank_(communicator.rank()),
        world_size_(communicator.size()) {}
  ~GradientSyncState() = default;

  ErrorContext error_context(std::string operation) const {
    ErrorContext c;
    c.rank = rank_;
    c.operation = std::move(operation);
    return c;
  }

  void throw_if_failed(const char* what) const {
    if (!failure_.empty()) {
      throw CommError(std::string(owner_) + "::" + what +
                          ": an earlier communication error left the communicator unusable (" +
                          failure_ + ")",
                      error_context(what));
    }
  }

  void require_idle(const char* what) const {
    throw_if_failed(what);
    if (tracker_.started()) {
      throw Error(std::string(owner_) + "::" + what +
                      ": gradient buckets of this step are still in flight; call "
                      "finish_gradient_sync() first",
                  error_context(what));
    }
  }

  // no_sync()'s scope, outside a synchronised step only.
  NoSyncScope pause_sync() {
    if (tracker_.started()) {
      throw InvalidArgument(std::string(owner_) +
                                "::no_sync: a synchronised backward pass has already reported "
                                "gradients; call finish_gradient_sync() first",
                            error_context("no_sync"));
    }
    return NoSyncScope(*this);
  }

  void reset_step() {
    tracker_.reset();
    next_launch_ = 0;
  }

  // InvalidArgument if the network already reports its gradients to someone: one wrapper each.
  template <class Net>
  void require_unwrapped(Net& network) const {
    if (!network.context().gradient_ready_hook()) return;
    throw InvalidArgument(std::string(owner_) +
                              ": the network already has a gradient-ready hook (is it wrapped "
                              "by another DataParallel?)",
                          error_context("construct"));
  }

  // Names and numbers the network's parameters in state_dict order and puts their gradients, of
  // `element_bytes` bytes each in the buckets' buffers, into buckets, the same way on every rank.
  template <class Net>
  void assign_buckets(Net& network, std::size_t element_bytes) {
    const auto& arena = network.parameter_arena();
    std::vector<std::size_t> bytes;
    network.visit_parameters([&](const std::string& name, auto& parameter) {
      index_.emplace(static_cast<const void*>(&parameter), names_.size());
      bytes.push_back(arena.size(names_.size()) * element_bytes);
      names_.push_back(name);
    });
    buckets_ = assign_gradient_buckets(bytes, options_.first_bucket_bytes, options_.bucket_bytes);
    requests_.resize(buckets_.size());
    tracker_ = BucketLaunchTracker(buckets_, names_.size());
  }

  // MismatchError unless every rank built the same buckets (different models or options).
  void check_same_buckets_on_every_rank() {
    std::vector<std::int64_t> values = bucket_agreement_values(buckets_);
    comm_.allreduce(std::span<std::int64_t>(values), comm::ReduceOp::kMin);
    if (const std::string problem = bucket_disagreement(buckets_, values); !problem.empty())
      throw MismatchError(std::string(owner_) + ": " + problem, error_context("construct"));
  }

  // Records the gradient-ready report of `parameter` and returns how many buckets are complete
  // (BucketLaunchTracker::report). Throws for an address that is not a parameter of the network,
  // and for a second report in one step.
  std::size_t record_report(const void* parameter) {
    const auto found = index_.find(parameter);
    if (found == index_.end()) {
      throw Error(std::string(owner_) +
                      ": the network reported a gradient that is not one of its parameters",
                  error_context("gradient-ready report"));
    }
    const std::size_t p = found->second;
    if (tracker_.reported(p)) {
      throw Error(std::string(owner_) + ": the gradient of '" + names_[p] +
                      "' was reported twice in one step; call finish_gradient_sync() after each "
                      "synchronised backward pass, and accumulate inside no_sync()",
                  error_context("gradient-ready report"));
    }
    return tracker_.report(p);
  }

  // Makes `error`, met by bucket b's allreduce, the failure that leaves this object unusable, and
  // rethrows it prefixed with the bucket.
  [[noreturn]] void fail_bucket(std::exception_ptr error, std::size_t b) {
    failure_ = std::string(owner_) + ": allreduce of gradient bucket " + std::to_string(b) +
               " of " + std::to_string(buckets_.size()) + " (" + std::to_string(buckets_[b].bytes) +
               " bytes) failed";
    detail::rethrow_with_context(error, failure_ + ": ", rank_);
  }

  const char* owner_;
  comm::Communicator& comm_;
  DataParallelOptions options_;
  int rank_;
  int world_size_;

  // Fixed at construction.
  std::vector<std::string> names_;                      // by parameter index (state_dict order)
  std::unordered_map<const void*, std::size_t> index_;  // Parameter address -> index
  std::vector<GradientBucket> buckets_;

  BucketLaunchTracker tracker_;          // this step's reports
  std::size_t next_launch_ = 0;          // buckets issued this step
  std::vector<comm::Request> requests_;  // by bucket
  bool sync_enabled_ = true;
  GradientSyncStats last_sync_;
  std::string failure_;  // the error that made the communicator unusable
};

// What DataParallel needs of a network: nn::Network on the CPU. (A requires-expression with lambdas
// here defeats class template argument deduction under nvcc.)
template <class Net>
concept DataParallelNetwork = std::is_same_v<typename Net::device_type, tensor::Cpu>;

template <DataParallelNetwork Net>
class DataParallel : public GradientSyncState {
  using T = typename Net::value_type;
  using B = detail::bucket_element_t<T>;
  static constexpr bool kInPlace = std::is_same_v<T, B>;  // the allreduce works on the arena

 public:
  // Broadcasts rank 0's parameters and buffers to every rank and checks that all ranks built the
  // same buckets. Collective: every rank constructs its
  // DataParallel at the same point. The network and the communicator must outlive this object.
  // Throws InvalidArgument if the network already has a gradient-ready hook (another DataParallel),
  // MismatchError if ranks disagree on the buckets (different models or options), and the
  // communicator's errors.
  DataParallel(Net& network, comm::Communicator& communicator, DataParallelOptions options = {})
      : GradientSyncState("DataParallel", communicator, options), network_(network) {
    if (options_.zero_stage != 0 && options_.zero_stage != 1) {
      throw InvalidArgument(
          "DataParallel: ZeRO stage " + std::to_string(options_.zero_stage) + " (0 and 1 exist)",
          error_context("construct"));
    }
    if (options_.zero_stage == 1 && options_.compression != comm::WireCompression::kNone) {
      throw InvalidArgument("DataParallel: ZeRO-1 sends gradients uncompressed",
                            error_context("construct"));
    }
    if (options_.compression != comm::WireCompression::kNone &&
        (!std::is_same_v<B, float> || options_.algorithm != comm::Algorithm::kAutomatic)) {
      throw InvalidArgument(
          "DataParallel: wire compression takes f32 (or 16-bit) gradients and the automatic "
          "algorithm",
          error_context("construct"));
    }
    if (options_.micro_shards < 0) {
      throw InvalidArgument(
          "DataParallel: " + std::to_string(options_.micro_shards) + " micro-shards (0: off)",
          error_context("construct"));
    }
    if (options_.micro_shards > 0 && (options_.compression != comm::WireCompression::kNone ||
                                      options_.algorithm != comm::Algorithm::kAutomatic)) {
      throw InvalidArgument(
          "DataParallel: deterministic mode (micro_shards) folds the gradients with the "
          "rank_order allreduce: it takes the automatic algorithm and no compression",
          error_context("construct"));
    }
    require_unwrapped(network_);
    assign_buckets(network_, sizeof(B));
    if (options_.micro_shards > 0) deterministic_.emplace(network_, comm_, options_.micro_shards);
    auto& arena = network_.parameter_arena();
    for (const GradientBucket& bucket : buckets_) {
      const auto [first, end] = arena.range(bucket.parameters);
      ranges_.push_back(std::span<T>(arena.gradients() + first, end - first));
      if (!kInPlace && options_.zero_stage == 0 && !deterministic_)
        buffers_.emplace_back(end - first);
    }
    check_same_buckets_on_every_rank();
    broadcast_parameters_and_buffers();
    network_.context().set_gradient_ready_hook(
        [this](const void* parameter) { on_gradient_ready(parameter); });
  }

  // Waits for the buckets already issued (each bounded by the communicator's deadline), whose
  // buffers go with this object; errors met then are dropped.
  ~DataParallel() {
    network_.context().set_gradient_ready_hook(nullptr);
    for (std::size_t b = 0; b < next_launch_; ++b) {
      try {
        requests_[b].wait();
      } catch (...) {
      }
    }
  }

  // Waits until every bucket of this step is averaged and copied back into the gradients, and
  // returns the seconds it waited (the trainer's "allreduce wait"). Buckets whose parameters were
  // not all reported (a layer outside the protocol) are reduced now, so the result is complete in
  // any case. Under no_sync() it does nothing and returns 0. Rethrows the first bucket's error,
  // prefixed with the bucket, as the same exception type; the communicator is then unusable, and
  // so is this object (later calls throw CommError).
  // In deterministic mode the gradients are final when compute_gradients() returns: it returns 0.
  double finish_gradient_sync() {
    throw_if_failed("finish_gradient_sync");
    if (!sync_enabled_ || deterministic_) return 0.0;
    if (options_.zero_stage == 1) return reduce_scatter_gradients();
    const std::size_t launched_during_backward = next_launch_;
    if (buckets_.empty()) return 0.0;  // a network without parameters
    std::size_t reduced_before_wait = 0;
    for (std::size_t b = 0; b < launched_during_backward; ++b) {
      try {
        if (requests_[b].test()) ++reduced_before_wait;
      } catch (...) {
        ++reduced_before_wait;  // done, with an error: reported below
      }
    }
    const Stopwatch watch;
    std::exception_ptr error;
    std::size_t error_bucket = 0;
    // The last bucket is ready only when the backward pass ends, so nothing is left to overlap it
    // with: it is reduced here by a blocking call, which first waits for the earlier buckets (in
    // order). That saves two thread hand-overs per step, which are most of the communication time
    // of a small model with one bucket.
    const std::size_t last = buckets_.size() - 1;
    launch(last);
    for (std::size_t b = 0; b < last && !error; ++b) {
      try {
        requests_[b].wait();
      } catch (...) {
        error = std::current_exception();
        error_bucket = b;
      }
    }
    if (!error) {
      try {
        pack_bucket(last);
        comm_.allreduce(bucket_elements(last), comm::ReduceOp::kAvg, options_.algorithm,
                        options_.compression);
      } catch (...) {
        error = std::current_exception();
        error_bucket = last;
      }
    }
    if (!error) {
      for (std::size_t b = 0; b < buckets_.size(); ++b) unpack_bucket(b);
    } else {
      // The rest fail at once on the broken communicator; they hold buffers of this object.
      for (std::size_t b = error_bucket + 1; b < last; ++b) {
        try {
          requests_[b].wait();
        } catch (...) {
        }
      }
    }
    last_sync_ = {buckets_.size(), launched_during_backward, reduced_before_wait, watch.seconds()};
    reset_step();
    if (error) fail_bucket(error, error_bucket);
    return last_sync_.wait_seconds;
  }

  // Gradient accumulation without communication (GradientSyncState::NoSyncScope). Throws
  // InvalidArgument inside a synchronised step (some gradients already reported), and in
  // deterministic mode, which accumulates through compute_gradients(..., accumulate = true).
  NoSyncScope no_sync() {
    if (deterministic_) {
      throw InvalidArgument(
          "DataParallel::no_sync: in deterministic mode (micro_shards) gradients accumulate "
          "through compute_gradients(pass_number, pass, true)",
          error_context("no_sync"));
    }
    return pause_sync();
  }

  // ---- deterministic mode (DataParallelOptions::micro_shards) ----

  bool deterministic() const { return deterministic_.has_value(); }
  // This rank's shards: first_shard() and the local_shards() - 1 after it (0 and 1 when off).
  int first_shard() const { return deterministic_ ? deterministic_->first_shard() : 0; }
  int local_shards() const { return deterministic_ ? deterministic_->local_shards() : 1; }

  // Shard `shard`'s samples within a global batch of `global_batch`: [begin, end). Throws
  // InvalidArgument outside deterministic mode, and unless the batch is a positive multiple of
  // the micro-shards.
  std::pair<std::int64_t, std::int64_t> shard_samples(std::int64_t global_batch, int shard) const {
    return require_deterministic("shard_samples").shard_samples(global_batch, shard);
  }

  // One pass of deterministic training: the gradients of the global batch's mean loss, the same
  // bits on every rank and every world size that fits, left in the network's gradients
  // (overwritten, or with `accumulate` added to what they hold, as gradient accumulation does),
  // and that mean loss. `pass(shard)` is called for each of this rank's shards in order, with
  // the gradients zeroed and the buffers as before the call: it runs the shard's forward and
  // backward passes in training mode and returns the shard's mean loss. Dropout masks depend on
  // `pass_number` (the step, or the micro-batch under accumulation) and the shard. Collective.
  // An exception from a pass reaches the caller before any communication, with the buffers and
  // gradients as before the call. Throws InvalidArgument outside deterministic mode.
  template <class Pass>
  double compute_gradients(std::uint64_t pass_number, Pass&& pass, bool accumulate = false) {
    require_idle("compute_gradients");
    DeterministicGradients<Net>& engine = require_deterministic("compute_gradients");
    inside_passes_ = true;
    try {
      const double loss = engine.compute(pass_number, pass, accumulate);
      inside_passes_ = false;
      return loss;
    } catch (...) {
      inside_passes_ = false;
      reset_step();
      throw;
    }
  }

  // ---- helpers on the same communicator, for use between steps (they throw coltrain::Error when
  // called after a synchronised backward pass and before finish_gradient_sync()) ----

  // Whether every rank's gradients are finite, so that all ranks skip a mixed-precision step
  // together (PrecisionOptimizer::unscale_and_check, then apply).
  bool all_finite(bool local_finite) {
    require_idle("all_finite");
    std::int32_t flag = local_finite ? 1 : 0;
    comm_.allreduce(std::span(&flag, 1), comm::ReduceOp::kMin);
    return flag == 1;
  }

  // Whether finish_gradient_sync() leaves bit-identical gradients on every rank: true when every
  // bucket's allreduce computes each element once (coltrain's own algorithms); false under ZeRO-1
  // (each rank holds only its shard) and where MPI's own allreduce runs. Where true, a check of the
  // averaged gradients (finite or not, their norm) gives every rank the same answer without
  // communication, as PyTorch's GradScaler relies on under DDP.
  bool gradients_identical_on_every_rank() const {
    if (deterministic_) return true;
    if (options_.zero_stage != 0) return false;
    for (const std::span<T>& range : ranges_) {
      if (!comm_.allreduce_identical_on_every_rank(range.size() * sizeof(B), options_.algorithm))
        return false;
    }
    return true;
  }

  // Rank 0's parameters and buffers to every rank (the constructor does this; call it again after
  // loading a checkpoint on rank 0 only). Collective.
  void broadcast_parameters_and_buffers() {
    require_idle("broadcast_parameters_and_buffers");
    detail::broadcast_parameters_and_buffers(network_, comm_);
  }

  // Replaces every floating-point buffer (BatchNorm's running_mean and running_var) with its
  // average across ranks, so that evaluation and checkpoints see the same statistics on every
  // rank: each rank's running statistics follow only its own shard. The average of the ranks'
  // running variances, not the variance of the pooled data (docs/data-parallel.md says why). 16-bit
  // buffers are averaged in f32 and rounded once, double buffers in double. Integer buffers
  // (num_batches_tracked) are left alone but must agree: a rank that ran more training-mode
  // forward passes gets a MismatchError naming the buffer and the range across ranks, on every
  // rank, before any buffer has changed. One rank, or deterministic mode (whose passes leave the
  // same buffers on every rank): does nothing. Collective, between steps.
  void average_buffers() {
    require_idle("average_buffers");
    if (world_size_ == 1 || deterministic_) return;
    // Integers as (x, -x) pairs: one kMin gives every rank both the smallest and largest value.
    std::vector<std::int64_t> counts;
    std::vector<std::string> count_names;
    std::vector<std::size_t> count_owner;  // per value: its buffer's index in count_names
    std::vector<float> floats;
    std::vector<double> doubles;
    network_.visit_buffers([&](const std::string& name, auto& buffer) {
      using U = typename std::remove_reference_t<decltype(buffer)>::value_type;
      if constexpr (std::is_same_v<U, double>) {
        doubles.insert(doubles.end(), buffer.span().begin(), buffer.span().end());
      } else if constexpr (std::is_integral_v<U>) {
        count_names.push_back(name);
        for (const U v : buffer.span()) {
          count_owner.push_back(count_names.size() - 1);
          counts.push_back(static_cast<std::int64_t>(v));
          counts.push_back(-static_cast<std::int64_t>(v));
        }
      } else {
        static_assert(std::is_same_v<U, float> || detail::kSixteenBit<U>,
                      "DataParallel::average_buffers: buffers are float, double, half, "
                      "bfloat16 or integers");
        for (const U v : buffer.span()) floats.push_back(static_cast<float>(v));
      }
    });
    detail::require_equal_counts(comm_, counts, count_names, count_owner,
                                 error_context("average_buffers"));
    if (!floats.empty()) comm_.allreduce(std::span<float>(floats), comm::ReduceOp::kAvg);
    if (!doubles.empty()) comm_.allreduce(std::span<double>(doubles), comm::ReduceOp::kAvg);
    std::size_t next_float = 0, next_double = 0;
    network_.visit_buffers([&](const std::string&, auto& buffer) {
      using U = typename std::remove_reference_t<decltype(buffer)>::value_type;
      if constexpr (std::is_same_v<U, double>) {
        for (U& v : buffer.span()) v = doubles[next_double++];
      } else if constexpr (!std::is_integral_v<U>) {
        for (U& v : buffer.span()) v = U(floats[next_float++]);
      }
    });
  }

  Net& network() { return network_; }
  // ZeRO-1: which part of the parameter arena each rank updates.
  ArenaShards shards() const { return ArenaShards(network_.parameter_arena().size(), world_size_); }

 private:
  DeterministicGradients<Net>& require_deterministic(const char* what) {
    if (!deterministic_) throw_not_deterministic(what);
    return *deterministic_;
  }
  const DeterministicGradients<Net>& require_deterministic(const char* what) const {
    if (!deterministic_) throw_not_deterministic(what);
    return *deterministic_;
  }
  [[noreturn]] void throw_not_deterministic(const char* what) const {
    throw InvalidArgument(std::string("DataParallel::") + what +
                              ": only in deterministic mode (DataParallelOptions::micro_shards)",
                          error_context(what));
  }

  // The gradient-ready hook, on the thread running backward().
  void on_gradient_ready(const void* parameter) {
    if (deterministic_) {
      if (inside_passes_) return;  // the fold reduces them afterwards
      throw Error(
          "DataParallel: a backward pass outside compute_gradients() in deterministic mode "
          "(micro_shards); run each shard's passes inside it",
          error_context("gradient-ready report"));
    }
    if (!sync_enabled_) return;
    const std::size_t ready = record_report(parameter);
    if (options_.zero_stage == 0) launch(ready);  // never the last bucket: finish reduces it
  }

  // ZeRO-1's finish_gradient_sync(): the shards' averages, in place (arena_shards.hpp).
  double reduce_scatter_gradients() {
    const Stopwatch watch;
    auto& arena = network_.parameter_arena();
    const ArenaShards shards(arena.size(), world_size_);
    const std::span<T> gradients(arena.gradients(), arena.size());
    try {
      if (world_size_ > 1 && shards.even_end() > 0) {
        comm_.reduce_scatter(gradients.first(shards.even_end()), comm::ReduceOp::kAvg,
                             options_.algorithm);
      }
      if (world_size_ > 1 && shards.tail() > 0) {
        comm_.allreduce(gradients.subspan(shards.even_end()), comm::ReduceOp::kAvg,
                        options_.algorithm);
      }
    } catch (...) {
      reset_step();
      failure_ = "DataParallel: ZeRO-1 reduce-scatter of the gradients (" +
                 std::to_string(arena.size() * sizeof(T)) + " bytes) failed";
      detail::rethrow_with_context(std::current_exception(), failure_ + ": ", rank_);
    }
    last_sync_ = {1, 0, 0, watch.seconds()};
    reset_step();
    return last_sync_.wait_seconds;
  }

  // Issues the allreduce of buckets [next_launch_, end).
  void launch(std::size_t end) {
    for (; next_launch_ < end; ++next_launch_) {
      pack_bucket(next_launch_);
      requests_[next_launch_] =
          comm_.iallreduce(bucket_elements(next_launch_), comm::ReduceOp::kAvg, options_.algorithm,
                           options_.compression);
    }
  }

  // What bucket b's allreduce averages: its range of the gradient arena, or the f32 buffer that
  // holds it widened.
  std::span<B> bucket_elements(std::size_t b) {
    if constexpr (kInPlace) {
      return ranges_[b];
    } else {
      return std::span<B>(buffers_[b]);
    }
  }

  // 16-bit gradients: the bucket's range widened into its f32 buffer, and the averages back.
  void pack_bucket(std::size_t b) {
    if constexpr (!kInPlace) {
      std::transform(ranges_[b].begin(), ranges_[b].end(), buffers_[b].begin(),
                     [](T g) { return static_cast<B>(g); });
    }
  }
  void unpack_bucket(std::size_t b) {
    if constexpr (!kInPlace) {
      std::transform(buffers_[b].begin(), buffers_[b].end(), ranges_[b].begin(),
                     [](B v) { return T(v); });
    }
  }

  Net& network_;
  // Fixed at construction; buckets belong to their requests while in flight.
  std::vector<std::span<T>> ranges_;     // by bucket: its gradients, in the network's arena
  std::vector<std::vector<B>> buffers_;  // by bucket, 16-bit gradients only: the f32 copy
  std::optional<DeterministicGradients<Net>> deterministic_;  // in deterministic mode
  bool inside_passes_ = false;  // compute_gradients() is running its passes
};

}  // namespace coltrain::train
