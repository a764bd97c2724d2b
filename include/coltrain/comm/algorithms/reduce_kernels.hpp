#pragma once
// Elementwise reductions on the CPU, used by every algorithm. Each op is one plain loop over
// contiguous arrays with the op hoisted out of it, which g++ and clang vectorise (AVX2/AVX-512 with
// -march=native; SSE2 otherwise): `out = a op b` allowing out == a, so one kernel serves in-place
// and out-of-place reductions. Integers wrap on overflow (computed in the unsigned type, as
// two's-complement hardware does) instead of being undefined behaviour. The algorithms reach these
// typed loops through ElementReduction, which erases the element type.

#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace coltrain::comm {

// The element types the algorithms reduce; f16 and bf16 are widened to float before they get here.
template <class T>
concept ReducibleElement = std::same_as<T, float> || std::same_as<T, double> ||
    std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t>;

namespace detail {

template <class T>
COLTRAIN_FORCE_INLINE T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <class T>
COLTRAIN_FORCE_INLINE T multiply(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

}  // namespace detail

// out[i] = a[i] op b[i] for i < n; out may equal a (or b). kAvg reduces as kSum: the division by
// the number of ranks happens once, at the end (divide_by_ranks).
template <ReducibleElement T>
void reduce_into(T* out, const T* a, const T* b, std::size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (std::size_t i = 0; i < n; ++i) out[i] = detail::add(a[i], b[i]);
      return;
    case ReduceOp::kProd:
      for (std::size_t i = 0; i < n; ++i) out[i] = detail::multiply(a[i], b[i]);
      return;
    case ReduceOp::kMin:
      for (std::size_t i = 0; i < n; ++i) out[i] = b[i] < a[i] ? b[i] : a[i];
      return;
    case ReduceOp::kMax:
      for (std::size_t i = 0; i < n; ++i) out[i] = a[i] < b[i] ? b[i] : a[i];
      return;
  }
  throw InvalidArgument("unknown reduction op " + std::to_string(static_cast<int>(op)));
}

// The last step of kAvg: data[i] /= ranks. A true division (not a multiplication by 1/ranks), so
// that exactly divisible sums give exact results; integers truncate toward zero.
template <ReducibleElement T>
void divide_by_ranks(T* data, std::size_t n, int ranks) {
  const T divisor = static_cast<T>(ranks);
  for (std::size_t i = 0; i < n; ++i) data[i] = data[i] / divisor;
}

// A reduction over elements whose type is chosen at run time, as the algorithms take it: they move
// and reduce bytes, so each is compiled once instead of once per element type.
// The typed loops above are reached through a pointer once per chunk, which costs nothing beside
// the chunk's own work. Byte counts and offsets are whole elements.
struct ElementReduction {
  DataType dtype = DataType::kFloat32;  // of the reduced elements (f16/bf16 arrive widened to f32)
  ReduceOp op = ReduceOp::kSum;
  void (*reduce_bytes)(std::byte* out, const std::byte* a, const std::byte* b, std::size_t bytes,
                       ReduceOp op) = nullptr;
  void (*divide_bytes)(std::byte* data, std::size_t bytes, int ranks) = nullptr;

  std::size_t element_bytes() const { return size_of(dtype); }
  // reduce_into over `bytes` bytes.
  void reduce(std::byte* out, const std::byte* a, const std::byte* b, std::size_t bytes) const {
    reduce_bytes(out, a, b, bytes, op);
  }
  // What a final result still needs: divide_by_ranks for kAvg, nothing for the other ops.
  void finish(std::byte* data, std::size_t bytes, int ranks) const {
    if (op == ReduceOp::kAvg) divide_bytes(data, bytes, ranks);
  }
};

namespace detail {

template <ReducibleElement T>
void reduce_bytes(std::byte* out, const std::byte* a, const std::byte* b, std::size_t bytes,
                  ReduceOp op) {
  reduce_into(reinterpret_cast<T*>(out), reinterpret_cast<const T*>(a),
              reinterpret_cast<const T*>(b), bytes / sizeof(T), op);
}

template <ReducibleElement T>
void divide_bytes(std::byte* data, std::size_t bytes, int ranks) {
  divide_by_ranks(reinterpret_cast<T*>(data), bytes / sizeof(T), ranks);
}

}  // namespace detail

template <ReducibleElement T>
ElementReduction element_reduction(ReduceOp op) {
  return {data_type_v<T>, op, &detail::reduce_bytes<T>, &detail::divide_bytes<T>};
}

}  // namespace coltrain::comm
