#pragma once
// Includes Eigen's core. Debian and most distributions install it as /usr/include/eigen3/Eigen, so
// the bare `g++ -I include` and `mpicxx -I include` builds find it through the eigen3/ prefix when
// no -I points inside it (CMake's Eigen3::Eigen does).

#include <coltrain/core/config.hpp>

// g++ 12 warns that AVX-512 intrinsics read an uninitialised `__Y` when Eigen's kernels are inlined
// (GCC bug 105593, fixed in 13). The warning is attributed to the intrinsics header, so it is silenced
// for the lines included here; a translation unit that includes <immintrin.h> before coltrain still
// sees it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// coltrain uses Eigen on the host only. Under nvcc, Eigen would otherwise mark its functions
// __host__ __device__, which nvcc 13 rejects without --expt-relaxed-constexpr; EIGEN_NO_CUDA keeps
// them host functions (set only for this include, unless the user set it).
#if defined(__CUDACC__) && !defined(EIGEN_NO_CUDA)
#define EIGEN_NO_CUDA
#define COLTRAIN_DEFINED_EIGEN_NO_CUDA
#endif
#if __has_include(<Eigen/Core>)
#include <Eigen/Core>
#elif __has_include(<eigen3/Eigen/Core>)
#include <eigen3/Eigen/Core>
#else
#error "coltrain's CPU training path needs Eigen 3 (Debian: libeigen3-dev; or add -I<eigen dir>)"
#endif
#if defined(COLTRAIN_DEFINED_EIGEN_NO_CUDA)
#undef EIGEN_NO_CUDA
#undef COLTRAIN_DEFINED_EIGEN_NO_CUDA
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
