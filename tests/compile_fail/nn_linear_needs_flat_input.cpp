// Must-not-compile test: a Linear layer right after an image input has to stop the build with the
// layer's own static_assert, which tells the user to put Flatten before it. Compiled as is (Flatten
// in place) the file must build; with COLTRAIN_SHOULD_FAIL it must fail with this message:
// expected-error: Linear: the input must be flat

#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/sequential.hpp>

namespace nn = coltrain::nn;

#ifdef COLTRAIN_SHOULD_FAIL
using Model = nn::Sequential<nn::Input<1, 28, 28>, nn::Linear<10>>;
#else
using Model = nn::Sequential<nn::Input<1, 28, 28>, nn::Flatten, nn::Linear<10>>;
#endif

int main() {
  nn::Network<Model> net;
  return nn::Network<Model>::kParameterCount == 7850 ? 0 : 1;
}
