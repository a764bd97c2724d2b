#pragma once
// The umbrella header: everything in coltrain that compiles with a host compiler. CUDA kernels
// (coltrain/cuda/*.cuh) are included separately, by translation units that nvcc compiles.

#include <coltrain/comm.hpp>
#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/denormals.hpp>
#include <coltrain/core/device_selection.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/log.hpp>
#include <coltrain/core/terminal.hpp>
#include <coltrain/core/thread_pool.hpp>
#include <coltrain/core/timeline.hpp>
#include <coltrain/core/timer.hpp>
#include <coltrain/data.hpp>
#include <coltrain/models.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/tensor.hpp>
#include <coltrain/train.hpp>
