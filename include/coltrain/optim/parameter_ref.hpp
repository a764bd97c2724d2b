#pragma once
// How parameters reach the optimizers: as views, so that any layer (or a flat buffer of a
// data-parallel bucket) can hand its values and gradients over without the optimizers knowing the
// layer types. MasterParamRef<T> is the view the optimizers update, in the type they compute in
// (ParamRef: float; double under the Fp64 policy); TypedParamRef<T> is a model's view in its
// storage type, which PrecisionOptimizer turns into MasterParamRefs (directly for fp32 and fp64,
// through fp32 master copies for half and bfloat16).

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <cstddef>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace coltrain::optim {

// One parameter as the optimizer sees it: values updated in place, gradients read only. The name is
// PyTorch's state_dict key ("conv1.weight"); it names the parameter in errors and in
// for_each_state. weight_decay = false exempts the parameter from weight decay (biases and norm
// layers, which PyTorch expresses as a param group with weight_decay 0). T is float, or double
// under the Fp64 policy.
template <class T>
struct MasterParamRef {
  using value_type = T;
  std::string_view name;
  std::span<T> value;
  std::span<const T> grad;
  bool weight_decay = true;
};

using ParamRef = MasterParamRef<float>;

// A model's parameter in its own storage type T (float, double, half, bfloat16). The gradient is mutable
// because an fp32 policy with loss scaling unscales it in place, as torch's GradScaler.unscale_.
template <class T>
struct TypedParamRef {
  std::string name;
  std::span<T> value;
  std::span<T> grad;
  bool weight_decay = true;
};

namespace detail {

// The name used in messages and state names; unnamed parameters are known by their index, as in
// PyTorch's optimizer state_dict.
inline std::string param_label(std::string_view name, std::size_t index) {
  return name.empty() ? std::to_string(index) : std::string(name);
}

inline void check_sizes(std::string_view name, std::size_t index, std::size_t value_size,
                        std::size_t grad_size) {
  if (value_size != grad_size) {
    throw InvalidArgument("parameter '" + param_label(name, index) + "' has " +
                          std::to_string(value_size) + " values but " + std::to_string(grad_size) +
                          " gradients");
  }
}

}  // namespace detail

// Throws InvalidArgument naming the parameter unless its values and gradients have the same size.
template <class T>
void check_param_ref(const MasterParamRef<T>& param, std::size_t index = 0) {
  detail::check_sizes(param.name, index, param.value.size(), param.grad.size());
}

template <class T>
void check_param_ref(const TypedParamRef<T>& param, std::size_t index = 0) {
  detail::check_sizes(param.name, index, param.value.size(), param.grad.size());
}

namespace detail {

// The parameter layout an optimizer's state is keyed by. The first step records it; every later
// step must pass the same parameters in the same order, since state is found by index: a changed
// count, size or name means the state would be applied to the wrong tensor.
class ParamLayout {
 public:
  // Checks every parameter, then records or compares the layout. Throws before anything changes.
  template <class T>
  void bind(std::span<const MasterParamRef<T>> params, std::string_view optimizer) {
    for (std::size_t i = 0; i < params.size(); ++i) check_param_ref(params[i], i);
    if (!bound_) {
      names_.clear();
      sizes_.clear();
      for (std::size_t i = 0; i < params.size(); ++i) {
        names_.push_back(param_label(params[i].name, i));
        sizes_.push_back(params[i].value.size());
      }
      bound_ = true;
      return;
    }
    if (params.size() != sizes_.size()) {
      throw InvalidArgument(std::string(optimizer) + " was stepped with " +
                            std::to_string(sizes_.size()) + " parameters before, now " +
                            std::to_string(params.size()) +
                            "; pass the same parameters in the same order every step");
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string label = param_label(params[i].name, i);
      if (label != names_[i] || params[i].value.size() != sizes_[i]) {
        throw InvalidArgument(std::string(optimizer) + ": parameter #" + std::to_string(i) +
                              " was '" + names_[i] + "' with " + std::to_string(sizes_[i]) +
                              " elements, now '" + label + "' with " +
                              std::to_string(params[i].value.size()) +
                              " elements; pass the same parameters in the same order every step");
      }
    }
  }

  bool bound() const { return bound_; }
  std::size_t size() const { return sizes_.size(); }
  const std::string& name(std::size_t index) const { return names_[index]; }
  std::size_t elements(std::size_t index) const { return sizes_[index]; }

 private:
  std::vector<std::string> names_;
  std::vector<std::size_t> sizes_;
  bool bound_ = false;
};

// A double as a person would write it (0.001, not std::to_string's 0.001000).
inline std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Learning rates come from schedules; a negative or NaN one is a bug upstream, not a step to take.
inline void check_lr(double lr, std::string_view optimizer) {
  if (!(lr >= 0.0)) {
    throw InvalidArgument(std::string(optimizer) + ": invalid learning rate " + number_text(lr) +
                          " (must be >= 0)");
  }
}

}  // namespace detail
}  // namespace coltrain::optim
