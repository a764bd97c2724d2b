#pragma once
// Tensors, shapes, storage, CPU matrix products and the safetensors format (coltrain::tensor).

#include <coltrain/core/config.hpp>
#include <coltrain/tensor/cpu_gemm.hpp>
#include <coltrain/tensor/device.hpp>
#include <coltrain/tensor/eigen_map.hpp>
#include <coltrain/tensor/safetensors.hpp>
#include <coltrain/tensor/shape.hpp>
#include <coltrain/tensor/storage.hpp>
#include <coltrain/tensor/tensor.hpp>
