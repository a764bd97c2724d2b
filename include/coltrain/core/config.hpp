#pragma once
// The one place that decides how coltrain's headers compile: which compiler (g++, mpicxx, nvcc),
// which optional backends are present, and the portable host/device annotations. Every other header
// includes this one first, so a translation unit sees one consistent answer.

#include <coltrain/version.hpp>

// Host/device annotations: empty under a host compiler, CUDA qualifiers under nvcc, so that small
// functions (dtype conversions, reduction ops) are written once for both sides.
#if defined(__CUDACC__)
#define COLTRAIN_HOST_DEVICE __host__ __device__
#define COLTRAIN_DEVICE __device__
#define COLTRAIN_HOST __host__
#else
#define COLTRAIN_HOST_DEVICE
#define COLTRAIN_DEVICE
#define COLTRAIN_HOST
#endif

// True while nvcc compiles the device side of a translation unit.
#if defined(__CUDA_ARCH__)
#define COLTRAIN_DEVICE_CODE 1
#else
#define COLTRAIN_DEVICE_CODE 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define COLTRAIN_FORCE_INLINE inline __attribute__((always_inline))
#define COLTRAIN_RESTRICT __restrict__
#else
#define COLTRAIN_FORCE_INLINE inline
#define COLTRAIN_RESTRICT
#endif

// Separate compilation (as Boost.Asio offers it): compile every file of a program with
// -DCOLTRAIN_SEPARATE_COMPILATION and include <coltrain/src.hpp> in exactly one of them. The others
// then see the Communicator's declarations only, and the transports and algorithms behind it are
// compiled once. COLTRAIN_DECL marks the definitions that move to that one file; header-only
// builds keep them inline.
#ifndef COLTRAIN_SEPARATE_COMPILATION
#define COLTRAIN_SEPARATE_COMPILATION 0
#endif
#if COLTRAIN_SEPARATE_COMPILATION
#define COLTRAIN_DECL
#else
#define COLTRAIN_DECL inline
#endif

// Optional backends. Each is detected by the presence of its header, which is what `mpicxx` or
// `-I/usr/local/cuda/include` provide, and can be forced with -DCOLTRAIN_WITH_X=0 or =1. The CMake
// target always defines them explicitly, so that an mpi.h that happens to be on the include path is
// not used unless the target also links MPI.
#ifndef COLTRAIN_WITH_MPI
#if __has_include(<mpi.h>)
#define COLTRAIN_WITH_MPI 1
#else
#define COLTRAIN_WITH_MPI 0
#endif
#endif

#ifndef COLTRAIN_WITH_CUDA
#if __has_include(<cuda_runtime.h>)
#define COLTRAIN_WITH_CUDA 1
#else
#define COLTRAIN_WITH_CUDA 0
#endif
#endif

#ifndef COLTRAIN_WITH_NCCL
#if COLTRAIN_WITH_CUDA && __has_include(<nccl.h>)
#define COLTRAIN_WITH_NCCL 1
#else
#define COLTRAIN_WITH_NCCL 0
#endif
#endif

#ifndef COLTRAIN_WITH_CUDNN
#if COLTRAIN_WITH_CUDA && __has_include(<cudnn.h>)
#define COLTRAIN_WITH_CUDNN 1
#else
#define COLTRAIN_WITH_CUDNN 0
#endif
#endif

// OpenSSL's libcrypto authenticates TCP handshakes with the job's secret
// (comm/rendezvous/auth.hpp). Unlike the backends above it is opt-in outside CMake: every program
// that uses TCP would otherwise need -lcrypto as soon as libssl-dev is installed, and existing
// compile lines would stop linking. A bare compile line adds -DCOLTRAIN_WITH_OPENSSL=1 -lcrypto;
// the CMake target sets it when found. A build without it refuses a secret with a ConfigError that
// says so.
#ifndef COLTRAIN_WITH_OPENSSL
#define COLTRAIN_WITH_OPENSSL 0
#endif

// zlib reads the gzip-compressed datasets (MNIST's official files, the shipped subset).
#ifndef COLTRAIN_WITH_ZLIB
#if __has_include(<zlib.h>)
#define COLTRAIN_WITH_ZLIB 1
#else
#define COLTRAIN_WITH_ZLIB 0
#endif
#endif

#if COLTRAIN_WITH_NCCL && !COLTRAIN_WITH_CUDA
#error "COLTRAIN_WITH_NCCL=1 needs COLTRAIN_WITH_CUDA=1: NCCL works on device buffers"
#endif
#if COLTRAIN_WITH_CUDNN && !COLTRAIN_WITH_CUDA
#error "COLTRAIN_WITH_CUDNN=1 needs COLTRAIN_WITH_CUDA=1"
#endif

namespace coltrain {

// The build configuration as values, for logs and for code that branches with `if constexpr`.
struct BuildConfig {
  static constexpr bool kWithMpi = COLTRAIN_WITH_MPI != 0;
  static constexpr bool kWithCuda = COLTRAIN_WITH_CUDA != 0;
  static constexpr bool kWithNccl = COLTRAIN_WITH_NCCL != 0;
  static constexpr bool kWithCudnn = COLTRAIN_WITH_CUDNN != 0;
  static constexpr bool kWithZlib = COLTRAIN_WITH_ZLIB != 0;
  static constexpr bool kWithOpenssl = COLTRAIN_WITH_OPENSSL != 0;
  static constexpr const char* kVersion = COLTRAIN_VERSION_STRING;
};

}  // namespace coltrain
