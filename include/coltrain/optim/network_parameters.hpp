#pragma once
// The bridge from a network to an optimizer: every parameter of a network (anything with
// visit_parameters(f), such as nn::Network) as TypedParamRef views, in state_dict order.

#include <coltrain/core/config.hpp>
#include <coltrain/optim/parameter_ref.hpp>

#include <string>
#include <vector>

namespace coltrain::optim {

template <class Network>
std::vector<TypedParamRef<typename Network::value_type>> parameters_of(Network& network) {
  std::vector<TypedParamRef<typename Network::value_type>> refs;
  network.visit_parameters([&](const std::string& name, auto& parameter) {
    refs.push_back({name, parameter.value.span(), parameter.grad.span()});
  });
  return refs;
}

}  // namespace coltrain::optim
