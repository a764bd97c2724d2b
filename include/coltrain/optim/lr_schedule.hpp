#pragma once
// Learning-rate schedules as stateless closed forms: schedule(t) is the learning rate PyTorch's
// scheduler holds after t calls of scheduler.step(), i.e. the rate for step (or epoch) t, counting
// from 0, when the loop is `optimizer.step(); scheduler.step();`. Stateless means a resumed run
// needs only the step counter, and every rank computes the same value without communication.
//
// PyTorch's schedulers step recursively (lr *= factor); their closed forms (_get_closed_form_lr)
// give the same values up to a few ulps, which is what these compute. Each schedule is an
// aggregate, so `StepLr{.base_lr = 0.1, .step_size = 30}` works; arguments are checked when the
// schedule is evaluated, throwing InvalidArgument.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

namespace coltrain::optim {
namespace detail {

inline void check_schedule_step(std::int64_t step, const char* schedule) {
  if (step < 0) {
    throw InvalidArgument(std::string(schedule) + ": step " + std::to_string(step) +
                          " is negative");
  }
}

}  // namespace detail

// torch.optim.lr_scheduler.ConstantLR: base_lr * factor before total_iters, base_lr from then on.
// The defaults (factor 1, total_iters 0) make it a plain constant; PyTorch's are 1/3 and 5.
struct ConstantLr {
  double base_lr = 0.01;
  double factor = 1.0;
  std::int64_t total_iters = 0;

  double operator()(std::int64_t step) const {
    detail::check_schedule_step(step, "ConstantLr");
    if (!(factor >= 0 && factor <= 1)) {
      throw InvalidArgument("ConstantLr: factor must be in [0, 1]");
    }
    return step >= total_iters ? base_lr : base_lr * factor;
  }
};

// torch.optim.lr_scheduler.StepLR: base_lr * gamma^floor(step / step_size).
struct StepLr {
  double base_lr = 0.01;
  std::int64_t step_size = 1;
  double gamma = 0.1;

  double operator()(std::int64_t step) const {
    detail::check_schedule_step(step, "StepLr");
    if (step_size <= 0) {
      throw InvalidArgument("StepLr: step_size must be positive, not " + std::to_string(step_size));
    }
    return base_lr * std::pow(gamma, static_cast<double>(step / step_size));
  }
};

// torch.optim.lr_scheduler.MultiStepLR: base_lr * gamma^(number of milestones <= step). Milestones
// need not be sorted; one listed twice applies gamma twice, as in PyTorch's Counter.
struct MultiStepLr {
  double base_lr = 0.01;
  std::vector<std::int64_t> milestones;
  double gamma = 0.1;

  double operator()(std::int64_t step) const {
    detail::check_schedule_step(step, "MultiStepLr");
    std::int64_t passed = 0;
    for (std::int64_t milestone : milestones) passed += milestone <= step ? 1 : 0;
    return base_lr * std::pow(gamma, static_cast<double>(passed));
  }
};

// torch.optim.lr_scheduler.CosineAnnealingLR, closed form:
// eta_min + (base_lr - eta_min) * (1 + cos(pi * step / t_max)) / 2. Past t_max the cosine rises
// again, as PyTorch's does (it is SGDR without restarts only up to t_max).
struct CosineAnnealingLr {
  double base_lr = 0.01;
  std::int64_t t_max = 1;
  double eta_min = 0.0;

  double operator()(std::int64_t step) const {
    detail::check_schedule_step(step, "CosineAnnealingLr");
    if (t_max <= 0) {
      throw InvalidArgument("CosineAnnealingLr: t_max must be positive, not " +
                            std::to_string(t_max));
    }
    const double phase = std::numbers::pi * static_cast<double>(step) / static_cast<double>(t_max);
    return eta_min + (base_lr - eta_min) * (1.0 + std::cos(phase)) / 2.0;
  }
};

// Linear warm-up in front of another schedule, as
//   SequentialLR([LinearLR(start_factor, end_factor=1, total_iters=warmup_steps), inner],
//                milestones=[warmup_steps])
// gives it:
//   step <  warmup_steps: inner(0) * (start_factor + (1 - start_factor) * step / warmup_steps)
//   step >= warmup_steps: inner(step - warmup_steps)
// so the rate climbs from start_factor * inner(0) towards inner(0) (which it reaches at
// warmup_steps, where the inner schedule starts at its own step 0), and the inner schedule's
// milestones and periods count from the end of the warm-up. warmup_steps = 0 is the inner schedule
// alone. (Goyal et al. warm up over 5 epochs from lr / world_size: start_factor = 1 / world_size.)
template <class Inner>
struct LinearWarmup {
  std::int64_t warmup_steps = 0;
  double start_factor = 1.0 / 3.0;
  Inner inner{};

  double operator()(std::int64_t step) const {
    detail::check_schedule_step(step, "LinearWarmup");
    if (warmup_steps < 0) throw InvalidArgument("LinearWarmup: warmup_steps must be >= 0");
    if (!(start_factor >= 0 && start_factor <= 1)) {
      throw InvalidArgument("LinearWarmup: start_factor must be in [0, 1]");
    }
    if (step >= warmup_steps) return inner(step - warmup_steps);
    const double factor = start_factor + (1.0 - start_factor) * static_cast<double>(step) /
                                             static_cast<double>(warmup_steps);
    return inner(0) * factor;
  }
};

template <class Inner>
LinearWarmup(std::int64_t, double, Inner) -> LinearWarmup<Inner>;

// Goyal et al. (2017), "Accurate, Large Minibatch SGD": when the global batch grows k-fold, scale
// the learning rate k-fold. base_lr is the rate tuned at base_world_size ranks of the same per-rank
// batch.
inline double scale_lr_linearly(double base_lr, int world_size, int base_world_size = 1) {
  if (world_size <= 0 || base_world_size <= 0) {
    throw InvalidArgument("scale_lr_linearly: world sizes must be positive (got " +
                          std::to_string(world_size) + " and " + std::to_string(base_world_size) +
                          ")");
  }
  return base_lr * static_cast<double>(world_size) / static_cast<double>(base_world_size);
}

}  // namespace coltrain::optim
