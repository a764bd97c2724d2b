#pragma once
// Precision policies and the optimizer wrapper that applies them.
//
// A policy is a type naming how a model stores its parameters and what a training step needs
// around the optimizer: fp32 master weights (16-bit storage cannot accumulate small updates: an
// update below half an ulp of the value is lost) and loss scaling (fp16's narrow exponent flushes
// small gradients to zero; bf16 has float's exponent and does not need it). The optimizer computes
// in master_t<Policy>: double for double storage (Fp64), float for every other.
//
// PrecisionOptimizer<Policy, Optimizer> runs a step in two halves so that data-parallel callers can
// agree on skipping it in between:
//
//   bool finite = trainer.unscale_and_check();    // grads -> fp32, / loss scale, local check
//   finite = allreduce_and(finite);               // every rank must take the same decision
//   bool taken = trainer.apply(finite, schedule(step));
//
// step(lr) is both halves for a single process.
//
// export_state() and import_state() move the optimizer's state (moments, step counts, fp32
// masters, loss scale) in and out as an OptimizerSnapshot: host vectors under PyTorch's state
// names, the form checkpoints are written from and read into, and the one the device optimizer
// (cuda/optim/device_optimizer.cuh) exports and imports too, so that state moves between them.

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/thread_pool.hpp>
#include <coltrain/optim/element_shares.hpp>
#include <coltrain/optim/loss_scaler.hpp>
#include <coltrain/optim/parameter_ref.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::optim {

// Parameters, gradients and optimizer all in float.
struct Fp32 {
  using Storage = float;
  static constexpr bool kMasterWeights = false;
  static constexpr bool kLossScaling = false;
  static constexpr std::string_view kName = "fp32";
};

// fp16 parameters and gradients, fp32 master weights and optimizer, dynamic loss scaling (as
// torch.cuda.amp with GradScaler, or Apex O2).
struct MixedFp16 {
  using Storage = half;
  static constexpr bool kMasterWeights = true;
  static constexpr bool kLossScaling = true;
  static constexpr std::string_view kName = "fp16";
};

// bf16 parameters and gradients, fp32 master weights and optimizer, no loss scaling.
struct MixedBf16 {
  using Storage = bfloat16;
  static constexpr bool kMasterWeights = true;
  static constexpr bool kLossScaling = false;
  static constexpr std::string_view kName = "bf16";
};

// Parameters, gradients and optimizer all in double: long parity runs against a float64 PyTorch
// model, where float32's rounding would make two correct runs drift apart within a few steps.
struct Fp64 {
  using Storage = double;
  static constexpr bool kMasterWeights = false;
  static constexpr bool kLossScaling = false;
  static constexpr std::string_view kName = "fp64";
};

namespace detail {

template <class P>
concept HasPrecisionMembers = requires {
  typename P::Storage;
  { P::kMasterWeights } -> std::convertible_to<bool>;
  { P::kLossScaling } -> std::convertible_to<bool>;
  { P::kName } -> std::convertible_to<std::string_view>;
};

template <class T>
inline constexpr bool kIsParameterStorage =
    std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

}  // namespace detail

// Storage is float, half or bfloat16, whose optimizers work in float, so a 16-bit storage needs
// master weights; or double, which needs neither master weights nor loss scaling.
template <class P>
concept PrecisionPolicy = detail::HasPrecisionMembers<P> &&
    ((detail::kIsParameterStorage<typename P::Storage> &&
      (std::is_same_v<typename P::Storage, float> || P::kMasterWeights)) ||
     (std::is_same_v<typename P::Storage, double> && !P::kMasterWeights && !P::kLossScaling));

// The type a policy's optimizer computes in, and its master weights are kept in.
template <PrecisionPolicy P>
using master_t = std::conditional_t<std::is_same_v<typename P::Storage, double>, double, float>;

// What PrecisionOptimizer needs of an optimizer (Sgd, Adam, AdamW, or their Basic*<double>): a
// step over parameters of its value_type.
template <class O>
concept ParamOptimizer =
    requires(O& optimizer, std::span<const MasterParamRef<typename O::value_type>> params,
             double lr) { optimizer.step(params, lr); };

// A host copy of a precision optimizer's state, named as a checkpoint names it, in the type the
// optimizer computes in (OptimizerSnapshot: float). Exported and imported by PrecisionOptimizer
// (CPU) and DevicePrecisionOptimizer (GPU) alike.
template <class T>
struct BasicOptimizerSnapshot {
  struct Tensor {
    std::string name;
    std::vector<T> values;
  };
  // The optimizer's state tensors in its for_each_state order: "<parameter>.momentum_buffer"
  // (SGD with momentum) or "<parameter>.exp_avg" and ".exp_avg_sq" (Adam, AdamW). Empty before
  // the first step taken, and always for SGD without momentum.
  std::vector<Tensor> state;
  // Adam's and AdamW's per-parameter step counts, "<parameter>.step", with the state.
  std::vector<std::pair<std::string, std::int64_t>> step_counts;
  // With master weights: the fp32 master of every parameter, named as the parameter.
  std::vector<Tensor> masters;
  // With loss scaling: the scaler's scale and growth tracker.
  std::optional<DynamicLossScaler::State> loss_scale;
  // Counters the device optimizer keeps and the CPU one does not: steps taken and steps skipped
  // for non-finite gradients; nullopt where unknown. They change no arithmetic.
  std::optional<std::int64_t> steps_taken;
  std::optional<std::int64_t> steps_skipped;
};

using OptimizerSnapshot = BasicOptimizerSnapshot<float>;

namespace detail {

template <class O>
concept HasStepCounts = requires(O& o) {
  o.for_each_step([](const std::string&, std::int64_t&) {});
};

// Whether the optimizer holds state (it does from its first step, or after a state import).
template <class O>
bool has_optimizer_state(const O& optimizer) {
  bool any = false;
  optimizer.for_each_state([&](const std::string&, auto) { any = true; });
  return any;
}

// A snapshot's tensors by name, for an import to take each exactly once; InvalidArgument naming
// the tensor for a duplicate, a missing one, a wrong size, or one left over.
template <class Tensor>
class SnapshotIndex {
 public:
  using Value = typename decltype(Tensor::values)::value_type;

  SnapshotIndex(const std::vector<Tensor>& tensors, std::string what) : what_(std::move(what)) {
    for (const Tensor& t : tensors) {
      if (!by_name_.emplace(t.name, &t).second) {
        throw InvalidArgument("the " + what_ + " hold tensor '" + t.name + "' twice");
      }
    }
  }

  std::span<const Value> take(const std::string& name, std::size_t size) {
    const auto found = by_name_.find(name);
    if (found == by_name_.end()) {
      throw InvalidArgument("the " + what_ + " lack tensor '" + name + "'");
    }
    const std::vector<Value>& values = found->second->values;
    if (values.size() != size) {
      throw InvalidArgument("tensor '" + name + "' of the " + what_ + " has " +
                            std::to_string(values.size()) + " elements, expected " +
                            std::to_string(size));
    }
    by_name_.erase(found);
    return values;
  }

  void check_all_taken() const {
    if (!by_name_.empty()) {
      throw InvalidArgument("the " + what_ + " hold tensor '" + by_name_.begin()->first +
                            "', which this optimizer does not have (" +
                            std::to_string(by_name_.size()) + " left over)");
    }
  }

 private:
  std::string what_;
  std::map<std::string, const Tensor*, std::less<>> by_name_;
};

// The step count `name` of a snapshot; InvalidArgument if it is missing or negative.
template <class T>
std::int64_t snapshot_step_count(const BasicOptimizerSnapshot<T>& snapshot,
                                 const std::string& name) {
  for (const auto& [key, count] : snapshot.step_counts) {
    if (key != name) continue;
    if (count < 0) {
      throw InvalidArgument("the snapshot's step count '" + name + "' is negative (" +
                            std::to_string(count) + ")");
    }
    return count;
  }
  throw InvalidArgument("the snapshot has no step count '" + name + "'");
}

}  // namespace detail

template <PrecisionPolicy Precision, ParamOptimizer Optimizer>
class PrecisionOptimizer {
 public:
  using Storage = typename Precision::Storage;
  using Master = master_t<Precision>;
  using Param = TypedParamRef<Storage>;
  using MasterParam = MasterParamRef<Master>;
  using Snapshot = BasicOptimizerSnapshot<Master>;

  static_assert(std::is_same_v<typename Optimizer::value_type, Master>,
                "PrecisionOptimizer: the optimizer must compute in the policy's master_t: "
                "BasicSgd<double>, BasicAdam<double> or BasicAdamW<double> under Fp64, and Sgd, "
                "Adam or AdamW (float) under the others");

  // The views must stay valid for the lifetime of this object. With master weights, the fp32
  // copies are taken now: load a checkpoint into the model before constructing, or into
  // master_weights() afterwards. Throws InvalidArgument naming a parameter whose values and
  // gradients differ in size.
  PrecisionOptimizer(std::span<const Param> params, Optimizer optimizer,
                     DynamicLossScaler::Options scaler_options = {})
      : params_(params.begin(), params.end()),
        optimizer_(std::move(optimizer)),
        scaler_(scaler_options) {
    for (std::size_t p = 0; p < params_.size(); ++p) check_param_ref(params_[p], p);
    refs_.reserve(params_.size());
    if constexpr (Precision::kMasterWeights) {
      master_values_.resize(params_.size());
      master_grads_.resize(params_.size());
      for (std::size_t p = 0; p < params_.size(); ++p) {
        const Param& param = params_[p];
        master_values_[p].resize(param.value.size());
        master_grads_[p].resize(param.grad.size());
        for (std::size_t i = 0; i < param.value.size(); ++i) {
          master_values_[p][i] = static_cast<Master>(param.value[i]);
        }
        refs_.push_back({param.name, std::span<Master>(master_values_[p]), master_grads_[p],
                         param.weight_decay});
      }
    } else {
      for (const Param& param : params_) {
        refs_.push_back({param.name, param.value, param.grad, param.weight_decay});
      }
    }
  }

  // refs_ points into params_ and the master buffers: moving keeps those addresses, copying would
  // not.
  PrecisionOptimizer(const PrecisionOptimizer&) = delete;
  PrecisionOptimizer& operator=(const PrecisionOptimizer&) = delete;
  PrecisionOptimizer(PrecisionOptimizer&&) = default;
  PrecisionOptimizer& operator=(PrecisionOptimizer&&) = default;

  // First half of a step: brings the gradients to the master type (into the master gradients, or in
  // place for float and double storage) divided by the loss scale when scaling, and returns whether
  // all of this rank's gradients are finite. Throws coltrain::Error if called twice without apply()
  // in between (the second call would unscale in-place gradients twice).
  bool unscale_and_check() {
    if (unscaled_) {
      throw Error("PrecisionOptimizer: unscale_and_check() called twice without apply()");
    }
    const float inv_scale = inverse_loss_scale();
    std::atomic<bool> all_finite{true};
    detail::for_each_element_share(
        std::span<const Param>(params_), threads_,
        [&](std::size_t p, std::size_t begin, std::size_t end) {
          const std::span<const Storage> grad = params_[p].grad.subspan(begin, end - begin);
          bool finite = true;
          if constexpr (Precision::kMasterWeights) {
            finite = optim::unscale_and_check(
                grad, std::span<Master>(master_grads_[p]).subspan(begin, end - begin), inv_scale);
          } else if constexpr (Precision::kLossScaling) {
            finite = optim::unscale_and_check(grad, params_[p].grad.subspan(begin, end - begin),
                                              inv_scale);
          } else {
            for (const Storage g : grad) finite &= std::isfinite(g);
          }
          if (!finite) all_finite.store(false, std::memory_order_relaxed);
        });
    const bool finite = all_finite.load(std::memory_order_relaxed);
    unscaled_ = true;
    return finite;
  }

  // Second half: all_finite is unscale_and_check's result, reduced across ranks by the caller.
  // Updates the loss scale (when scaling); on non-finite gradients skips the step, leaving values
  // and optimizer state untouched, for every policy; otherwise steps the optimizer at lr and, with
  // master weights, rounds the masters into the model's values. Returns whether the step was
  // taken. Throws coltrain::Error without unscale_and_check() first, InvalidArgument for a negative
  // or NaN lr (before anything changes).
  bool apply(bool all_finite, double lr) {
    if (!unscaled_) throw Error("PrecisionOptimizer: apply() needs unscale_and_check() first");
    detail::check_lr(lr, "PrecisionOptimizer");
    unscaled_ = false;
    if (all_finite) {
      if constexpr (requires {
                      optimizer_.step(std::span<const MasterParam>(refs_), lr, threads_);
                    })
        optimizer_.step(std::span<const MasterParam>(refs_), lr, threads_);
      else
        optimizer_.step(std::span<const MasterParam>(refs_), lr);
      if constexpr (Precision::kMasterWeights) round_masters_into_model();
    }
    if constexpr (Precision::kLossScaling) scaler_.update(!all_finite);
    return all_finite;
  }

  // Both halves, for a single process.
  bool step(double lr) { return apply(unscale_and_check(), lr); }

  // Between the halves: the sum of the squares of the gradients the optimizer will step with
  // (unscaled), for clipping by their norm (optim/gradient_clipping.hpp). Throws coltrain::Error
  // before unscale_and_check().
  double gradient_sum_of_squares() const {
    if (!unscaled_)
      throw Error("PrecisionOptimizer: gradient_sum_of_squares() needs unscale_and_check() first");
    double sum = 0;
    for (const MasterParam& ref : refs_)
      for (const Master g : ref.grad) sum += static_cast<double>(g) * static_cast<double>(g);
    return sum;
  }

  // `sum` plus the squares of `grads` (the model's, in the storage type) as unscale_and_check()
  // would bring them to the master type now, added one by one in order: gradient_sum_of_squares()'s
  // bits for gradients this optimizer does not hold, as a ZeRO-1 shard's optimizer needs for a
  // norm over every rank's gradients (train/optimizer_sharding.hpp, deterministic mode).
  double add_unscaled_squares(double sum, std::span<const Storage> grads) const {
    const float inv_scale = inverse_loss_scale();
    for (const Storage g : grads) {
      Master master;
      if constexpr (Precision::kMasterWeights || Precision::kLossScaling)
        master = static_cast<Master>(static_cast<float>(g) * inv_scale);  // as unscale_and_check
      else
        master = g;
      sum += static_cast<double>(master) * static_cast<double>(master);
    }
    return sum;
  }

  // Between the halves: multiplies the gradients the optimizer will step with by `factor`, rounded
  // to the master type (clipping). Throws coltrain::Error before unscale_and_check().
  void scale_gradients(double factor) {
    if (!unscaled_)
      throw Error("PrecisionOptimizer: scale_gradients() needs unscale_and_check() first");
    const Master rounded = static_cast<Master>(factor);
    for (std::size_t p = 0; p < params_.size(); ++p) {
      std::span<Master> grad;
      if constexpr (Precision::kMasterWeights)
        grad = master_grads_[p];
      else
        grad = params_[p].grad;
      for (Master& g : grad) g *= rounded;
    }
  }

  // Runs the elementwise passes of a step (unscaling and checking, the update, rounding the
  // masters into the model) on `pool`'s threads too, with the same bits: pass the network's
  // (network.context().pool(); the Trainer does). The pool must outlive this object; nullptr,
  // the default, steps on the calling thread alone.
  void use_threads(ThreadPool* pool) { threads_ = pool; }

  // The factor to multiply the loss by before the backward pass; 1 without loss scaling.
  float loss_scale() const {
    if constexpr (Precision::kLossScaling) {
      return scaler_.scale();
    } else {
      return 1.0f;
    }
  }

  const Optimizer& optimizer() const { return optimizer_; }
  Optimizer& optimizer() { return optimizer_; }

  const DynamicLossScaler& scaler() const requires Precision::kLossScaling { return scaler_; }
  DynamicLossScaler& scaler() requires Precision::kLossScaling { return scaler_; }

  std::size_t size() const { return params_.size(); }

  // The state_dict name of parameter `index`, as the optimizer's state is keyed.
  const std::string& parameter_name(std::size_t index) const { return params_.at(index).name; }

  // For loading a checkpoint: creates the optimizer's state for these parameters (zeros, the state
  // a first step starts from), for optimizer().for_each_state (and for_each_step) to fill.
  void allocate_optimizer_state() requires requires(Optimizer& o, std::span<const MasterParam> p) {
    o.allocate_state(p);
  }
  { optimizer_.allocate_state(std::span<const MasterParam>(refs_)); }

  // The fp32 master copy of parameter `index`. After writing into it (a checkpoint), call
  // round_masters_into_model().
  std::span<const Master> master_weights(
      std::size_t index) const requires Precision::kMasterWeights {
    return master_values_.at(index);
  }
  std::span<Master> master_weights(std::size_t index) requires Precision::kMasterWeights {
    return master_values_.at(index);
  }

  void round_masters_into_model() requires Precision::kMasterWeights {
    detail::for_each_element_share(std::span<const Param>(params_), threads_,
                                   [&](std::size_t p, std::size_t begin, std::size_t end) {
                                     Storage* value = params_[p].value.data();
                                     const Master* master = master_values_[p].data();
                                     for (std::size_t i = begin; i < end; ++i)
                                       value[i] = Storage(master[i]);
                                   });
  }

  // Forgets an unscale_and_check() whose apply() will not come: a collective between them failed,
  // and elastic training takes the state from another rank (train/elastic.hpp).
  void abandon_step() { unscaled_ = false; }

  // A copy of the optimizer's state (see OptimizerSnapshot); steps_taken and steps_skipped stay
  // unknown, as this optimizer does not count them.
  Snapshot export_state() const {
    Snapshot snapshot;
    optimizer_.for_each_state([&](const std::string& name, std::span<const Master> values) {
      snapshot.state.push_back({name, std::vector<Master>(values.begin(), values.end())});
    });
    if constexpr (detail::HasStepCounts<Optimizer>) {
      optimizer_.for_each_step([&](const std::string& name, const std::int64_t& step) {
        snapshot.step_counts.emplace_back(name, step);
      });
    }
    if constexpr (Precision::kMasterWeights) {
      for (std::size_t p = 0; p < params_.size(); ++p) {
        snapshot.masters.push_back({params_[p].name, master_values_[p]});
      }
    }
    if constexpr (Precision::kLossScaling) snapshot.loss_scale = scaler_.state();
    return snapshot;
  }

  // Restores a snapshot of an optimizer over the same parameters (names and sizes), built with
  // the same policy and optimizer type, exported here or by the device optimizer. Leaves the
  // model's values alone: a checkpoint restores them, equal to the rounded masters. Throws
  // InvalidArgument, before anything changes, naming the tensor or setting that does not fit,
  // and for a snapshot without state into an optimizer that has taken steps (import into a fresh
  // one); coltrain::Error between unscale_and_check() and apply().
  void import_state(const Snapshot& snapshot) {
    if (unscaled_) {
      throw Error("PrecisionOptimizer: import_state() between unscale_and_check() and apply()");
    }
    const bool has_state = !snapshot.state.empty();
    if (!has_state && detail::has_optimizer_state(optimizer_)) {
      throw InvalidArgument(
          "PrecisionOptimizer: the snapshot has no optimizer state but this optimizer has taken "
          "steps; import into a freshly constructed one");
    }
    // Filled on a copy, so that a misfit found halfway leaves this optimizer as it was.
    Optimizer next = optimizer_;
    if (has_state) {
      if constexpr (requires(Optimizer& o, std::span<const MasterParam> p) {
                      o.allocate_state(p);
                    }) {
        next.allocate_state(std::span<const MasterParam>(refs_));
      }
      detail::SnapshotIndex state(snapshot.state, "snapshot's optimizer state");
      next.for_each_state([&](const std::string& name, std::span<Master> values) {
        std::ranges::copy(state.take(name, values.size()), values.begin());
      });
      state.check_all_taken();
    }
    std::size_t counts_used = 0;
    if constexpr (detail::HasStepCounts<Optimizer>) {
      next.for_each_step([&](const std::string& name, std::int64_t& step) {
        step = detail::snapshot_step_count(snapshot, name);
        ++counts_used;
      });
    }
    if (snapshot.step_counts.size() != counts_used) {
      throw InvalidArgument("the snapshot has " + std::to_string(snapshot.step_counts.size()) +
                            " step counts, this optimizer keeps " + std::to_string(counts_used));
    }
    std::vector<std::span<const Master>> masters;
    if constexpr (Precision::kMasterWeights) {
      detail::SnapshotIndex index(snapshot.masters, "snapshot's master weights");
      for (std::size_t p = 0; p < params_.size(); ++p) {
        masters.push_back(index.take(params_[p].name, master_values_[p].size()));
      }
      index.check_all_taken();
    } else if (!snapshot.masters.empty()) {
      throw InvalidArgument("the snapshot has fp32 master weights; the precision " +
                            std::string(Precision::kName) + " keeps none");
    }
    DynamicLossScaler scaler = scaler_;
    if constexpr (Precision::kLossScaling) {
      if (!snapshot.loss_scale) throw InvalidArgument("the snapshot has no loss-scaler state");
      scaler.set_state(*snapshot.loss_scale);
    } else if (snapshot.loss_scale) {
      throw InvalidArgument("the snapshot has loss-scaler state; the precision " +
                            std::string(Precision::kName) + " scales no loss");
    }

    optimizer_ = std::move(next);
    for (std::size_t p = 0; p < masters.size(); ++p) {
      std::ranges::copy(masters[p], master_values_[p].begin());
    }
    scaler_ = scaler;
  }

 private:
  // What unscale_and_check() multiplies the gradients by: 1 without loss scaling.
  float inverse_loss_scale() const {
    if constexpr (Precision::kLossScaling)
      return static_cast<float>(1.0 / static_cast<double>(scaler_.scale()));
    else
      return 1.0f;
  }

  std::vector<Param> params_;
  std::vector<std::vector<Master>> master_values_;
  std::vector<std::vector<Master>> master_grads_;
  std::vector<MasterParam> refs_;  // what the optimizer steps: masters, or the model itself
  Optimizer optimizer_;
  DynamicLossScaler scaler_;  // unused without loss scaling; kept so the layout is uniform
  ThreadPool* threads_ = nullptr;
  bool unscaled_ = false;
};

}  // namespace coltrain::optim
