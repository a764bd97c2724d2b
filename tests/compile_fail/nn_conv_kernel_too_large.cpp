// Must-not-compile test: a convolution whose kernel does not fit in the (padded) input image has to
// stop the build with Conv2d's static_assert. Compiled as is (a 5x5 kernel on a 5x5 image) the file
// must build; with COLTRAIN_SHOULD_FAIL (a 7x7 kernel on it) it must fail with this message:
// expected-error: Conv2d: the kernel is larger than the padded input image

#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/sequential.hpp>

namespace nn = coltrain::nn;

#ifdef COLTRAIN_SHOULD_FAIL
using Model = nn::Sequential<nn::Input<1, 5, 5>, nn::Conv2d<8, 7>>;
#else
using Model = nn::Sequential<nn::Input<1, 5, 5>, nn::Conv2d<8, 5>>;
#endif

int main() {
  nn::Network<Model> net;
  return nn::Network<Model>::Output::kSize == 8 ? 0 : 1;
}
