#pragma once
// The GPU side of every layer: include this (under nvcc) after or instead of coltrain/nn.hpp, and
// the same network types bind to the GPU with Device = tensor::Cuda:
//
//   #include <coltrain/cuda/nn.cuh>
//   nn::Network<models::ResNet<20>, half, tensor::Cuda> net({.seed = 1});

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/cuda/nn/activation.cuh>
#include <coltrain/cuda/nn/batch_norm.cuh>
#include <coltrain/cuda/nn/conv2d.cuh>
#include <coltrain/cuda/nn/dropout.cuh>
#include <coltrain/cuda/nn/flatten.cuh>
#include <coltrain/cuda/nn/linear.cuh>
#include <coltrain/cuda/nn/loss.cuh>
#include <coltrain/cuda/nn/pooling.cuh>
#include <coltrain/cuda/nn/residual.cuh>
#include <coltrain/nn.hpp>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/tensor/device_copy.hpp>
