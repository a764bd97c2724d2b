#pragma once
// The CPU products' out-of-line code for a program built with COLTRAIN_SEPARATE_COMPILATION that
// uses the training half (tensor, nn, optim, train, models): include this file in the one
// translation unit that includes <coltrain/src.hpp>. It compiles the float kernels and Eigen's
// float and double products once, and needs Eigen; <coltrain/src.hpp> alone stays the
// communication half, which does not. (Boost.Asio's SSL layer has its own src.hpp the same way.)
// CMake users get it from the coltrain::separate target where Eigen was found.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_SEPARATE_COMPILATION
#error "<coltrain/tensor/src.hpp> needs -DCOLTRAIN_SEPARATE_COMPILATION; header-only builds need no source"
#endif

#include <coltrain/tensor/impl/cpu_gemm.ipp>
#include <coltrain/tensor/impl/cpu_microkernels.ipp>
