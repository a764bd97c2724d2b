#pragma once
// The element types the collectives take: those of DataType except u8. The algorithms reduce four
// of them; f16 and bf16 are widened to f32 around a reduction.

#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/core/dtype.hpp>

#include <type_traits>

namespace coltrain::comm::detail {

template <class T>
inline constexpr bool kNarrowFloat = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <class T>
concept CollectiveElement = ReducibleElement<T> || kNarrowFloat<T>;

}  // namespace coltrain::comm::detail
