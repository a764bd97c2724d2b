#pragma once
// Clipping by the gradients' global L2 norm, as torch.nn.utils.clip_grad_norm_: when the norm of
// all gradients together exceeds max_norm, every gradient is multiplied by
// max_norm / (norm + 1e-6); otherwise they are left as they are. The trainer computes the norm
// from the averaged, unscaled fp32 gradients (PrecisionOptimizer::gradient_sum_of_squares, summed
// across the shards under ZeRO-1), so every rank clips by the same factor.

#include <coltrain/core/error.hpp>

#include <cmath>
#include <string>

namespace coltrain::optim {

// The factor the gradients are multiplied by: min(1, max_norm / (norm + 1e-6)), PyTorch's
// clip_coef clamped at 1. The trainer asks only for finite gradients (a step with others is
// skipped). Throws InvalidArgument for max_norm <= 0 or NaN.
inline double clip_coefficient(double norm, double max_norm) {
  if (!(max_norm > 0))
    throw InvalidArgument("clip_coefficient: max_norm must be > 0 (got " +
                          std::to_string(max_norm) + ")");
  const double coefficient = max_norm / (norm + 1e-6);
  return coefficient < 1.0 ? coefficient : 1.0;
}

}  // namespace coltrain::optim
