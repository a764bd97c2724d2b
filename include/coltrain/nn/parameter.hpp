#pragma once
// A learnable tensor and its gradient, in the layout of PyTorch's state_dict (Linear weight
// [out, in], Conv2d weight [out, in, kh, kw]), so that checkpoints and references interoperate.

#include <coltrain/core/config.hpp>
#include <coltrain/tensor/tensor.hpp>

namespace coltrain::nn {

template <class T, class Device>
struct Parameter {
  explicit Parameter(tensor::Shape shape) : value(shape), grad(shape) {}

  tensor::Tensor<T, Device> value;
  // Backward passes add to it (gradient accumulation); the network's zero_grad() clears it.
  tensor::Tensor<T, Device> grad;
};

}  // namespace coltrain::nn
