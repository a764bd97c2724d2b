// Conv2d and Conv2dReLU on the GPU against the CPU layers (layer_pair_checks.hpp), for the shapes
// of the models (MnistConvNet's conv1 and conv2, ResNet-20's stem, its 3x3 stride-1 and stride-2
// convolutions and 1x1 stride-2 projections at 16, 32 and 64 channels) and odd ones (5x5 stride 2
// on an 11x13 image with bias and no ReLU, ReLU without bias), through both engines (cuDNN where
// the build has it, im2col + cuBLAS always), in fp32, fp16 and bf16, at batch sizes 3, 8 and 3
// again (a batch size already set up).

#include "layer_pair_checks.hpp"

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/nn/conv2d.cuh>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/tensor/shape.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace {

using namespace layer_checks;
using coltrain::nn::ConvolutionBackend;
using coltrain::tensor::StaticShape;

const char* backend_name(ConvolutionBackend backend) {
  return backend == ConvolutionBackend::kCudnn ? "cudnn" : "im2col";
}

std::vector<ConvolutionBackend> backends() {
  std::vector<ConvolutionBackend> all{ConvolutionBackend::kIm2colGemm};
  if (coltrain::BuildConfig::kWithCudnn) all.push_back(ConvolutionBackend::kCudnn);
  return all;
}

template <class Spec, class In, class T>
void check_layer(const char* name) {
  for (const ConvolutionBackend backend : backends()) {
    LayerPair<Spec, In, T> layers;
    layers.gpu.set_backend(backend);
    REQUIRE(layers.gpu.backend() == backend);
    const std::string what = std::string(name) + " " + type_name<T>() + " " + backend_name(backend);
    for (const std::int64_t batch : {3, 8, 3}) check_batch(layers, batch, what);
  }
}

template <class Spec, class In>
void check_all_types(const char* name) {
  check_layer<Spec, In, float>(name);
  check_layer<Spec, In, coltrain::half>(name);
  check_layer<Spec, In, coltrain::bfloat16>(name);
}

}  // namespace

TEST_CASE("Conv2dReLU on the GPU: MnistConvNet conv1 (1 -> 32, 28x28, bias)") {
  check_all_types<nn::Conv2dReLU<32, 3>, StaticShape<1, 28, 28>>("mnist conv1");
}

TEST_CASE("Conv2dReLU on the GPU: MnistConvNet conv2 (32 -> 64, 26x26, bias)") {
  check_all_types<nn::Conv2dReLU<64, 3>, StaticShape<32, 26, 26>>("mnist conv2");
}

TEST_CASE("Conv2d on the GPU: ResNet-20 stem (3 -> 16, 3x3, 32x32, no bias)") {
  check_all_types<nn::Conv2d<16, 3, 1, 1, false>, StaticShape<3, 32, 32>>("resnet stem");
}

TEST_CASE("Conv2d on the GPU: ResNet-20 3x3 stride 1 at 16, 32 and 64 channels") {
  check_all_types<nn::Conv2d<16, 3, 1, 1, false>, StaticShape<16, 32, 32>>("3x3 s1 16");
  check_all_types<nn::Conv2d<32, 3, 1, 1, false>, StaticShape<32, 16, 16>>("3x3 s1 32");
  check_all_types<nn::Conv2d<64, 3, 1, 1, false>, StaticShape<64, 8, 8>>("3x3 s1 64");
}

TEST_CASE("Conv2d on the GPU: ResNet-20 3x3 stride 2 (16 -> 32, 32 -> 64)") {
  check_all_types<nn::Conv2d<32, 3, 2, 1, false>, StaticShape<16, 32, 32>>("3x3 s2 32");
  check_all_types<nn::Conv2d<64, 3, 2, 1, false>, StaticShape<32, 16, 16>>("3x3 s2 64");
}

TEST_CASE("Conv2d on the GPU: ResNet-20 1x1 stride-2 projections") {
  check_all_types<nn::Conv2d<32, 1, 2, 0, false>, StaticShape<16, 32, 32>>("1x1 s2 32");
  check_all_types<nn::Conv2d<64, 1, 2, 0, false>, StaticShape<32, 16, 16>>("1x1 s2 64");
}

TEST_CASE("Conv2d on the GPU: 5x5 stride 2 on an odd, non-square image, bias without ReLU") {
  check_all_types<nn::Conv2d<6, 5, 2, 2, true>, StaticShape<3, 11, 13>>("5x5 s2 bias");
}

TEST_CASE("Conv2dReLU on the GPU: ReLU without bias") {
  check_all_types<nn::Conv2dReLU<8, 3, 1, 1, false>, StaticShape<5, 10, 10>>("relu no bias");
}

TEST_CASE("Conv2d on the GPU: forward and backward replay as a CUDA graph") {
  for (const ConvolutionBackend backend : backends()) {
    const auto use_backend = [backend](auto& layer) { layer.set_backend(backend); };
    check_graph_capture<nn::Conv2dReLU<32, 3>, StaticShape<1, 28, 28>, coltrain::half>(
        use_backend, std::string("mnist conv1 ") + backend_name(backend));
    check_graph_capture<nn::Conv2d<32, 3, 2, 1, false>, StaticShape<16, 32, 32>, float>(
        use_backend, std::string("3x3 s2 32 ") + backend_name(backend));
  }
}

TEST_CASE("Conv2d on the GPU: wrong shapes and a missing backend are errors") {
  nn::bind_t<nn::Conv2d<4, 3, 1, 1>, StaticShape<2, 5, 5>, float, Cuda> layer;
  nn::Context<Cuda> ctx;
  tensor::Tensor<float, Cuda> x(tensor::Shape{2, 2, 5, 5}), y(tensor::Shape{2, 4, 4, 4});
  CHECK_THROWS_AS(layer.forward(x.view(), y.view(), ctx), coltrain::InvalidArgument);
  if (!coltrain::BuildConfig::kWithCudnn)
    CHECK_THROWS_AS(layer.set_backend(ConvolutionBackend::kCudnn), coltrain::ConfigError);
}
