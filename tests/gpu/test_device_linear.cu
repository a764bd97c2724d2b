// Linear on the GPU against the CPU layer (layer_pair_checks.hpp), for the shapes of the models
// (the MLP's 784 -> 128 -> 256 -> 10, MnistConvNet's 9216 -> 128, ResNet's 64 -> 10 head) and
// one without bias, in fp32, fp16 and bf16, at batch sizes 5, 8 and 5 again.

#include "layer_pair_checks.hpp"

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/nn/linear.cuh>
#include <coltrain/nn/linear.hpp>
#include <coltrain/tensor/shape.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

namespace {

using namespace layer_checks;
using coltrain::tensor::Flat;

template <class Spec, class In, class T>
void check_layer(const char* name) {
  LayerPair<Spec, In, T> layers;
  const std::string what = std::string(name) + " " + type_name<T>();
  for (const std::int64_t batch : {5, 8, 5}) check_batch(layers, batch, what);
}

template <class Spec, class In>
void check_all_types(const char* name) {
  check_layer<Spec, In, float>(name);
  check_layer<Spec, In, coltrain::half>(name);
  check_layer<Spec, In, coltrain::bfloat16>(name);
}

}  // namespace

TEST_CASE("Linear on the GPU: the MLP's layers (784 -> 128 -> 256 -> 10)") {
  check_all_types<nn::Linear<128>, Flat<784>>("mlp fc1");
  check_all_types<nn::Linear<256>, Flat<128>>("mlp fc2");
  check_all_types<nn::Linear<10>, Flat<256>>("mlp fc3");
}

TEST_CASE("Linear on the GPU: MnistConvNet fc1 (9216 -> 128) and ResNet's head (64 -> 10)") {
  check_all_types<nn::Linear<128>, Flat<9216>>("mnist fc1");
  check_all_types<nn::Linear<10>, Flat<64>>("resnet head");
}

TEST_CASE("Linear on the GPU: without bias, odd sizes") {
  check_all_types<nn::Linear<7, false>, Flat<13>>("no bias 13 -> 7");
}

TEST_CASE("Linear on the GPU: forward and backward replay as a CUDA graph") {
  const auto as_is = [](auto&) {};
  check_graph_capture<nn::Linear<128>, Flat<784>, coltrain::half>(as_is, "mlp fc1");
  check_graph_capture<nn::Linear<10>, Flat<64>, float>(as_is, "resnet head");
}

TEST_CASE("Linear on the GPU: wrong shapes are errors") {
  nn::bind_t<nn::Linear<4>, Flat<6>, float, Cuda> layer;
  nn::Context<Cuda> ctx;
  tensor::Tensor<float, Cuda> x(tensor::Shape{3, 6}), y(tensor::Shape{3, 5});
  CHECK_THROWS_AS(layer.forward(x.view(), y.view(), ctx), coltrain::InvalidArgument);
}
