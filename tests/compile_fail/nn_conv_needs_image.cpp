// Must-not-compile test: a convolution after Flatten gets a flat sample, which has no image to
// convolve, and has to stop the build with Conv2d's static_assert. Compiled as is (the convolution
// before Flatten) the file must build; with COLTRAIN_SHOULD_FAIL it must fail with this message:
// expected-error: Conv2d: the input must be an image

#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/sequential.hpp>

namespace nn = coltrain::nn;

#ifdef COLTRAIN_SHOULD_FAIL
using Model = nn::Sequential<nn::Input<3, 8, 8>, nn::Flatten, nn::Conv2d<4, 3>, nn::Linear<10>>;
#else
using Model = nn::Sequential<nn::Input<3, 8, 8>, nn::Conv2d<4, 3>, nn::Flatten, nn::Linear<10>>;
#endif

int main() {
  nn::Network<Model> net;
  return 0;
}
