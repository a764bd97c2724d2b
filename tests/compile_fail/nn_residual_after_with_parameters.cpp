// Must-not-compile test: Residual's After is applied to the sum of body and shortcut and must be a
// parameter-free activation; a layer with parameters there (BatchNorm2d) would be outside the
// block's state_dict names, so it has to stop the build. Compiled as is (ReLU) the file must build;
// with COLTRAIN_SHOULD_FAIL it must fail with this message:
// expected-error: Residual: After must be a parameter-free activation

#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/residual.hpp>
#include <coltrain/nn/sequential.hpp>

namespace nn = coltrain::nn;

#ifdef COLTRAIN_SHOULD_FAIL
using After = nn::BatchNorm2d<>;
#else
using After = nn::ReLU;
#endif
using Body = nn::Sequential<nn::Conv2d<4, 3, 1, 1>>;
using Model = nn::Sequential<nn::Input<4, 8, 8>, nn::Residual<Body, nn::IdentityShortcut, After>>;

int main() {
  nn::Network<Model> net;
  return nn::Network<Model>::kParameterCount > 0 ? 0 : 1;
}
