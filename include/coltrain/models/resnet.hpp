#pragma once
// ResNets for 32x32 CIFAR images.
//
// ResNet<Depth> (Depth = 6n + 2: 20, 32, 44, 56, 110): He et al. 2015, section 4.2: a 3x3 convolution
// with 16 channels, three stages of n basic blocks with 16, 32 and 64 channels (the first block of
// stages 2 and 3 halves the resolution), global average pooling and a 10-way linear layer. Where the
// shape changes, the shortcut is a projection (1x1 convolution + BatchNorm, the paper's option B).
//
// ResNet18: the CIFAR ResNet-18 of the pytorch-cifar recipes: 3x3 stem with 64 channels, four stages
// of two basic blocks (64, 128, 256, 512), global average pooling, linear 512 -> 10.
//
// Names follow those PyTorch modules: conv1, bn1, layer1.0.conv1, layer2.0.shortcut.0.weight, linear.
// Each BatchNorm followed by a ReLU is the fused BatchNormReLU2d (same names, one pass fewer).

#include <coltrain/core/config.hpp>
#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/pooling.hpp>
#include <coltrain/nn/residual.hpp>
#include <coltrain/nn/sequential.hpp>

#include <cstddef>
#include <type_traits>

namespace coltrain::models {

// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); a projection shortcut when `Project`.
template <std::size_t Channels, std::size_t Stride, bool Project>
using BasicBlock = nn::Residual<
    nn::Sequential<nn::Named<"conv1", nn::Conv2d<Channels, 3, Stride, 1, false>>,
                   nn::Named<"bn1", nn::BatchNormReLU2d<>>,
                   nn::Named<"conv2", nn::Conv2d<Channels, 3, 1, 1, false>>,
                   nn::Named<"bn2", nn::BatchNorm2d<>>>,
    std::conditional_t<Project, nn::Projection<Channels, Stride>, nn::IdentityShortcut>, nn::ReLU>;

// A stage of `Blocks` basic blocks; the first one changes stride and channels when asked to.
template <std::size_t Channels, std::size_t Blocks, std::size_t Stride, bool ProjectFirst>
using ResNetStage = nn::Sequential<BasicBlock<Channels, Stride, ProjectFirst>,
                                   nn::Repeat<Blocks - 1, BasicBlock<Channels, 1, false>>>;

namespace detail {
template <std::size_t Depth>
struct CifarResNet {
  static_assert(Depth >= 8 && (Depth - 2) % 6 == 0,
                "coltrain::models::ResNet<Depth>: CIFAR ResNets have depth 6n + 2 (20, 32, 44, 56, 110)");
  static constexpr std::size_t kBlocks = (Depth - 2) / 6;
  using type = nn::Sequential<nn::Input<3, 32, 32>,
                              nn::Named<"conv1", nn::Conv2d<16, 3, 1, 1, false>>,
                              nn::Named<"bn1", nn::BatchNormReLU2d<>>,
                              nn::Named<"layer1", ResNetStage<16, kBlocks, 1, false>>,
                              nn::Named<"layer2", ResNetStage<32, kBlocks, 2, true>>,
                              nn::Named<"layer3", ResNetStage<64, kBlocks, 2, true>>,
                              nn::GlobalAvgPool, nn::Named<"linear", nn::Linear<10>>>;
};
}  // namespace detail

template <std::size_t Depth>
using ResNet = typename detail::CifarResNet<Depth>::type;

using ResNet18 = nn::Sequential<nn::Input<3, 32, 32>,
                                nn::Named<"conv1", nn::Conv2d<64, 3, 1, 1, false>>,
                                nn::Named<"bn1", nn::BatchNormReLU2d<>>,
                                nn::Named<"layer1", ResNetStage<64, 2, 1, false>>,
                                nn::Named<"layer2", ResNetStage<128, 2, 2, true>>,
                                nn::Named<"layer3", ResNetStage<256, 2, 2, true>>,
                                nn::Named<"layer4", ResNetStage<512, 2, 2, true>>,
                                nn::GlobalAvgPool, nn::Named<"linear", nn::Linear<10>>>;

}  // namespace coltrain::models
