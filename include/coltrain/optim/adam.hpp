#pragma once
// Adam and AdamW as torch.optim.Adam and torch.optim.AdamW (PyTorch 1.13, single-tensor path,
// amsgrad and maximize off). Per element, in T (float; double for the Fp64 policy), with t the
// parameter's step count:
//
//   Adam:  g = grad + weight_decay * value          (L2 decay folded into the gradient)
//   AdamW: value = value * (1 - lr * weight_decay)  (decoupled decay), g = grad
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   value = value - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// The bias corrections and the step size are computed in double on the host and rounded to T once,
// as PyTorch does with its Python scalars; each multiply and add rounds where PyTorch's separate
// tensor operations round.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/thread_pool.hpp>
#include <coltrain/optim/element_shares.hpp>
#include <coltrain/optim/parameter_ref.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace coltrain::optim {
namespace detail {

struct AdamHyperparameters {
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  bool decoupled;  // AdamW
};

inline void check_adam_options(std::string_view name, double lr, double beta1, double beta2,
                               double eps, double weight_decay) {
  const std::string prefix = std::string(name) + ": invalid ";
  if (!(lr >= 0)) throw InvalidArgument(prefix + "learning rate " + number_text(lr));
  if (!(eps >= 0)) throw InvalidArgument(prefix + "epsilon " + number_text(eps));
  if (!(beta1 >= 0 && beta1 < 1)) {
    throw InvalidArgument(prefix + "beta1 " + number_text(beta1) + " (must be in [0, 1))");
  }
  if (!(beta2 >= 0 && beta2 < 1)) {
    throw InvalidArgument(prefix + "beta2 " + number_text(beta2) + " (must be in [0, 1))");
  }
  if (!(weight_decay >= 0)) {
    throw InvalidArgument(prefix + "weight_decay " + number_text(weight_decay));
  }
}

// The state and update shared by Adam and AdamW; they differ only in how decay is applied.
template <class T>
class AdamEngine {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "Adam and AdamW compute in float or double");

 public:
  // With `threads`, the update runs on that pool (the network's), with the same bits.
  void step(std::span<const MasterParamRef<T>> params, double lr, const AdamHyperparameters& h,
            std::string_view name, ThreadPool* threads) {
    check_lr(lr, name);
    layout_.bind(params, name);
    ensure_state(params);

    const T beta1 = static_cast<T>(h.beta1);
    const T beta2 = static_cast<T>(h.beta2);
    const T one_minus_beta1 = static_cast<T>(1.0 - h.beta1);
    const T one_minus_beta2 = static_cast<T>(1.0 - h.beta2);
    const T eps = static_cast<T>(h.eps);
    const T shrink = static_cast<T>(1.0 - lr * h.weight_decay);
    // Each parameter's step count and scalars, before the parameters are shared out.
    factors_.resize(params.size());
    for (std::size_t p = 0; p < params.size(); ++p) {
      State& state = state_[p];
      state.step += 1;
      const double t = static_cast<double>(state.step);
      const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
      const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
      const bool decay = h.weight_decay != 0 && params[p].weight_decay;
      factors_[p] = {
          static_cast<T>(-(lr / bias_correction1)), static_cast<T>(std::sqrt(bias_correction2)),
          decay && !h.decoupled ? static_cast<T>(h.weight_decay) : T(0), decay && h.decoupled};
    }
    for_each_element_share(params, threads, [&](std::size_t p, std::size_t begin, std::size_t end) {
      const Factors& f = factors_[p];
      T* value = params[p].value.data() + begin;
      const T* grad = params[p].grad.data() + begin;
      T* m = state_[p].exp_avg.data() + begin;
      T* v = state_[p].exp_avg_sq.data() + begin;
      const std::size_t n = end - begin;
      for (std::size_t i = 0; i < n; ++i) {
        T g = grad[i];
        if (f.l2 != T(0)) g = g + f.l2 * value[i];
        if (f.decoupled) value[i] = value[i] * shrink;
        m[i] = m[i] * beta1;
        m[i] = m[i] + one_minus_beta1 * g;
        v[i] = v[i] * beta2;
        v[i] = v[i] + one_minus_beta2 * g * g;
        const T denom = std::sqrt(v[i]) / f.bias_correction2_sqrt + eps;
        value[i] = value[i] + f.neg_step_size * m[i] / denom;
      }
    });
  }

  template <class F>
  void for_each_state(F&& f) {
    for (std::size_t p = 0; p < state_.size(); ++p) {
      f(layout_.name(p) + ".exp_avg", std::span<T>(state_[p].exp_avg));
      f(layout_.name(p) + ".exp_avg_sq", std::span<T>(state_[p].exp_avg_sq));
    }
  }

  template <class F>
  void for_each_state(F&& f) const {
    for (std::size_t p = 0; p < state_.size(); ++p) {
      f(layout_.name(p) + ".exp_avg", std::span<const T>(state_[p].exp_avg));
      f(layout_.name(p) + ".exp_avg_sq", std::span<const T>(state_[p].exp_avg_sq));
    }
  }

  template <class F>
  void for_each_step(F&& f) {
    for (std::size_t p = 0; p < state_.size(); ++p) f(layout_.name(p) + ".step", state_[p].step);
  }

  template <class F>
  void for_each_step(F&& f) const {
    for (std::size_t p = 0; p < state_.size(); ++p) {
      f(layout_.name(p) + ".step", static_cast<const std::int64_t&>(state_[p].step));
    }
  }

  std::int64_t step_count(std::size_t index) const {
    if (index >= state_.size()) {
      throw InvalidArgument("optimizer has no state for parameter #" + std::to_string(index) +
                            " (" + std::to_string(state_.size()) + " parameters with state)");
    }
    return state_[index].step;
  }

  void allocate_state(std::span<const MasterParamRef<T>> params, std::string_view name) {
    layout_.bind(params, name);
    ensure_state(params);
  }

 private:
  struct State {
    std::int64_t step = 0;
    std::vector<T> exp_avg;
    std::vector<T> exp_avg_sq;
  };

  // PyTorch creates zero moments and step 0 at a parameter's first step.
  void ensure_state(std::span<const MasterParamRef<T>> params) {
    if (state_.size() == params.size()) return;
    state_.resize(params.size());
    for (std::size_t p = 0; p < params.size(); ++p) {
      state_[p].exp_avg.assign(params[p].value.size(), T(0));
      state_[p].exp_avg_sq.assign(params[p].value.size(), T(0));
    }
  }

  // A parameter's scalars for one step.
  struct Factors {
    T neg_step_size;
    T bias_correction2_sqrt;
    T l2;            // Adam's decay, folded into the gradient
    bool decoupled;  // AdamW's decay
  };

  ParamLayout layout_;
  std::vector<State> state_;
  std::vector<Factors> factors_;  // step's scratch
};

// Adam and AdamW differ in their decay and its default; everything else is this template.
template <bool kDecoupled>
struct AdamOptions {
  double lr = 1e-3;  // used by step(params); step(params, lr) takes the schedule's value
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // Adam: L2, added to the gradient (default 0). AdamW: decoupled, value *= 1 - lr * weight_decay
  // (default 1e-2).
  double weight_decay = kDecoupled ? 1e-2 : 0.0;
};

template <class T, bool kDecoupled>
class AdamOptimizer {
 public:
  using value_type = T;
  using Param = MasterParamRef<T>;
  using Options = AdamOptions<kDecoupled>;
  static constexpr std::string_view kName = kDecoupled ? "AdamW" : "Adam";

  // Throws InvalidArgument for lr, eps or weight_decay < 0 and betas outside [0, 1).
  explicit AdamOptimizer(Options options) : options_(options) {
    check_adam_options(kName, options.lr, options.beta1, options.beta2, options.eps,
                       options.weight_decay);
  }
  AdamOptimizer() : AdamOptimizer(Options{}) {}

  const Options& options() const { return options_; }

  // One step at learning rate lr (a schedule's value; options().lr is not used). The parameters
  // must be the same, in the same order, at every step: state is kept by index.
  // With `threads`, the update runs on that pool (the network's), with the same bits.
  void step(std::span<const Param> params, double lr, ThreadPool* threads = nullptr) {
    AdamHyperparameters hyperparameters;
    hyperparameters.beta1 = options_.beta1;
    hyperparameters.beta2 = options_.beta2;
    hyperparameters.eps = options_.eps;
    hyperparameters.weight_decay = options_.weight_decay;
    hyperparameters.decoupled = kDecoupled;
    engine_.step(params, lr, hyperparameters, kName, threads);
  }
  void step(std::span<const Param> params) { step(params, options_.lr); }

  // f(std::string name, std::span<T>) for "<parameter>.exp_avg" and "<parameter>.exp_avg_sq"
  // of every parameter with state (all of them after the first step, none before).
  template <class F>
  void for_each_state(F&& f) {
    engine_.for_each_state(static_cast<F&&>(f));
  }
  template <class F>
  void for_each_state(F&& f) const {
    engine_.for_each_state(static_cast<F&&>(f));
  }

  // f(std::string name, std::int64_t& step) for "<parameter>.step", PyTorch's per-parameter step
  // count (a float tensor in PyTorch 1.13, an integer here).
  template <class F>
  void for_each_step(F&& f) {
    engine_.for_each_step(static_cast<F&&>(f));
  }
  template <class F>
  void for_each_step(F&& f) const {
    engine_.for_each_step(static_cast<F&&>(f));
  }

  // The step count of parameter `index`; throws InvalidArgument before its first step.
  std::int64_t step_count(std::size_t index) const { return engine_.step_count(index); }

  // For loading a checkpoint: binds the layout and creates zero moments and step counts, exactly
  // the state a first step starts from, for for_each_state and for_each_step to fill.
  void allocate_state(std::span<const Param> params) { engine_.allocate_state(params, kName); }

 private:
  Options options_;
  AdamEngine<T> engine_;
};

}  // namespace detail

// torch.optim.Adam: weight decay as L2 added to the gradient; Options::weight_decay defaults to 0.
template <class T>
class BasicAdam : public detail::AdamOptimizer<T, false> {
 public:
  using detail::AdamOptimizer<T, false>::AdamOptimizer;
};

// torch.optim.AdamW: decoupled weight decay; Options::weight_decay defaults to 1e-2.
template <class T>
class BasicAdamW : public detail::AdamOptimizer<T, true> {
 public:
  using detail::AdamOptimizer<T, true>::AdamOptimizer;
};

// The float instances, which every policy but Fp64 steps (master_t in optim/precision.hpp).
using Adam = BasicAdam<float>;
using AdamW = BasicAdamW<float>;

}  // namespace coltrain::optim
