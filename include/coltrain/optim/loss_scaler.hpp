#pragma once
// Dynamic loss scaling for fp16 training, as torch.cuda.amp.GradScaler (PyTorch 1.13): the loss is
// multiplied by scale() before the backward pass so that small gradients survive in fp16; the
// gradients are divided by it again (unscale_and_check) before the optimizer sees them. A step
// whose gradients overflowed is skipped and the scale halved; after growth_interval clean steps in
// a row the scale doubles, probing for the largest scale that does not overflow.

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/optim/parameter_ref.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

namespace coltrain::optim {

class DynamicLossScaler {
 public:
  struct Options {
    float init_scale = 65536.0f;  // 2^16
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    std::int64_t growth_interval = 2000;
  };

  // What a checkpoint must hold to resume the state machine (GradScaler's "scale" and
  // "_growth_tracker"; its factors and interval are Options).
  struct State {
    float scale = 65536.0f;
    std::int64_t growth_tracker = 0;
  };

  // Throws InvalidArgument unless init_scale is positive and finite, growth_factor > 1,
  // 0 < backoff_factor < 1 and growth_interval >= 1.
  explicit DynamicLossScaler(Options options) : options_(options), scale_(options.init_scale) {
    if (!(options.init_scale > 0) || !std::isfinite(options.init_scale)) {
      throw InvalidArgument("DynamicLossScaler: init_scale must be positive and finite, not " +
                            detail::number_text(options.init_scale));
    }
    if (!(options.growth_factor > 1.0)) {
      throw InvalidArgument("DynamicLossScaler: growth_factor must be > 1, not " +
                            detail::number_text(options.growth_factor));
    }
    if (!(options.backoff_factor > 0.0 && options.backoff_factor < 1.0)) {
      throw InvalidArgument("DynamicLossScaler: backoff_factor must be in (0, 1), not " +
                            detail::number_text(options.backoff_factor));
    }
    if (options.growth_interval < 1) {
      throw InvalidArgument("DynamicLossScaler: growth_interval must be >= 1, not " +
                            std::to_string(options.growth_interval));
    }
  }
  DynamicLossScaler() : DynamicLossScaler(Options{}) {}

  const Options& options() const { return options_; }

  // The factor to multiply the loss by.
  float scale() const { return scale_; }

  // Clean steps since the last change of scale (or overflow).
  std::int64_t growth_tracker() const { return growth_tracker_; }

  // After a step's gradients were checked (and, in data-parallel training, the flag agreed on by
  // all ranks). Returns whether the optimizer step should be taken. Scale is a float and grows
  // only while it stays finite, as in PyTorch's _amp_update_scale_.
  bool update(bool found_inf) {
    if (found_inf) {
      scale_ = static_cast<float>(static_cast<double>(scale_) * options_.backoff_factor);
      growth_tracker_ = 0;
      return false;
    }
    const std::int64_t clean_steps = growth_tracker_ + 1;
    if (clean_steps == options_.growth_interval) {
      const float grown = static_cast<float>(static_cast<double>(scale_) * options_.growth_factor);
      if (std::isfinite(grown)) scale_ = grown;
      growth_tracker_ = 0;
    } else {
      growth_tracker_ = clean_steps;
    }
    return true;
  }

  State state() const { return {scale_, growth_tracker_}; }

  // Restores a checkpointed state; throws InvalidArgument for a scale that is not positive and
  // finite or a tracker outside [0, growth_interval).
  void set_state(const State& state) {
    if (!(state.scale > 0) || !std::isfinite(state.scale)) {
      throw InvalidArgument(
          "DynamicLossScaler: checkpointed scale must be positive and finite, "
          "not " +
          detail::number_text(state.scale));
    }
    if (state.growth_tracker < 0 || state.growth_tracker >= options_.growth_interval) {
      throw InvalidArgument("DynamicLossScaler: checkpointed growth tracker " +
                            std::to_string(state.growth_tracker) + " is outside [0, " +
                            std::to_string(options_.growth_interval) + ")");
    }
    scale_ = state.scale;
    growth_tracker_ = state.growth_tracker;
  }

  // The free function unscale_and_check below, for callers that think of it as the scaler's.
  template <class T>
  static bool unscale_and_check(std::span<const T> grads, std::span<float> out, float inv_scale);

 private:
  Options options_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
};

// out[i] = float(grads[i]) * inv_scale; returns false if any result is Inf or NaN. Checking the
// result, not the input, also catches a finite gradient that overflows when the scale has fallen
// below 1. T is float, half or bfloat16. Throws InvalidArgument if the sizes differ.
template <class T>
bool unscale_and_check(std::span<const T> grads, std::span<float> out, float inv_scale) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>,
                "coltrain: unscale_and_check takes float, half or bfloat16 gradients");
  if (grads.size() != out.size()) {
    throw InvalidArgument("unscale_and_check: " + std::to_string(grads.size()) + " gradients but " +
                          std::to_string(out.size()) + " outputs");
  }
  // Accumulate a flag instead of returning early: the loop stays branch-free and vectorises.
  bool finite = true;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const float value = static_cast<float>(grads[i]) * inv_scale;
    out[i] = value;
    finite &= std::isfinite(value);
  }
  return finite;
}

template <class T>
bool DynamicLossScaler::unscale_and_check(std::span<const T> grads, std::span<float> out,
                                          float inv_scale) {
  return optim::unscale_and_check(grads, out, inv_scale);
}

}  // namespace coltrain::optim
