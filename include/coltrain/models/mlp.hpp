#pragma once
// Mlp: the seeds' MNIST multilayer perceptron, 784-128-256-10 with ReLU.

#include <coltrain/core/config.hpp>
#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/sequential.hpp>

namespace coltrain::models {

// PyTorch twin: attributes fc1, fc2, fc3 = nn.Linear(784, 128), nn.Linear(128, 256),
// nn.Linear(256, 10); forward: flatten, relu(fc1), relu(fc2), fc3.
using Mlp = nn::Sequential<nn::Input<1, 28, 28>, nn::Flatten,
                           nn::Named<"fc1", nn::Linear<128>>, nn::ReLU,
                           nn::Named<"fc2", nn::Linear<256>>, nn::ReLU,
                           nn::Named<"fc3", nn::Linear<10>>>;

}  // namespace coltrain::models
