#pragma once
// Layers, composition, losses and initialisation (coltrain::nn).

#include <coltrain/core/config.hpp>
#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/dropout.hpp>
#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/loss.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/nn/pooling.hpp>
#include <coltrain/nn/residual.hpp>
#include <coltrain/nn/sequential.hpp>
