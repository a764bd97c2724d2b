#pragma once
// Casts between element types on the device: float <-> half, float <-> bfloat16, float <-> double
// and half <-> bfloat16 (through float, which holds every value of both exactly). Narrowing rounds
// to nearest even and keeps NaNs as core/dtype.hpp does, so a value cast on the device has the
// same bits as one cast on the host. double to a 16-bit type would round twice: cast it to float
// first, explicitly.

#if !defined(__CUDACC__)
#error "coltrain/cuda/cast.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/cuda/elementwise.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace coltrain::cuda {
namespace detail {

template <class From, class To>
inline constexpr bool kIsSupportedCast =
    kIsKernelElement<From>&& kIsKernelElement<To> &&
    !(std::is_same_v<From, double> && !std::is_same_v<To, float> &&
      !std::is_same_v<To, double>)&&!(std::is_same_v<To, double> && !std::is_same_v<From, float> &&
                                      !std::is_same_v<From, double>);

template <class To, class From>
__device__ __forceinline__ To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<From, double> || std::is_same_v<To, double>) {
    return static_cast<To>(value);  // float <-> double
  } else {
    return narrow<To>(widen(value));  // exact widening, one rounding
  }
}

template <class From, class To>
struct Cast {
  const From* in;
  To* out;
  template <int V>
  __device__ void apply(std::int64_t i) const {
    const Pack<From, V> x = load<V>(in + i);
    Pack<To, V> y;
#pragma unroll
    for (int k = 0; k < V; ++k) y.v[k] = convert<To>(x.v[k]);
    store<V>(out + i, y);
  }
};

}  // namespace detail

// out[i] = To(in[i]). The buffers must not overlap (unless From is To and in == out).
template <class To, class From>
void cast(const From* in, To* out, std::int64_t n, cudaStream_t stream) {
  static_assert(detail::kIsSupportedCast<From, To>,
                "coltrain::cuda::cast: supported are float <-> half/bfloat16/double and "
                "half <-> bfloat16; cast double to float first");
  // A pack is 16 bytes of the narrower type: two 16-byte words of the wider one.
  constexpr int kWidth =
      static_cast<int>(detail::kVectorBytes / std::min(sizeof(From), sizeof(To)));
  detail::launch_elementwise<kWidth>(detail::Cast<From, To>{in, out}, n, stream, "cast", in, out);
}

}  // namespace coltrain::cuda
