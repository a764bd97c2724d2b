#pragma once
// Exact integers as the benchmark's element types: f16 and bf16 through float, the others by
// conversion. Apart from exact_inputs.hpp, which reaches MPI, so that the device benchmark (no MPI
// needed) shares it.

#include <coltrain/core/dtype.hpp>

#include <cstdint>
#include <type_traits>

namespace coltrain::bench {

template <class T>
inline constexpr bool kNarrowFloat =
    std::is_same_v<T, coltrain::half> || std::is_same_v<T, coltrain::bfloat16>;

template <class T>
T element(std::int64_t value) {
  if constexpr (kNarrowFloat<T>) {
    return T(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

}  // namespace coltrain::bench
