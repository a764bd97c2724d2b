#pragma once
// ParameterVisitor and BufferVisitor: a network's visitor of its parameters or buffers, held by
// reference and called through a function pointer.
//
// Why: the walk over the layers is a template instantiated for every visitor type, and a network
// has many visitors (the state dict, checkpoints, optimizers, data-parallel broadcasts and
// averages), all outside the training step. Network hands the layers one of these instead of the
// caller's lambda, so each layer's walk is compiled once per network: for ResNet-20 on the GPU
// that was 150 KB of host code, compiled three times over by nvcc's passes.

#include <coltrain/nn/compute_precision.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace coltrain::nn {

// Calls f(name, Parameter<T, Device>&).
template <class T, class Device>
class ParameterVisitor {
 public:
  template <class F>
  explicit ParameterVisitor(F& f)
      : f_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* g, const std::string& name, Parameter<T, Device>& p) {
          (*static_cast<F*>(g))(name, p);
        }) {}

  void operator()(const std::string& name, Parameter<T, Device>& p) const { call_(f_, name, p); }

 private:
  void* f_;
  void (*call_)(void*, const std::string&, Parameter<T, Device>&);
};

// Calls f(name, buffer) for the buffers a layer of storage type T keeps: statistics in its compute
// type (BatchNorm's running mean and variance) and counters (num_batches_tracked).
template <class T, class Device>
class BufferVisitor {
 public:
  using Statistics = tensor::Tensor<compute_t<T>, Device>;
  using Counter = tensor::Tensor<std::int64_t, Device>;

  template <class F>
  explicit BufferVisitor(F& f)
      : f_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        statistics_([](void* g, const std::string& name, Statistics& b) {
          (*static_cast<F*>(g))(name, b);
        }),
        counter_(
            [](void* g, const std::string& name, Counter& b) { (*static_cast<F*>(g))(name, b); }) {}

  void operator()(const std::string& name, Statistics& b) const { statistics_(f_, name, b); }
  void operator()(const std::string& name, Counter& b) const { counter_(f_, name, b); }

 private:
  void* f_;
  void (*statistics_)(void*, const std::string&, Statistics&);
  void (*counter_)(void*, const std::string&, Counter&);
};

}  // namespace coltrain::nn
