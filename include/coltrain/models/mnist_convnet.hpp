#pragma once
// MnistConvNet: the network of PyTorch's MNIST example (examples/mnist/main.py): two 3x3
// convolutions (32, 64), max-pool 2, dropout 0.25, fc 128, dropout 0.5, fc 10.

#include <coltrain/core/config.hpp>
#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/dropout.hpp>
#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/pooling.hpp>
#include <coltrain/nn/sequential.hpp>

namespace coltrain::models {

// PyTorch twin: conv1 = Conv2d(1, 32, 3), conv2 = Conv2d(32, 64, 3), each followed by ReLU (fused
// here: Conv2dReLU), fc1 = Linear(9216, 128), fc2 = Linear(128, 10); dropout1 (0.25) after the
// pool, dropout2 (0.5) after fc1's ReLU.
using MnistConvNet = nn::Sequential<nn::Input<1, 28, 28>,
                                    nn::Named<"conv1", nn::Conv2dReLU<32, 3>>,
                                    nn::Named<"conv2", nn::Conv2dReLU<64, 3>>,
                                    nn::MaxPool2d<2>, nn::Named<"dropout1", nn::Dropout<0.25>>,
                                    nn::Flatten,
                                    nn::Named<"fc1", nn::Linear<128>>, nn::ReLU,
                                    nn::Named<"dropout2", nn::Dropout<0.5>>,
                                    nn::Named<"fc2", nn::Linear<10>>>;

}  // namespace coltrain::models
