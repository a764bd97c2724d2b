#pragma once
// Dropout<P>: in training, zeroes each element with probability P and scales the rest by 1/(1-P)
// (torch.nn.Dropout); in evaluation, the identity. Masks are a hash of (seed, step, layer, element),
// so they do not depend on thread scheduling and a resumed run draws the same ones.

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
class DropoutLayer {
  static_assert(P >= 0.0 && P < 1.0, "coltrain::nn::Dropout: the drop probability must lie in [0, 1)");
  using S = compute_t<T>;

 public:
  using Input = In;
  using Output = In;
  static constexpr std::size_t kParameterCount = 0;

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
    const T* x = in.data();
    T* y = out.data();
    std::uint8_t* keep = mask_.data();
    const S scale = static_cast<S>(1.0 / (1.0 - P));
    const std::uint64_t seed = ctx.seed(), step = ctx.step();
    ctx.pool().parallel_for(in.numel(), [&](std::int64_t begin, std::int64_t end, int) {
      for (std::int64_t i = begin; i < end; ++i) {
        keep[i] = hash_uniform(seed, step, salt_, static_cast<std::uint64_t>(i)) >= P ? 1 : 0;
        y[i] = detail::to_storage_value<T>(keep[i] ? detail::to_compute_value<S>(x[i]) * scale : S(0));
      }
    });
  }

  void backward(tensor::TensorView<const T, Device>, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>&) {
    if (grad_in.empty()) return;
    const T* dy = grad_out.data();
    T* dx = grad_in.data();
    if (!active_) {
      std::copy_n(dy, grad_out.numel(), dx);
      return;
    }
    const std::uint8_t* keep = mask_.data();
    const S scale = static_cast<S>(1.0 / (1.0 - P));
    for (std::int64_t i = 0, n = grad_out.numel(); i < n; ++i)
      dx[i] = detail::to_storage_value<T>(keep[i] ? detail::to_compute_value<S>(dy[i]) * scale : S(0));
  }

  template <class F>
  void visit_parameters(F&&, const std::string&) {}
  template <class F>
  void visit_buffers(F&&, const std::string&) {}

 private:
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
