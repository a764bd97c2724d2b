// Must-not-compile test: an identity shortcut around a body that changes the sample's shape (here a
// stride-2 convolution to more channels) cannot be added to the body's output, and has to stop the
// build with Residual's static_assert. Compiled as is (the body keeps the shape) the file must
// build; with COLTRAIN_SHOULD_FAIL it must fail with this message:
// expected-error: Residual: the body changes the sample shape

#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/residual.hpp>
#include <coltrain/nn/sequential.hpp>

namespace nn = coltrain::nn;

#ifdef COLTRAIN_SHOULD_FAIL
using Body = nn::Sequential<nn::Conv2d<8, 3, 2, 1>>;
#else
using Body = nn::Sequential<nn::Conv2d<4, 3, 1, 1>>;
#endif
using Model = nn::Sequential<nn::Input<4, 8, 8>, nn::Residual<Body>>;

int main() {
  nn::Network<Model> net;
  return nn::Network<Model>::kParameterCount > 0 ? 0 : 1;
}
