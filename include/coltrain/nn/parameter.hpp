#pragma once
// A learnable tensor and its gradient, in the layout of PyTorch's state_dict (Linear weight
// [out, in], Conv2d weight [out, in, kh, kw]), so that checkpoints and references interoperate.

#include <coltrain/core/config.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cstdint>
#include <string>

namespace coltrain::nn {

template <class T, class Device>
struct Parameter {
  explicit Parameter(tensor::Shape shape) : value(shape), grad(shape) {}

  tensor::Tensor<T, Device> value;
  // Backward passes add to it (gradient accumulation); the network's zero_grad() clears it.
  tensor::Tensor<T, Device> grad;
};

// The parameters of a layer with a weight and an optional bias (Linear and Conv2d, on every
// device), visited under PyTorch's names. Without a bias, bias_ holds no elements and is not
// visited. The layer brings weight_ and bias_ into scope with using-declarations (members of a
// dependent base are not found unqualified).
template <class T, class Device, bool HasBias>
class WeightAndBias {
 public:
  template <class F>
  void visit_parameters(F&& f, const std::string& prefix) {
    f(prefix + "weight", weight_);
    if constexpr (HasBias) f(prefix + "bias", bias_);
  }
  template <class F>
  void visit_buffers(F&&, const std::string&) {}

 protected:
  WeightAndBias(tensor::Shape weight_shape, std::int64_t outputs)
      : weight_(weight_shape), bias_({HasBias ? outputs : 0}) {}

  Parameter<T, Device> weight_;
  Parameter<T, Device> bias_;
};

}  // namespace coltrain::nn
