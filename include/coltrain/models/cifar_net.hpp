#pragma once
// CifarNet: a small CIFAR-10 convolutional network: three 3x3 convolutions (32, 64, 128 channels,
// padding 1), each followed by ReLU and 2x2 max-pooling (32 -> 16 -> 8 -> 4), then fully connected
// layers of 120, 84 and 10 (the LeNet-style head of PyTorch's CIFAR-10 tutorial).

#include <coltrain/core/config.hpp>
#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/pooling.hpp>
#include <coltrain/nn/sequential.hpp>

namespace coltrain::models {

// PyTorch twin: conv1..conv3 = Conv2d(3, 32, 3, padding=1), Conv2d(32, 64, 3, padding=1),
// Conv2d(64, 128, 3, padding=1), each followed by ReLU (fused here: Conv2dReLU);
// fc1..fc3 = Linear(2048, 120), Linear(120, 84), Linear(84, 10).
using CifarNet = nn::Sequential<nn::Input<3, 32, 32>,
                                nn::Named<"conv1", nn::Conv2dReLU<32, 3, 1, 1>>, nn::MaxPool2d<2>,
                                nn::Named<"conv2", nn::Conv2dReLU<64, 3, 1, 1>>, nn::MaxPool2d<2>,
                                nn::Named<"conv3", nn::Conv2dReLU<128, 3, 1, 1>>, nn::MaxPool2d<2>,
                                nn::Flatten,
                                nn::Named<"fc1", nn::Linear<120>>, nn::ReLU,
                                nn::Named<"fc2", nn::Linear<84>>, nn::ReLU,
                                nn::Named<"fc3", nn::Linear<10>>>;

}  // namespace coltrain::models
