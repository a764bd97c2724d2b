#pragma once
// Helpers shared by the nn test suites: a probe layer that records the gradient reaching a
// network's input, seeded fills, and copying a network's state into another of a different element
// type.

#include <coltrain/core/dtype.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace nn_test {

namespace nn = coltrain::nn;
namespace tensor = coltrain::tensor;

// The identity, written against the layer protocol as a user would write a layer. Placed first in
// a network (whose first layer gets no input gradient), it records d(objective)/d(input) of the layer
// after it, which is the gradient with respect to the network's input.
template <class In, class T, class Device>
class GradProbeLayer {
 public:
  using Input = In;
  using Output = In;
  static constexpr std::size_t kParameterCount = 0;

  void initialize(nn::Rng&) {}

  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               nn::Context<Device>&) {
    std::copy_n(in.data(), in.numel(), out.data());
  }

  void backward(tensor::TensorView<const T, Device>, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                nn::Context<Device>&) {
    captured.resize(grad_out.shape());
    std::copy_n(grad_out.data(), grad_out.numel(), captured.data());
    if (!grad_in.empty()) std::copy_n(grad_out.data(), grad_out.numel(), grad_in.data());
  }

  template <class F>
  void visit_parameters(F&&, const std::string&) {}
  template <class F>
  void visit_buffers(F&&, const std::string&) {}

  tensor::Tensor<T, Device> captured;  // the gradient of the last backward
};

struct GradProbe {
  template <class In, class T, class Device>
  using Bind = GradProbeLayer<In, T, Device>;
};

// Converts between element types, through float for the 16-bit ones.
template <class To, class From>
To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<To, coltrain::half> || std::is_same_v<To, coltrain::bfloat16>) {
    return To(static_cast<float>(value));
  } else if constexpr (std::is_same_v<From, coltrain::half> ||
                       std::is_same_v<From, coltrain::bfloat16>) {
    return static_cast<To>(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

template <class T>
double as_double(T value) {
  if constexpr (std::is_same_v<T, coltrain::half> || std::is_same_v<T, coltrain::bfloat16>)
    return static_cast<double>(static_cast<float>(value));
  else
    return static_cast<double>(value);
}

// Uniform values in [low, high) from a seeded SplitMix64 stream (the same on every platform).
template <class T>
void fill_uniform(std::span<T> values, std::uint64_t seed, double low, double high) {
  nn::Rng rng(seed);
  for (T& v : values) v = convert<T>(rng.uniform(low, high));
}

// Magnitudes in [low, high) with random signs: keeps values away from ReLU's kink at zero.
inline void fill_away_from_zero(std::span<double> values, std::uint64_t seed, double low,
                                double high) {
  nn::Rng rng(seed);
  for (double& v : values) {
    const double magnitude = rng.uniform(low, high);
    v = (rng.next() & 1) ? magnitude : -magnitude;
  }
}

// Pairwise distinct values, at least `gap` apart, in random order and centred on zero: no ties for
// max pooling, and no tie is crossed by a perturbation smaller than gap / 2.
inline void fill_distinct(std::span<double> values, std::uint64_t seed, double gap) {
  std::vector<std::size_t> order(values.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  nn::Rng rng(seed);
  for (std::size_t i = order.size(); i > 1; --i)
    std::swap(order[i - 1], order[static_cast<std::size_t>(rng.next() % i)]);
  const double centre = 0.5 * static_cast<double>(values.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = gap * (static_cast<double>(order[i]) - centre);
}

// Copies every parameter and buffer of `from` into `to` by name, converting the element types; both
// networks must have the same names.
template <class From, class To>
void copy_state(From& from, To& to) {
  std::map<std::string, std::vector<double>> values;
  from.visit_parameters([&](const std::string& name, auto& p) {
    std::vector<double>& v = values[name];
    for (const auto& x : p.value.span()) v.push_back(as_double(x));
  });
  from.visit_buffers([&](const std::string& name, auto& t) {
    std::vector<double>& v = values["buffer:" + name];
    for (const auto& x : t.span()) v.push_back(as_double(x));
  });
  auto assign = [&](const std::string& key, auto span) {
    const auto found = values.find(key);
    if (found == values.end() || found->second.size() != span.size())
      throw std::logic_error("copy_state: no matching tensor for " + key);
    using U = std::remove_cvref_t<decltype(span[0])>;
    for (std::size_t i = 0; i < span.size(); ++i) span[i] = convert<U>(found->second[i]);
  };
  to.visit_parameters([&](const std::string& name, auto& p) { assign(name, p.value.span()); });
  to.visit_buffers([&](const std::string& name, auto& t) { assign("buffer:" + name, t.span()); });
}

}  // namespace nn_test
