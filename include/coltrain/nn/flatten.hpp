#pragma once
// Flatten: a sample of any shape becomes a vector in row-major (C, H, W) order, as torch.nn.Flatten
// does, so the Linear layer after it has PyTorch's weight layout.

#include <coltrain/core/config.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <string>

namespace coltrain::nn {

template <class In, class T, class Device>
class FlattenLayer : public ParameterFreeLayer<In, Flat<In::kSize>> {
 public:
  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>&) {
    std::copy_n(in.data(), in.numel(), out.data());
  }

  void backward(tensor::TensorView<const T, Device>, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>&) {
    if (!grad_in.empty()) std::copy_n(grad_out.data(), grad_out.numel(), grad_in.data());
  }
};

// torch.nn.Flatten.
struct Flatten {
  template <class In, class T, class Device>
  using Bind = FlattenLayer<In, T, Device>;
};

}  // namespace coltrain::nn
