#pragma once
// DevicePrecisionOptimizer<Policy, Optimizer>: optim::PrecisionOptimizer on the GPU, for a model
// whose parameters live in device memory. Same policies (Fp32, MixedFp16, MixedBf16), optimizers
// (Sgd, Adam, AdamW, with their Options) and loss-scaling state machine, the same two halves:
//
//   opt.unscale_and_check();            // one multi-tensor launch: grads / scale, finite?
//   allreduce_max(opt.found_inf());     // data-parallel: a device int32, 1 if any rank overflowed
//   opt.apply();                        // a one-thread kernel (scaler, step counts) and one
//                                       // multi-tensor launch: update masters, write the 16-bit
//                                       // copy into the model, zero the gradients
//
// Every step runs on the device without the host reading anything, so both halves can be captured
// into a CUDA graph. The loss scale, the skip decision, Adam's step count and bias corrections live
// in device memory; the loss kernel reads the scale from loss_scale_device(). The learning rate is
// a pinned host value that apply() copies to the device when the step runs (a graph replays that
// copy), so set_lr() between replays takes effect; it waits only if the previous step has not yet
// read its rate.
//
// The arithmetic is the CPU optimizers', operation for operation, each rounded separately
// (__fmul_rn and friends: no FMA contraction), so the results equal the CPU's bit for bit up to
// Adam's bias corrections (pow in double: the device's may differ from libm's in the last bit).
//
// export_state() and import_state() copy the whole state (masters, moments, step count, loss
// scaler) to and from the host as an OptimizerSnapshot, the form PrecisionOptimizer exports and
// checkpoints are written from (coltrain/cuda/train/checkpoint.cuh), so that a run moves between
// the GPU and the CPU exactly.

#if !defined(__CUDACC__)
#error "coltrain/cuda/optim/device_optimizer.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/cast.cuh>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/cuda/launch.cuh>
#include <coltrain/cuda/optim/multi_tensor.cuh>
#include <coltrain/optim/adam.hpp>
#include <coltrain/optim/loss_scaler.hpp>
#include <coltrain/optim/parameter_ref.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/optim/sgd.hpp>
#include <coltrain/tensor/cuda_storage.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace coltrain::optim {

// A parameter in device memory, in the model's storage type.
template <class T>
struct DeviceParamRef {
  std::string name;
  T* value = nullptr;
  T* grad = nullptr;
  std::size_t size = 0;
  bool weight_decay = true;
};

// Every parameter of a network on the device (nn::Network<Spec, T, tensor::Cuda>), in state_dict
// order, as parameters_of does for the host.
template <class Network>
std::vector<DeviceParamRef<typename Network::value_type>> device_parameters_of(Network& network) {
  std::vector<DeviceParamRef<typename Network::value_type>> refs;
  network.visit_parameters([&](const std::string& name, auto& parameter) {
    refs.push_back({name, parameter.value.data(), parameter.grad.data(),
                    static_cast<std::size_t>(parameter.value.numel())});
  });
  return refs;
}

struct DeviceOptimizerOptions {
  // The update launch also sets the model's gradients to zero (every step, skipped or not), which
  // saves the network's zero_grad pass over them.
  bool zero_grads = true;
};

namespace detail {

enum class DeviceAlgorithm { kSgd, kAdam };

template <class O>
inline constexpr bool kIsAdam = std::is_same_v<O, Adam> || std::is_same_v<O, AdamW>;

// The device-resident state of a step.
struct DeviceStepState {
  double lr;                    // copied from the host's pinned value by each apply()
  float scale;                  // loss scale (1 without loss scaling)
  float inv_scale;              // what unscale_and_check divided by, for the update
  std::int64_t growth_tracker;  // DynamicLossScaler's
  std::int64_t steps_skipped;
  std::int64_t step;            // optimizer steps taken (Adam's t; SGD's momentum exists)
  std::int32_t found_inf;       // set by unscale_and_check; the flag ranks reduce
  std::int32_t take;            // this step updates the parameters
  std::int32_t first;           // this is the first step taken (SGD copies into its buffer)
  float neg_lr;                 // SGD: -lr
  float neg_step_size;          // Adam: -lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // Adam: sqrt(1 - beta2^t)
  float shrink;                 // AdamW: 1 - lr * weight_decay
};

struct DeviceHyperparameters {
  double growth_factor;
  double backoff_factor;
  std::int64_t growth_interval;
  double weight_decay;  // as given, for AdamW's shrink
  float weight_decay_f;
  // SGD
  bool has_momentum;  // momentum != 0 (in double, as the CPU tests it)
  float momentum;
  float blend;  // 1 - dampening
  bool nesterov;
  // Adam
  double beta1;
  double beta2;
  float beta1_f;
  float beta2_f;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  bool decoupled;
};

template <bool kLossScaling, DeviceAlgorithm kAlgorithm>
__global__ void begin_apply_kernel(DeviceStepState* s, DeviceHyperparameters h) {
  const bool found_inf = s->found_inf != 0;
  s->inv_scale = kLossScaling ? static_cast<float>(1.0 / static_cast<double>(s->scale)) : 1.0f;
  if constexpr (kLossScaling) {  // DynamicLossScaler::update
    if (found_inf) {
      s->scale = static_cast<float>(static_cast<double>(s->scale) * h.backoff_factor);
      s->growth_tracker = 0;
    } else if (s->growth_tracker + 1 == h.growth_interval) {
      const float grown = static_cast<float>(static_cast<double>(s->scale) * h.growth_factor);
      if (isfinite(grown)) s->scale = grown;
      s->growth_tracker = 0;
    } else {
      s->growth_tracker += 1;
    }
  }
  s->take = found_inf ? 0 : 1;
  if (found_inf) {
    s->steps_skipped += 1;
    return;
  }
  s->first = s->step == 0 ? 1 : 0;
  s->step += 1;
  const double lr = s->lr;
  if constexpr (kAlgorithm == DeviceAlgorithm::kSgd) {
    s->neg_lr = static_cast<float>(-lr);
  } else {
    const double t = static_cast<double>(s->step);
    const double bias_correction1 = 1.0 - pow(h.beta1, t);
    const double bias_correction2 = 1.0 - pow(h.beta2, t);
    s->neg_step_size = static_cast<float>(-(lr / bias_correction1));
    s->bias_correction2_sqrt = static_cast<float>(sqrt(bias_correction2));
    s->shrink = static_cast<float>(1.0 - lr * h.weight_decay);
  }
}

template <class Storage, bool kLossScaling>
struct CheckFinite {
  float inv_scale;
  bool* bad;
  template <int V>
  __device__ void apply(const cuda::TensorSlot<Storage>& slot, std::int64_t i) const {
    const cuda::detail::Pack<Storage, V> g = cuda::detail::load<V>(slot.grad + i);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float value = static_cast<float>(g.v[k]);
      *bad |= !isfinite(kLossScaling ? value * inv_scale : value);
    }
  }
};

template <class Storage, bool kLossScaling>
__global__ void __launch_bounds__(cuda::kThreadsPerBlock)
    check_finite_kernel(const cuda::TensorSlot<Storage>* slots, const cuda::TensorChunk* chunks,
                        int chunk_count, DeviceStepState* s) {
  const float inv_scale =
      kLossScaling ? static_cast<float>(1.0 / static_cast<double>(s->scale)) : 1.0f;
  bool bad = false;
  const CheckFinite<Storage, kLossScaling> op{inv_scale, &bad};
  cuda::detail::for_each_chunk_element<cuda::detail::kVectorWidth<Storage>>(slots, chunks,
                                                                            chunk_count, op);
  if (__syncthreads_or(bad) && threadIdx.x == 0) s->found_inf = 1;
}

// One element's update, as the CPU optimizers compute it (see optim/sgd.hpp and optim/adam.hpp).
template <DeviceAlgorithm kAlgorithm>
__device__ __forceinline__ float update_element(float w, float g, float& s1, float& s2, bool decay,
                                                const DeviceHyperparameters& h,
                                                const DeviceStepState& s) {
  if constexpr (kAlgorithm == DeviceAlgorithm::kSgd) {
    float d = g;
    if (decay) d = __fadd_rn(d, __fmul_rn(h.weight_decay_f, w));
    if (h.has_momentum) {
      s1 = s.first ? d : __fadd_rn(__fmul_rn(s1, h.momentum), __fmul_rn(h.blend, d));
      d = h.nesterov ? __fadd_rn(d, __fmul_rn(h.momentum, s1)) : s1;
    }
    return __fadd_rn(w, __fmul_rn(s.neg_lr, d));
  } else {
    if (decay && !h.decoupled) g = __fadd_rn(g, __fmul_rn(h.weight_decay_f, w));
    if (decay && h.decoupled) w = __fmul_rn(w, s.shrink);
    s1 = __fadd_rn(__fmul_rn(s1, h.beta1_f), __fmul_rn(h.one_minus_beta1, g));
    s2 = __fadd_rn(__fmul_rn(s2, h.beta2_f), __fmul_rn(__fmul_rn(h.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(s2), s.bias_correction2_sqrt), h.eps);
    return __fadd_rn(w, __fdiv_rn(__fmul_rn(s.neg_step_size, s1), denom));
  }
}

template <class Storage, bool kMasterWeights, bool kLossScaling, DeviceAlgorithm kAlgorithm>
struct Update {
  DeviceStepState s;
  DeviceHyperparameters h;
  bool zero_grads;
  bool has_state1;
  bool has_state2;

  template <int V>
  __device__ void apply(const cuda::TensorSlot<Storage>& slot, std::int64_t i) const {
    using cuda::detail::load;
    using cuda::detail::Pack;
    using cuda::detail::store;
    Pack<Storage, V> grad = load<V>(slot.grad + i);
    if (s.take) {
      Pack<float, V> w;
      if constexpr (kMasterWeights) {
        w = load<V>(slot.master + i);
      } else {
        w = load<V>(slot.value + i);  // Storage is float
      }
      Pack<float, V> s1{}, s2{};  // unused ones stay zero
      if (has_state1) s1 = load<V>(slot.state1 + i);
      if (has_state2) s2 = load<V>(slot.state2 + i);
      const bool decay = h.weight_decay_f != 0.0f && slot.weight_decay != 0;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        float g = static_cast<float>(grad.v[k]);
        if constexpr (kMasterWeights || kLossScaling) g = __fmul_rn(g, s.inv_scale);
        w.v[k] = update_element<kAlgorithm>(w.v[k], g, s1.v[k], s2.v[k], decay, h, s);
      }
      if (has_state1) store<V>(slot.state1 + i, s1);
      if (has_state2) store<V>(slot.state2 + i, s2);
      if constexpr (kMasterWeights) {
        store<V>(slot.master + i, w);
        Pack<Storage, V> rounded;
#pragma unroll
        for (int k = 0; k < V; ++k) rounded.v[k] = Storage(w.v[k]);
        store<V>(slot.value + i, rounded);
      } else {
        store<V>(slot.value + i, w);
      }
    }
    if (zero_grads) {
#pragma unroll
      for (int k = 0; k < V; ++k) grad.v[k] = Storage(0.0f);
      store<V>(slot.grad + i, grad);
    } else if constexpr (kLossScaling && !kMasterWeights) {
      // In-place unscaling, as the CPU policy leaves the gradients (GradScaler.unscale_).
#pragma unroll
      for (int k = 0; k < V; ++k)
        grad.v[k] = Storage(__fmul_rn(static_cast<float>(grad.v[k]), s.inv_scale));
      store<V>(slot.grad + i, grad);
    }
  }
};

template <class Storage, bool kMasterWeights, bool kLossScaling, DeviceAlgorithm kAlgorithm>
__global__ void __launch_bounds__(cuda::kThreadsPerBlock)
    update_kernel(const cuda::TensorSlot<Storage>* slots, const cuda::TensorChunk* chunks,
                  int chunk_count, const DeviceStepState* state, DeviceHyperparameters h,
                  bool zero_grads, bool has_state1, bool has_state2) {
  const Update<Storage, kMasterWeights, kLossScaling, kAlgorithm> op{*state, h, zero_grads,
                                                                     has_state1, has_state2};
  if (!op.s.take && !zero_grads && !(kLossScaling && !kMasterWeights)) return;
  cuda::detail::for_each_chunk_element<cuda::detail::kVectorWidth<Storage>>(slots, chunks,
                                                                            chunk_count, op);
}

}  // namespace detail

template <PrecisionPolicy Precision, class Optimizer>
class DevicePrecisionOptimizer {
  static_assert(std::is_same_v<Optimizer, Sgd> || detail::kIsAdam<Optimizer>,
                "coltrain::optim::DevicePrecisionOptimizer runs Sgd, Adam or AdamW");
  static constexpr detail::DeviceAlgorithm kAlgorithm =
      detail::kIsAdam<Optimizer> ? detail::DeviceAlgorithm::kAdam : detail::DeviceAlgorithm::kSgd;

 public:
  using Storage = typename Precision::Storage;
  using Param = DeviceParamRef<Storage>;

  // The parameters must stay allocated for the lifetime of this object; all work goes on
  // `stream`. With master weights, the fp32 copies are taken now (synchronously). Throws
  // InvalidArgument for invalid options (as the CPU optimizer and scaler) or a parameter without
  // memory.
  DevicePrecisionOptimizer(std::span<const Param> params, Optimizer optimizer, cudaStream_t stream,
                           DynamicLossScaler::Options scaler_options = {},
                           DeviceOptimizerOptions options = {})
      : params_(params.begin(), params.end()),
        optimizer_(std::move(optimizer)),
        scaler_options_(DynamicLossScaler(scaler_options).options()),
        options_(options),
        stream_(stream),
        state_(1),
        lr_host_(1) {
    *lr_host_.data() = optimizer_.options().lr;
    build_table();
    upload_initial_state();
    cudaEvent_t event = nullptr;
    COLTRAIN_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    lr_read_.reset(event);
  }

  // From a network on the device, on its context's stream.
  template <class Network>
  requires requires(Network& n) { n.context().stream(); }
  DevicePrecisionOptimizer(Network& network, Optimizer optimizer,
                           DynamicLossScaler::Options scaler_options = {},
                           DeviceOptimizerOptions options = {})
      : DevicePrecisionOptimizer(std::span<const Param>(device_parameters_of(network)),
                                 std::move(optimizer), network.context().stream(), scaler_options,
                                 options) {}

  DevicePrecisionOptimizer(const DevicePrecisionOptimizer&) = delete;
  DevicePrecisionOptimizer& operator=(const DevicePrecisionOptimizer&) = delete;

  // The learning rate of the next apply() to run on the device. Throws InvalidArgument for a
  // negative or NaN lr. Call it outside stream capture.
  void set_lr(double lr) {
    detail::check_lr(lr, "DevicePrecisionOptimizer");
    if (lr == *lr_host_.data()) return;
    // The previous apply() may still have to read the old value.
    COLTRAIN_CHECK_CUDA(cudaEventSynchronize(lr_read_.get()));
    *lr_host_.data() = lr;
  }
  double lr() const { return *lr_host_.data(); }

  // First half, enqueued: found_inf() = 1 if any gradient / loss scale is Inf or NaN, else 0.
  // Throws coltrain::Error if called twice without apply() in between.
  void unscale_and_check() {
    if (unscaled_)
      throw Error("DevicePrecisionOptimizer: unscale_and_check() called twice without apply()");
    COLTRAIN_CHECK_CUDA(
        cudaMemsetAsync(&state_.data()->found_inf, 0, sizeof(std::int32_t), stream_));
    if (table_.chunk_count() > 0) {
      detail::check_finite_kernel<cuda::kernel_t<Storage>, Precision::kLossScaling>
          <<<table_.blocks(), cuda::kThreadsPerBlock, 0, stream_>>>(
              table_.slots(), table_.chunks(), table_.chunk_count(), state_.data());
      COLTRAIN_CHECK_CUDA_LAUNCH();
    }
    unscaled_ = true;
  }

  // The device flag unscale_and_check() sets (int32: 0 or 1); data-parallel ranks reduce it with
  // max before apply(), so that all skip or none.
  std::int32_t* found_inf() { return &state_.data()->found_inf; }

  // Second half, enqueued: updates the loss scale; unless found_inf() is set, steps the optimizer
  // at lr() and, with master weights, rounds them into the model; zeroes the gradients if the
  // options say so. Throws coltrain::Error without unscale_and_check() first.
  void apply() {
    if (!unscaled_)
      throw Error("DevicePrecisionOptimizer: apply() needs unscale_and_check() first");
    unscaled_ = false;
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(&state_.data()->lr, lr_host_.data(), sizeof(double),
                                        cudaMemcpyHostToDevice, stream_));
    record_lr_read();
    detail::begin_apply_kernel<Precision::kLossScaling, kAlgorithm>
        <<<1, 1, 0, stream_>>>(state_.data(), hyper_);
    COLTRAIN_CHECK_CUDA_LAUNCH();
    if (table_.chunk_count() > 0) {
      detail::update_kernel<cuda::kernel_t<Storage>, Precision::kMasterWeights,
                            Precision::kLossScaling, kAlgorithm>
          <<<table_.blocks(), cuda::kThreadsPerBlock, 0, stream_>>>(
              table_.slots(), table_.chunks(), table_.chunk_count(), state_.data(), hyper_,
              options_.zero_grads, has_state1_, has_state2_);
      COLTRAIN_CHECK_CUDA_LAUNCH();
    }
  }

  // Both halves, for a single process.
  void step() {
    unscale_and_check();
    apply();
  }

  // The loss scale in device memory, for the loss's backward (1 without loss scaling).
  const float* loss_scale_device() const { return &state_.data()->scale; }

  // Host reads: each waits for the stream.
  float loss_scale() const { return read_state().scale; }
  std::int64_t steps_skipped() const { return read_state().steps_skipped; }
  std::int64_t growth_tracker() const { return read_state().growth_tracker; }
  std::int64_t steps_taken() const { return read_state().step; }

  // A copy of the fp32 master weights of parameter `index` (waits for the stream).
  std::vector<float> master_weights(std::size_t index) const requires Precision::kMasterWeights {
    std::vector<float> host(params_.at(index).size);
    if (!host.empty()) {
      COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(host.data(), master_.data() + offsets_[index],
                                          host.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                          stream_));
    }
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream_));
    return host;
  }

  // A host copy of the state, named as PrecisionOptimizer::export_state names it, with the
  // device's counters (steps taken and skipped). Waits for the stream; call it outside capture.
  OptimizerSnapshot export_state() const {
    const detail::DeviceStepState s = read_state();
    const std::vector<float> master = download(master_);
    const std::vector<float> first = download(state1_);
    const std::vector<float> second = download(state2_);
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream_));
    auto part = [&](const std::vector<float>& flat, std::size_t p) {
      const auto begin = flat.begin() + static_cast<std::ptrdiff_t>(offsets_[p]);
      return std::vector<float>(begin, begin + static_cast<std::ptrdiff_t>(params_[p].size));
    };
    OptimizerSnapshot snapshot;
    // Moments exist from the first step taken, as on the CPU.
    if (has_state1_ && s.step > 0) {
      for (std::size_t p = 0; p < params_.size(); ++p) {
        const std::string& name = params_[p].name;
        if constexpr (kAlgorithm == detail::DeviceAlgorithm::kSgd) {
          snapshot.state.push_back({name + ".momentum_buffer", part(first, p)});
        } else {
          snapshot.state.push_back({name + ".exp_avg", part(first, p)});
          snapshot.state.push_back({name + ".exp_avg_sq", part(second, p)});
          snapshot.step_counts.emplace_back(name + ".step", s.step);
        }
      }
    }
    if constexpr (Precision::kMasterWeights) {
      for (std::size_t p = 0; p < params_.size(); ++p) {
        snapshot.masters.push_back({params_[p].name, part(master, p)});
      }
    }
    if constexpr (Precision::kLossScaling) {
      snapshot.loss_scale = DynamicLossScaler::State{s.scale, s.growth_tracker};
    }
    snapshot.steps_taken = s.step;
    snapshot.steps_skipped = s.steps_skipped;
    return snapshot;
  }

  // Restores a snapshot of an optimizer over the same parameters (names and sizes) with the same
  // policy and optimizer type, exported here or by PrecisionOptimizer on the CPU. Adam's step
  // counts must agree across parameters (one count is kept here). Without the device's counters
  // (a CPU snapshot), steps skipped restart at 0 and steps taken from the state: Adam's step
  // count; for SGD 1 with momentum buffers (all its arithmetic needs to know), else 0. Leaves the
  // model's values alone (a checkpoint restores them, equal to the rounded masters). Throws
  // InvalidArgument, before anything changes, naming what does not fit, and for a snapshot
  // without state into an optimizer that has taken steps; coltrain::Error between
  // unscale_and_check() and apply(). Waits for the stream; call it outside capture.
  void import_state(const OptimizerSnapshot& snapshot) {
    if (unscaled_) {
      throw Error(
          "DevicePrecisionOptimizer: import_state() between unscale_and_check() and apply()");
    }
    detail::DeviceStepState s = read_state();
    const bool has_state = !snapshot.state.empty();
    if (!has_state && has_state1_ && s.step > 0) {
      throw InvalidArgument(
          "DevicePrecisionOptimizer: the snapshot has no optimizer state but this optimizer has "
          "taken steps; import into a freshly constructed one");
    }
    std::vector<float> first(state1_.size(), 0.0f);
    std::vector<float> second(state2_.size(), 0.0f);
    std::vector<float> master(master_.size(), 0.0f);
    auto place = [&](std::span<const float> values, std::vector<float>& flat, std::size_t p) {
      std::ranges::copy(values, flat.begin() + static_cast<std::ptrdiff_t>(offsets_[p]));
    };
    if (has_state) {
      detail::SnapshotIndex index(snapshot.state, "snapshot's optimizer state");
      for (std::size_t p = 0; p < params_.size() && has_state1_; ++p) {
        const Param& param = params_[p];
        if constexpr (kAlgorithm == detail::DeviceAlgorithm::kSgd) {
          place(index.take(param.name + ".momentum_buffer", param.size), first, p);
        } else {
          place(index.take(param.name + ".exp_avg", param.size), first, p);
          place(index.take(param.name + ".exp_avg_sq", param.size), second, p);
        }
      }
      index.check_all_taken();
    }
    const std::int64_t step = imported_step(snapshot, has_state);
    if constexpr (Precision::kMasterWeights) {
      detail::SnapshotIndex index(snapshot.masters, "snapshot's master weights");
      for (std::size_t p = 0; p < params_.size(); ++p) {
        place(index.take(params_[p].name, params_[p].size), master, p);
      }
      index.check_all_taken();
    } else if (!snapshot.masters.empty()) {
      throw InvalidArgument("the snapshot has fp32 master weights; the precision " +
                            std::string(Precision::kName) + " keeps none");
    }
    if constexpr (Precision::kLossScaling) {
      if (!snapshot.loss_scale) throw InvalidArgument("the snapshot has no loss-scaler state");
      DynamicLossScaler(scaler_options_).set_state(*snapshot.loss_scale);  // checks it
      s.scale = snapshot.loss_scale->scale;
      s.growth_tracker = snapshot.loss_scale->growth_tracker;
    } else if (snapshot.loss_scale) {
      throw InvalidArgument("the snapshot has loss-scaler state; the precision " +
                            std::string(Precision::kName) + " scales no loss");
    }
    if (snapshot.steps_skipped.value_or(0) < 0) {
      throw InvalidArgument("the snapshot's steps_skipped is negative");
    }

    s.step = step;
    s.steps_skipped = snapshot.steps_skipped.value_or(0);
    s.found_inf = 0;
    upload(first, state1_);
    upload(second, state2_);
    upload(master, master_);
    COLTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(state_.data(), &s, sizeof(s), cudaMemcpyHostToDevice, stream_));
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream_));  // the host copies go out of scope
  }

  const Optimizer& optimizer() const { return optimizer_; }
  const DynamicLossScaler::Options& scaler_options() const { return scaler_options_; }
  std::size_t size() const { return params_.size(); }
  const std::string& parameter_name(std::size_t index) const { return params_.at(index).name; }

 private:
  struct EventDestroy {
    void operator()(cudaEvent_t event) const { cudaEventDestroy(event); }
  };

  // Flat device buffers, each tensor's part starting on a 256-byte boundary.
  static constexpr std::size_t kAlignElements = 64;

  void build_table() {
    std::size_t total = 0;
    for (std::size_t p = 0; p < params_.size(); ++p) {
      const Param& param = params_[p];
      if (param.size > 0 && (param.value == nullptr || param.grad == nullptr)) {
        throw InvalidArgument("DevicePrecisionOptimizer: parameter '" +
                              detail::param_label(param.name, p) + "' has no device memory");
      }
      offsets_.push_back(total);
      total += (param.size + kAlignElements - 1) / kAlignElements * kAlignElements;
    }
    if constexpr (kAlgorithm == detail::DeviceAlgorithm::kSgd) {
      has_state1_ = optimizer_.options().momentum != 0;
    } else {
      has_state1_ = has_state2_ = true;
    }
    if constexpr (Precision::kMasterWeights) master_ = tensor::Storage<float, tensor::Cuda>(total);
    if (has_state1_) state1_ = tensor::Storage<float, tensor::Cuda>(total);
    if (has_state2_) state2_ = tensor::Storage<float, tensor::Cuda>(total);
    auto part = [&](tensor::Storage<float, tensor::Cuda>& buffer, std::size_t p) -> float* {
      return buffer.size() ? buffer.data() + offsets_[p] : nullptr;
    };
    std::vector<cuda::TensorSlot<Storage>> slots;
    for (std::size_t p = 0; p < params_.size(); ++p) {
      const Param& param = params_[p];
      slots.push_back({param.value, param.grad, part(master_, p), part(state1_, p),
                       part(state2_, p), static_cast<std::int64_t>(param.size),
                       param.weight_decay ? 1 : 0, 0});
      if constexpr (Precision::kMasterWeights) {
        cuda::cast(param.value, part(master_, p), static_cast<std::int64_t>(param.size), stream_);
      }
    }
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream_));
    table_ = cuda::MultiTensorTable<Storage>(std::move(slots));
  }

  void upload_initial_state() {
    detail::DeviceStepState initial{};
    initial.lr = optimizer_.options().lr;
    initial.scale = Precision::kLossScaling ? scaler_options_.init_scale : 1.0f;
    initial.inv_scale = 1.0f;
    COLTRAIN_CHECK_CUDA(
        cudaMemcpy(state_.data(), &initial, sizeof(initial), cudaMemcpyHostToDevice));

    hyper_.growth_factor = scaler_options_.growth_factor;
    hyper_.backoff_factor = scaler_options_.backoff_factor;
    hyper_.growth_interval = scaler_options_.growth_interval;
    const auto& o = optimizer_.options();
    hyper_.weight_decay = o.weight_decay;
    hyper_.weight_decay_f = static_cast<float>(o.weight_decay);
    if constexpr (kAlgorithm == detail::DeviceAlgorithm::kSgd) {
      hyper_.has_momentum = o.momentum != 0;
      hyper_.momentum = static_cast<float>(o.momentum);
      hyper_.blend = static_cast<float>(1.0 - o.dampening);
      hyper_.nesterov = o.nesterov;
    } else {
      hyper_.beta1 = o.beta1;
      hyper_.beta2 = o.beta2;
      hyper_.beta1_f = static_cast<float>(o.beta1);
      hyper_.beta2_f = static_cast<float>(o.beta2);
      hyper_.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
      hyper_.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
      hyper_.eps = static_cast<float>(o.eps);
      hyper_.decoupled = std::is_same_v<Optimizer, AdamW>;
    }
  }

  // An event after the copy of lr, so that set_lr knows when the pinned value may change. Under
  // capture it must be an external event node, recorded by every replay.
  void record_lr_read() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    COLTRAIN_CHECK_CUDA(cudaStreamIsCapturing(stream_, &status));
    if (status == cudaStreamCaptureStatusActive) {
      COLTRAIN_CHECK_CUDA(
          cudaEventRecordWithFlags(lr_read_.get(), stream_, cudaEventRecordExternal));
    } else {
      COLTRAIN_CHECK_CUDA(cudaEventRecord(lr_read_.get(), stream_));
    }
  }

  // Copies queued on the stream; the caller synchronises.
  std::vector<float> download(const tensor::Storage<float, tensor::Cuda>& buffer) const {
    std::vector<float> host(buffer.size());
    if (!host.empty()) {
      COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(host.data(), buffer.data(), host.size() * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_));
    }
    return host;
  }
  void upload(const std::vector<float>& host, tensor::Storage<float, tensor::Cuda>& buffer) {
    if (host.empty()) return;
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(buffer.data(), host.data(), host.size() * sizeof(float),
                                        cudaMemcpyHostToDevice, stream_));
  }

  // The step count a snapshot restores (see import_state); InvalidArgument where its counts
  // disagree with each other or with its state.
  std::int64_t imported_step(const OptimizerSnapshot& snapshot, bool has_state) const {
    if constexpr (kAlgorithm == detail::DeviceAlgorithm::kAdam) {
      const std::size_t expected = has_state ? params_.size() : 0;
      if (snapshot.step_counts.size() != expected) {
        throw InvalidArgument("the snapshot has " + std::to_string(snapshot.step_counts.size()) +
                              " step counts, this optimizer keeps " + std::to_string(expected));
      }
      std::int64_t step = 0;
      for (std::size_t p = 0; p < expected; ++p) {
        const std::string key = params_[p].name + ".step";
        const std::int64_t count = detail::snapshot_step_count(snapshot, key);
        if (p > 0 && count != step) {
          throw InvalidArgument(
              "DevicePrecisionOptimizer keeps one step count for all parameters; the snapshot "
              "has " + std::to_string(step) + " for '" + params_[0].name + ".step' and " +
              std::to_string(count) + " for '" + key + "'");
        }
        step = count;
      }
      if (snapshot.steps_taken && *snapshot.steps_taken != step) {
        throw InvalidArgument("the snapshot's steps_taken " +
                              std::to_string(*snapshot.steps_taken) +
                              " differs from its step counts (" + std::to_string(step) + ")");
      }
      return step;
    } else {
      if (!snapshot.step_counts.empty()) {
        throw InvalidArgument("the snapshot has step counts; SGD keeps none");
      }
      const std::int64_t step = snapshot.steps_taken.value_or(has_state ? 1 : 0);
      if (step < 0) throw InvalidArgument("the snapshot's steps_taken is negative");
      if (has_state1_ && (step > 0) != has_state) {
        throw InvalidArgument("the snapshot's steps_taken " + std::to_string(step) +
                              (has_state ? " is 0 but it has" : " is not 0 but it has no") +
                              " momentum buffers");
      }
      return step;
    }
  }

  detail::DeviceStepState read_state() const {
    detail::DeviceStepState host{};
    COLTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(&host, state_.data(), sizeof(host), cudaMemcpyDeviceToHost, stream_));
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream_));
    return host;
  }

  std::vector<Param> params_;
  Optimizer optimizer_;  // holds the options (checked by its constructor); never stepped
  DynamicLossScaler::Options scaler_options_;
  DeviceOptimizerOptions options_;
  cudaStream_t stream_;
  std::vector<std::size_t> offsets_;
  tensor::Storage<float, tensor::Cuda> master_;
  tensor::Storage<float, tensor::Cuda> state1_;
  tensor::Storage<float, tensor::Cuda> state2_;
  bool has_state1_ = false;
  bool has_state2_ = false;
  cuda::MultiTensorTable<Storage> table_;
  tensor::Storage<detail::DeviceStepState, tensor::Cuda> state_;
  detail::DeviceHyperparameters hyper_{};
  tensor::PinnedBuffer<double> lr_host_;
  std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDestroy> lr_read_;
  bool unscaled_ = false;
};

}  // namespace coltrain::optim
