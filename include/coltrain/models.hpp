#pragma once
// Ready-made networks (coltrain::models): Mlp, MnistConvNet, CifarNet, ResNet<Depth>, ResNet18.

#include <coltrain/core/config.hpp>
#include <coltrain/models/cifar_net.hpp>
#include <coltrain/models/mlp.hpp>
#include <coltrain/models/mnist_convnet.hpp>
#include <coltrain/models/resnet.hpp>
