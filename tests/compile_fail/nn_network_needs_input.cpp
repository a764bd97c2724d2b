// Must-not-compile test: a Network's model must declare the shape of its samples with Input<...> as
// its first entry; without it the build has to stop with Network's static_assert, not an error deep
// inside a layer. Compiled as is (Input<1, 28, 28> first) the file must build; with
// COLTRAIN_SHOULD_FAIL it must fail with this message:
// expected-error: Network: the model must start with Input

#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/sequential.hpp>

namespace nn = coltrain::nn;

#ifdef COLTRAIN_SHOULD_FAIL
using Model = nn::Sequential<nn::Flatten, nn::Linear<10>>;
#else
using Model = nn::Sequential<nn::Input<1, 28, 28>, nn::Flatten, nn::Linear<10>>;
#endif

int main() {
  nn::Network<Model> net;
  return 0;
}
