#pragma once
// Stochastic gradient descent with momentum, dampening, Nesterov momentum and L2 weight decay,
// computed as torch.optim.SGD (PyTorch 1.13, single-tensor path) computes it, per element in T
// (float; double for the Fp64 policy, as a float64 torch model):
//
//   d = grad + weight_decay * value                       (if weight_decay != 0)
//   buf = d                                               (first step: a copy, not a blend)
//   buf = momentum * buf + (1 - dampening) * d            (later steps)
//   d = nesterov ? d + momentum * buf : buf               (if momentum != 0)
//   value = value - lr * d
//
// Hyperparameters are rounded to T once, as PyTorch's CPU kernels do with Python scalars, so that
// the same loop can run as a CUDA kernel later.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/thread_pool.hpp>
#include <coltrain/optim/element_shares.hpp>
#include <coltrain/optim/parameter_ref.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace coltrain::optim {

template <class T>
class BasicSgd {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "BasicSgd<T>: the optimizers compute in float or double");

 public:
  using value_type = T;
  using Param = MasterParamRef<T>;

  struct Options {
    double lr = 0.01;  // used by step(params); step(params, lr) takes the schedule's value
    double momentum = 0;
    double dampening = 0;
    double weight_decay = 0;
    bool nesterov = false;
  };

  // Throws InvalidArgument for negative lr, momentum or weight decay, and for Nesterov without
  // momentum or with dampening (PyTorch's checks).
  explicit BasicSgd(Options options) : options_(options) {
    if (!(options.lr >= 0)) {
      throw InvalidArgument("SGD: invalid learning rate " + detail::number_text(options.lr));
    }
    if (!(options.momentum >= 0)) {
      throw InvalidArgument("SGD: invalid momentum " + detail::number_text(options.momentum));
    }
    if (!(options.weight_decay >= 0)) {
      throw InvalidArgument("SGD: invalid weight_decay " +
                            detail::number_text(options.weight_decay));
    }
    if (options.nesterov && (options.momentum <= 0 || options.dampening != 0)) {
      throw InvalidArgument("SGD: Nesterov momentum requires a momentum > 0 and zero dampening");
    }
  }
  BasicSgd() : BasicSgd(Options{}) {}

  const Options& options() const { return options_; }

  // One step at learning rate lr (a schedule's value; options().lr is not used). The parameters
  // must be the same, in the same order, at every step: the momentum buffers are kept by index.
  // With `threads`, the update runs on that pool (the network's), with the same bits.
  void step(std::span<const Param> params, double lr, ThreadPool* threads = nullptr) {
    detail::check_lr(lr, "SGD");
    layout_.bind(params, "SGD");
    if (state_.size() != params.size()) state_.resize(params.size());

    const T momentum = static_cast<T>(options_.momentum);
    const T blend = static_cast<T>(1.0 - options_.dampening);
    const T neg_lr = static_cast<T>(-lr);
    // Which buffers this step creates (a copy of the gradient, not a blend), decided before the
    // parameters are shared out.
    first_.assign(params.size(), false);
    if (options_.momentum != 0) {
      for (std::size_t p = 0; p < params.size(); ++p) {
        State& state = state_[p];
        if (state.has_buffer) continue;
        state.momentum_buffer.assign(params[p].value.size(), T(0));
        state.has_buffer = true;
        first_[p] = true;
      }
    }
    detail::for_each_element_share(
        params, threads, [&](std::size_t p, std::size_t begin, std::size_t end) {
          const Param& param = params[p];
          const bool decay = options_.weight_decay != 0 && param.weight_decay;
          const T weight_decay = decay ? static_cast<T>(options_.weight_decay) : T(0);
          T* value = param.value.data() + begin;
          const T* grad = param.grad.data() + begin;
          const std::size_t n = end - begin;

          if (options_.momentum == 0) {
            for (std::size_t i = 0; i < n; ++i) {
              T d = grad[i];
              if (decay) d = d + weight_decay * value[i];
              value[i] = value[i] + neg_lr * d;
            }
            return;
          }
          T* buf = state_[p].momentum_buffer.data() + begin;
          // The flags select one of eight loops, so that each vectorises without branches.
          dispatch(decay, first_[p], options_.nesterov,
                   [&]<bool kDecay, bool kFirst, bool kNesterov>() {
                     momentum_update<kDecay, kFirst, kNesterov>(value, grad, buf, n, weight_decay,
                                                                momentum, blend, neg_lr);
                   });
        });
  }

  void step(std::span<const Param> params) { step(params, options_.lr); }

  // Visits the state PyTorch's SGD keeps: f(std::string name, std::span<T>) with name
  // "<parameter>.momentum_buffer", for each parameter that has a buffer (none before the first
  // step, none without momentum).
  template <class F>
  void for_each_state(F&& f) {
    for (std::size_t p = 0; p < state_.size(); ++p) {
      if (!state_[p].has_buffer) continue;
      f(layout_.name(p) + ".momentum_buffer", std::span<T>(state_[p].momentum_buffer));
    }
  }

  template <class F>
  void for_each_state(F&& f) const {
    for (std::size_t p = 0; p < state_.size(); ++p) {
      if (!state_[p].has_buffer) continue;
      f(layout_.name(p) + ".momentum_buffer", std::span<const T>(state_[p].momentum_buffer));
    }
  }

  // For loading a checkpoint: binds the layout and creates zero momentum buffers (when momentum
  // != 0), which for_each_state then fills. The buffers count as present afterwards, as after
  // PyTorch's load_state_dict, so the next step blends into them instead of copying the gradient.
  void allocate_state(std::span<const Param> params) {
    layout_.bind(params, "SGD");
    state_.resize(params.size());
    if (options_.momentum == 0) return;
    for (std::size_t p = 0; p < params.size(); ++p) {
      if (state_[p].has_buffer) continue;
      state_[p].momentum_buffer.assign(params[p].value.size(), T(0));
      state_[p].has_buffer = true;
    }
  }

 private:
  template <class F>
  static void dispatch(bool decay, bool first, bool nesterov, F&& f) {
    auto with_nesterov = [&]<bool kDecay, bool kFirst>() {
      if (nesterov)
        f.template operator()<kDecay, kFirst, true>();
      else
        f.template operator()<kDecay, kFirst, false>();
    };
    auto with_first = [&]<bool kDecay>() {
      if (first)
        with_nesterov.template operator()<kDecay, true>();
      else
        with_nesterov.template operator()<kDecay, false>();
    };
    if (decay)
      with_first.template operator()<true>();
    else
      with_first.template operator()<false>();
  }

  template <bool kDecay, bool kFirst, bool kNesterov>
  static void momentum_update(T* COLTRAIN_RESTRICT value, const T* COLTRAIN_RESTRICT grad,
                              T* COLTRAIN_RESTRICT buf, std::size_t n, T weight_decay, T momentum,
                              T blend, T neg_lr) {
    for (std::size_t i = 0; i < n; ++i) {
      T d = grad[i];
      if constexpr (kDecay) d = d + weight_decay * value[i];
      // Two roundings, as buf.mul_(momentum).add_(d, alpha=1 - dampening).
      if constexpr (kFirst)
        buf[i] = d;
      else
        buf[i] = buf[i] * momentum + blend * d;
      if constexpr (kNesterov)
        d = d + momentum * buf[i];
      else
        d = buf[i];
      value[i] = value[i] + neg_lr * d;
    }
  }

  struct State {
    std::vector<T> momentum_buffer;
    bool has_buffer = false;
  };

  Options options_;
  detail::ParamLayout layout_;
  std::vector<State> state_;
  std::vector<bool> first_;  // step's scratch: the buffers it creates
};

// The float instance, which every policy but Fp64 steps (master_t in optim/precision.hpp).
using Sgd = BasicSgd<float>;

}  // namespace coltrain::optim
