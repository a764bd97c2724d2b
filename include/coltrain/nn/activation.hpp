#pragma once
// ReLU: max(x, 0), elementwise, any shape; NaN stays NaN (torch.relu). The gradient passes where the
// output is positive.

#include <coltrain/core/config.hpp>
#include <coltrain/nn/compute_precision.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cstdint>
#include <string>

namespace coltrain::nn {

namespace detail {
// Plain loops over restrict pointers with a local zero: nothing the compiler must assume aliases the
// output, so both vectorise into compare-and-select.
template <class T>
void relu_forward(const T* COLTRAIN_RESTRICT x, T* COLTRAIN_RESTRICT y, std::int64_t n) {
  const T zero = to_storage_value<T>(compute_t<T>(0));
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    y[i] = to_compute_value<compute_t<T>>(v) < 0 ? zero : v;  // NaN passes through, as torch.relu
  }
}

template <class T>
void relu_backward(const T* COLTRAIN_RESTRICT y, const T* COLTRAIN_RESTRICT dy, T* COLTRAIN_RESTRICT dx,
                   std::int64_t n) {
  const T zero = to_storage_value<T>(compute_t<T>(0));
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = dy[i];
    dx[i] = to_compute_value<compute_t<T>>(y[i]) > 0 ? g : zero;
  }
}

}  // namespace detail

template <class In, class T, class Device>
class ReluLayer : public ParameterFreeLayer<In, In> {
 public:
  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const T* x = in.data();
    T* y = out.data();
    detail::parallel_range(ctx, in.numel(), in.numel(), [=](std::int64_t begin, std::int64_t end) {
      detail::relu_forward(x + begin, y + begin, end - begin);
    });
  }

  void backward(tensor::TensorView<const T, Device>, tensor::TensorView<const T, Device> out,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    if (grad_in.empty()) return;
    const T* y = out.data();
    const T* dy = grad_out.data();
    T* dx = grad_in.data();
    detail::parallel_range(ctx, out.numel(), out.numel(), [=](std::int64_t begin, std::int64_t end) {
      detail::relu_backward(y + begin, dy + begin, dx + begin, end - begin);
    });
  }
};

// torch.nn.ReLU.
struct ReLU {
  template <class In, class T, class Device>
  using Bind = ReluLayer<In, T, Device>;
};

}  // namespace coltrain::nn
