#pragma once
// Dropout<P>: in training, zeroes each element with probability P and scales the rest by 1/(1-P)
// (torch.nn.Dropout); in evaluation, the identity. Masks are a hash of (seed, step, layer,
// element), so they do not depend on thread scheduling and a resumed run draws the same ones.

#include <coltrain/core/config.hpp>
#include <coltrain/nn/compute_precision.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace coltrain::nn {

template <double P, class In, class T, class Device>
class DropoutLayer : public ParameterFreeLayer<In, In> {
  static_assert(P >= 0.0 && P < 1.0,
                "coltrain::nn::Dropout: the drop probability must lie in [0, 1)");
  using S = compute_t<T>;
  static constexpr S kScale = static_cast<S>(1.0 / (1.0 - P));

 public:
  // Draws the layer's identity from the initialisation stream, so two Dropout layers differ.
  void initialize(Rng& rng) { salt_ = rng.next(); }

  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    active_ = ctx.training() && P > 0.0;
    if (!active_) {
      std::copy_n(in.data(), in.numel(), out.data());
      return;
    }
    mask_.resize(in.shape());
    const std::uint64_t key = hash_key(ctx.seed(), ctx.step(), salt_);
    ctx.pool().parallel_for(in.numel(), [&](std::int64_t begin, std::int64_t end, int) {
      draw_and_apply(in.data(), out.data(), mask_.data(), key, begin, end);
    });
  }

  void backward(tensor::TensorView<const T, Device>, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    if (grad_in.empty()) return;
    const T* dy = grad_out.data();
    T* dx = grad_in.data();
    if (!active_) {
      std::copy_n(dy, grad_out.numel(), dx);
      return;
    }
    ctx.pool().parallel_for(grad_out.numel(), [&](std::int64_t begin, std::int64_t end, int) {
      apply_mask(dy, dx, mask_.data(), begin, end);
    });
  }

 private:
  // Keeps element i where hash_uniform(seed, step, salt, i) >= P, decided on the integer draw. The
  // arguments are locals on purpose: a store through the uint8_t mask may alias any object in
  // memory (a lambda's captures too), which would reload them every element and keep the loop from
  // vectorising.
  static void draw_and_apply(const T* x, T* y, std::uint8_t* keep, std::uint64_t key,
                             std::int64_t begin, std::int64_t end) {
    constexpr std::uint64_t kThreshold = uniform_threshold(P);
    if constexpr (kThreshold == 0) {  // P = 0 keeps every element (and nvcc warns on `u >= 0`)
      for (std::int64_t i = begin; i < end; ++i) keep[i] = 1;
    } else {
      for (std::int64_t i = begin; i < end; ++i)
        keep[i] = hash_bits(key, static_cast<std::uint64_t>(i)) >= kThreshold ? 1 : 0;
    }
    apply_mask(x, y, keep, begin, end);
  }

  static void apply_mask(const T* x, T* y, const std::uint8_t* keep, std::int64_t begin,
                         std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
      y[i] =
          detail::to_storage_value<T>(keep[i] ? detail::to_compute_value<S>(x[i]) * kScale : S(0));
  }

  std::uint64_t salt_ = 0;
  bool active_ = false;
  tensor::Tensor<std::uint8_t, Device> mask_;
};

// torch.nn.Dropout(p=P).
template <double P>
struct Dropout {
  template <class In, class T, class Device>
  using Bind = DropoutLayer<P, In, T, Device>;
};

}  // namespace coltrain::nn
