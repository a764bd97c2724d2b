// Parity with PyTorch 1.13 (CPU), layers and model names. layer_references.py runs every layer's
// PyTorch twin and stores its state_dict, input, output and gradients as safetensors; this suite
// loads each state_dict into the coltrain layer BY NAME (the name sets must be equal on both sides:
// the state_dict interoperability test), replays forward and backward in float and compares. It
// also compares every model's parameter and buffer names, shapes and order with its PyTorch twin's.
//
// Tolerance, per tensor, with e = PyTorch's tensor and a = coltrain's (see parity_helpers.hpp):
//   max_i |a_i - e_i| <= 1e-5 * max(max_i |e_i|, 1e-6)
// for outputs, input and parameter gradients, the cross-entropy loss and its gradient, and the
// BatchNorm statistics after the step. Set NN_PARITY_REPORT=1 to print every comparison's error.

#include <catch2/catch.hpp>

#include <coltrain/models/cifar_net.hpp>
#include <coltrain/models/mlp.hpp>
#include <coltrain/models/mnist_convnet.hpp>
#include <coltrain/models/resnet.hpp>
#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/loss.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/pooling.hpp>
#include <coltrain/nn/sequential.hpp>

#include "nn_test_helpers.hpp"
#include "parity_helpers.hpp"

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace nn_parity;  // NOLINT: the suite's vocabulary
namespace models = coltrain::models;
using nn::Input;
using nn::Sequential;
using nn_test::GradProbe;

// ---------------------------------------------------------------------------------------------
// Layers: Network<Sequential<Input, GradProbe, Named<"layer", Spec>>> against Probe(layer) in
// torch.

template <class In, class Spec>
using Probed = Sequential<In, GradProbe, nn::Named<"layer", Spec>>;

template <class Model>
void check_layer(const std::string& name, int threads = 1) {
  const Reader reference = parity_reference("layer_" + name + ".safetensors");
  nn::Network<Model> net({.threads = threads});
  const Json config = config_of(reference);
  if (config["mode"] == "eval") net.eval();
  load_state(net, reference, "state.");
  const auto input = read_tensor(reference, "input");
  const auto y = net.forward(input.view());
  compare(y.span(), std::span<const float>(reference.read<float>("output")), kRel,
          name + " output");
  const auto r = read_tensor(reference, "grad_output");
  REQUIRE(r.shape() == y.shape());
  net.backward(r.view());
  const auto& grad_input = net.body().template layer<0>().captured;
  compare(std::span<const float>(grad_input.span()),
          std::span<const float>(reference.read<float>("grad_input")), kRel,
          name + " input gradient");
  compare_state(net, reference, "grad.", Parameters::kGradients, false, kRel, name);
  compare_state(net, reference, "after.", Parameters::kSkip, true, kRel, name + " after the step:");
}

// ---------------------------------------------------------------------------------------------
// state_dict names, shapes and order

template <class Model>
void check_names(const std::string& name) {
  const Reader reference = parity_reference("names.safetensors");
  const Json models = Json::parse(reference.metadata().at("models"));
  const Json& expected = models[name];
  nn::Network<Model> net;
  Json parameters = Json::array(), buffers = Json::array();
  std::map<std::string, std::vector<std::int64_t>> ours;
  net.visit_parameters([&](const std::string& n, auto& p) {
    parameters.push_back(Json::array({n, dims_of(p.value.shape())}));
    ours[n] = dims_of(p.value.shape());
  });
  net.visit_buffers([&](const std::string& n, auto& t) {
    buffers.push_back(Json::array({n, dims_of(t.shape())}));
    ours[n] = dims_of(t.shape());
  });
  // named_parameters() and named_buffers() orders are coltrain's visiting orders; state_dict()
  // interleaves them module by module, so it is compared as a set of names and shapes.
  CHECK(parameters == expected["parameters"]);
  CHECK(buffers == expected["buffers"]);
  std::map<std::string, std::vector<std::int64_t>> theirs;
  for (const Json& entry : expected["state_dict"])
    theirs[entry[0].as_string()] = int64s_of(entry[1]);
  CHECK(ours == theirs);
  CHECK(nn::Network<Model>::kParameterCount == expected["parameter_count"].get<std::size_t>());
}

}  // namespace

TEST_CASE("parity: Linear", "[nn][parity]") {
  check_layer<Probed<Input<20>, nn::Linear<7>>>("linear");
  check_layer<Probed<Input<20>, nn::Linear<7, false>>>("linear_nobias", 2);
}

TEST_CASE("parity: Conv2d", "[nn][parity]") {
  check_layer<Probed<Input<3, 9, 9>, nn::Conv2d<8, 3, 1, 1>>>("conv_k3_s1_p1");
  check_layer<Probed<Input<4, 10, 10>, nn::Conv2d<6, 3, 2, 1, false>>>("conv_k3_s2_p1_nobias", 2);
  check_layer<Probed<Input<5, 7, 7>, nn::Conv2d<4, 1, 2, 0>>>("conv_k1_s2");
  check_layer<Probed<Input<2, 6, 6>, nn::Conv2d<5, 3>>>("conv_k3_s1_p0_packed", 2);
}

TEST_CASE("parity: Conv2d through Winograd F(4x4, 3x3) and F(2x2, 3x3)", "[nn][parity]") {
  static_assert(nn::bind_t<nn::Conv2d<16, 3, 1, 1>, nn::Chw<16, 8, 8>, float,
                           tensor::Cpu>::kWinogradOutputTile == 4);
  static_assert(nn::bind_t<nn::Conv2d<24, 3, 1, 0, false>, nn::Chw<16, 10, 10>, float,
                           tensor::Cpu>::kWinogradOutputTile == 2);
  check_layer<Probed<Input<16, 8, 8>, nn::Conv2d<16, 3, 1, 1>>>("conv_winograd_p1", 2);
  check_layer<Probed<Input<16, 10, 10>, nn::Conv2d<24, 3, 1, 0, false>>>("conv_winograd_p0_nobias");
}

TEST_CASE("parity: MaxPool2d and AvgPool2d", "[nn][parity]") {
  check_layer<Probed<Input<4, 9, 9>, nn::MaxPool2d<3, 2, 1>>>("maxpool_k3_s2_p1");
  check_layer<Probed<Input<3, 8, 7>, nn::MaxPool2d<2>>>("maxpool_k2");
  check_layer<Probed<Input<4, 9, 9>, nn::AvgPool2d<3, 2, 1>>>("avgpool_k3_s2_p1");
  check_layer<Probed<Input<3, 8, 7>, nn::AvgPool2d<2>>>("avgpool_k2");
  check_layer<Probed<Input<6, 5, 5>, nn::GlobalAvgPool>>("global_avgpool");
}

TEST_CASE("parity: BatchNorm2d in training and evaluation", "[nn][parity]") {
  check_layer<Probed<Input<6, 7, 7>, nn::BatchNorm2d<>>>("batchnorm_train");
  check_layer<Probed<Input<6, 7, 7>, nn::BatchNorm2d<>>>("batchnorm_eval");
}

TEST_CASE("parity: ReLU and Flatten", "[nn][parity]") {
  check_layer<Probed<Input<50>, nn::ReLU>>("relu");
  check_layer<Probed<Input<3, 4, 4>, Sequential<nn::Flatten, nn::Linear<5>>>>("flatten_linear");
}

TEST_CASE("parity: ResNet basic blocks", "[nn][parity]") {
  check_layer<Probed<Input<8, 8, 8>, models::BasicBlock<8, 1, false>>>("block_identity");
  check_layer<Probed<Input<8, 8, 8>, models::BasicBlock<16, 2, true>>>("block_projection", 2);
  check_layer<Probed<Input<8, 8, 8>, models::BasicBlock<16, 2, true>>>("block_projection_eval");
}

TEST_CASE("parity: SoftmaxCrossEntropy", "[nn][parity]") {
  for (const std::string name : {"plain", "smoothed"}) {
    const Reader reference = parity_reference("loss_" + name + ".safetensors");
    const double smoothing = config_of(reference)["label_smoothing"].get<double>();
    const auto logits = read_tensor(reference, "logits");
    const std::vector<std::int32_t> labels = reference.read<std::int32_t>("labels");
    tensor::Tensor<float> grad(logits.shape());
    const double loss =
        nn::SoftmaxCrossEntropy(smoothing).loss_and_grad<float>(logits.view(), labels, grad.view());
    compare(std::vector<double>{loss}, reference.read<double>("loss"), kRel,
            "cross-entropy " + name + " loss");
    compare(std::span<const float>(grad.span()),
            std::span<const float>(reference.read<float>("grad_logits")), kRel,
            "cross-entropy " + name + " gradient");
  }
}

TEST_CASE("parity: state_dict names, shapes and order of every model", "[nn][parity][state_dict]") {
  check_names<models::Mlp>("mlp");
  check_names<models::MnistConvNet>("mnist_convnet");
  check_names<models::CifarNet>("cifar_net");
  check_names<models::ResNet<20>>("resnet20");
  check_names<models::ResNet<32>>("resnet32");
  check_names<models::ResNet<56>>("resnet56");
  check_names<models::ResNet18>("resnet18");
}
