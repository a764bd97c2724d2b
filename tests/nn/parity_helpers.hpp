#pragma once
// Helpers of the nn parity suites (test_layer_parity.cpp, test_model_parity.cpp): loading a PyTorch
// state_dict into a coltrain network by name, and comparing tensors with a per-tensor tolerance.
//
// compare(): max_i |a_i - e_i| <= rel * max(max_i |e_i|, 1e-6), i.e. relative to the tensor's
// largest magnitude (a tensor of zeros is held to 1e-6 absolute). The worst error of each
// comparison is printed when NN_PARITY_REPORT is set.

#include <catch2/catch.hpp>

#include <coltrain/core/json.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/safetensors.hpp>
#include <coltrain/tensor/tensor.hpp>

#include "../support/parity.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace nn_parity {

namespace nn = coltrain::nn;
namespace tensor = coltrain::tensor;
using coltrain::Json;
using coltrain::testing::parity_reference;
using coltrain::testing::require_close;
using Reader = tensor::SafetensorsReader;

inline constexpr double kRel = 1e-5;
inline constexpr double kTrainingRel = 1e-4;
inline constexpr double kFloor = 1e-6;
// ResNet-20's float32 loss curve (chaotic, see its test case): with Winograd F(4x4, 3x3), whose
// outputs round about 5e-6 of their largest value away from the direct product's, the five losses
// measured 2e-7, 5e-8, 9e-5, 1.7e-3 and 8.6e-3 from PyTorch's, growing about 20x a step.
inline constexpr double kResNetRunRel = 2e-2;

// Checks max|a - e| <= rel * max(max|e|, kFloor), reporting the worst element, and returns the
// error max|a - e| / max(max|e|, kFloor).
template <class T>
double compare(std::span<const T> actual, std::span<const T> expected, double rel,
               const std::string& what) {
  double largest = 0.0, worst = 0.0;
  for (std::size_t i = 0; i < std::min(actual.size(), expected.size()); ++i) {
    largest = std::max(largest, std::abs(static_cast<double>(expected[i])));
    worst = std::max(worst,
                     std::abs(static_cast<double>(actual[i]) - static_cast<double>(expected[i])));
  }
  const double scale = std::max(largest, kFloor);
  if (std::getenv("NN_PARITY_REPORT"))
    std::printf("[parity] %-60s %.3e\n", what.c_str(), worst / scale);
  require_close(actual, expected, rel, scale, what);
  return worst / scale;
}

template <class T>
double compare(const std::vector<T>& actual, const std::vector<T>& expected, double rel,
               const std::string& what) {
  return compare(std::span<const T>(actual), std::span<const T>(expected), rel, what);
}

inline std::vector<std::int64_t> dims_of(const tensor::Shape& shape) {
  return {shape.dims().begin(), shape.dims().end()};
}

// The names after `prefix` of the reference's tensors that start with it.
inline std::set<std::string> names_under(const Reader& reference, const std::string& prefix) {
  std::set<std::string> names;
  for (const auto& entry : reference.entries())
    if (entry.name.starts_with(prefix)) names.insert(entry.name.substr(prefix.size()));
  return names;
}

// Copies the reference's "<prefix><name>" tensors into the network's parameters and buffers of the
// same names and shapes; PyTorch's and coltrain's name sets must be equal.
template <class Net>
void load_state(Net& net, const Reader& reference, const std::string& prefix) {
  std::set<std::string> ours;
  auto load = [&](const std::string& name, auto span, const tensor::Shape& shape) {
    using U = std::remove_cvref_t<decltype(span[0])>;
    INFO("state_dict entry " << name);
    ours.insert(name);
    REQUIRE(reference.contains(prefix + name));
    CHECK(reference.entry(prefix + name).shape == dims_of(shape));
    reference.read_into<U>(prefix + name, span);
  };
  net.visit_parameters(
      [&](const std::string& name, auto& p) { load(name, p.value.span(), p.value.shape()); });
  net.visit_buffers([&](const std::string& name, auto& t) { load(name, t.span(), t.shape()); });
  CHECK(ours == names_under(reference, prefix));
}

enum class Parameters { kValues, kGradients, kSkip };

// Compares the network's parameter values or gradients, and optionally its buffers, with the
// reference's "<prefix><name>" tensors; the name sets must be equal.
template <class Net>
double compare_state(Net& net, const Reader& reference, const std::string& prefix,
                     Parameters parameters, bool buffers, double rel, const std::string& what) {
  double worst = 0.0;
  std::set<std::string> ours;
  if (parameters != Parameters::kSkip) {
    net.visit_parameters([&](const std::string& name, auto& p) {
      ours.insert(name);
      using P = typename std::remove_cvref_t<decltype(p.value)>::value_type;
      const auto& t = parameters == Parameters::kGradients ? p.grad : p.value;
      worst = std::max(worst, compare(std::span<const P>(t.span()),
                                      std::span<const P>(reference.read<P>(prefix + name)), rel,
                                      what + " " + prefix + name));
    });
  }
  if (buffers) {
    net.visit_buffers([&](const std::string& name, auto& t) {
      ours.insert(name);
      using U = typename std::remove_cvref_t<decltype(t)>::value_type;
      const std::vector<U> expected = reference.read<U>(prefix + name);
      if constexpr (std::is_same_v<U, std::int64_t>) {
        INFO(what << " " << prefix << name);
        CHECK(std::vector<U>(t.span().begin(), t.span().end()) == expected);
      } else {
        worst = std::max(worst, compare(std::span<const U>(t.span()), std::span<const U>(expected),
                                        rel, what + " " + prefix + name));
      }
    });
  }
  CHECK(ours == names_under(reference, prefix));
  return worst;
}

inline tensor::Tensor<float> read_tensor(const Reader& reference, const std::string& name) {
  tensor::Tensor<float> t(
      tensor::Shape(std::span<const std::int64_t>(reference.entry(name).shape)));
  reference.read_into<float>(name, t.span());
  return t;
}

inline Json config_of(const Reader& reference) {
  return Json::parse(reference.metadata().at("config"));
}

// A JSON array of integers (a shape).
inline std::vector<std::int64_t> int64s_of(const Json& array) {
  std::vector<std::int64_t> out;
  for (const Json& value : array.elements()) out.push_back(value.get<std::int64_t>());
  return out;
}

}  // namespace nn_parity
