#pragma once
// Element types: the DataType tag that travels in tensors, wire headers and checkpoints, the
// portable 16-bit float types `half` and `bfloat16`, and the maps between C++ types and tags.
//
// half and bfloat16 are storage types. They convert to and from float explicitly, so that every
// change of precision is visible where it happens (a reduction says that it accumulates in float)
// and so that `a + b` on two halves cannot silently become float arithmetic or an ambiguous
// overload. They compare through float. Conversions round to nearest, ties to even; NaN stays NaN
// with its sign and the top of its payload, quieted, on host and device alike.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace coltrain {

enum class DataType : std::uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt32,
  kInt64,
  kUInt8
};

inline constexpr std::array<DataType, 7> kAllDataTypes = {
    DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
    DataType::kInt32,   DataType::kInt64,   DataType::kUInt8};

// The switches below list every enumerator and no default, so -Wswitch flags a type left out. A
// value outside the enum (from a corrupted wire header) falls through to a result callers can test.

// Bytes per element; 0 for a value that is not a DataType.
COLTRAIN_HOST_DEVICE constexpr std::size_t size_of(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kFloat16:
      return 2;
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
    case DataType::kUInt8:
      return 1;
  }
  return 0;
}

// The short name used in logs, file headers and COLTRAIN_* settings; "invalid" for a value that is
// not a DataType.
constexpr std::string_view name_of(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "f32";
    case DataType::kFloat64:
      return "f64";
    case DataType::kFloat16:
      return "f16";
    case DataType::kBFloat16:
      return "bf16";
    case DataType::kInt32:
      return "i32";
    case DataType::kInt64:
      return "i64";
    case DataType::kUInt8:
      return "u8";
  }
  return "invalid";
}

COLTRAIN_HOST_DEVICE constexpr bool is_floating(DataType type) {
  switch (type) {
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return true;
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kUInt8:
      return false;
  }
  return false;
}

namespace detail {

struct DataTypeName {
  std::string_view name;
  DataType type;
};

// Short names first: the error message of parse_data_type lists them in this order.
inline constexpr DataTypeName kDataTypeNames[] = {
    {"f32", DataType::kFloat32},       {"float32", DataType::kFloat32},
    {"float", DataType::kFloat32},     {"f64", DataType::kFloat64},
    {"float64", DataType::kFloat64},   {"double", DataType::kFloat64},
    {"f16", DataType::kFloat16},       {"float16", DataType::kFloat16},
    {"half", DataType::kFloat16},      {"bf16", DataType::kBFloat16},
    {"bfloat16", DataType::kBFloat16}, {"i32", DataType::kInt32},
    {"int32", DataType::kInt32},       {"i64", DataType::kInt64},
    {"int64", DataType::kInt64},       {"u8", DataType::kUInt8},
    {"uint8", DataType::kUInt8},
};

}  // namespace detail

// Accepts the short names of name_of and the long aliases ("float32", "double", "bfloat16"...);
// throws InvalidArgument naming the string and the accepted names otherwise.
inline DataType parse_data_type(std::string_view text) {
  for (const detail::DataTypeName& entry : detail::kDataTypeNames) {
    if (entry.name == text) return entry.type;
  }
  std::string message = "unknown data type '" + std::string(text) + "'; valid names are";
  const char* separator = " ";
  for (const detail::DataTypeName& entry : detail::kDataTypeNames) {
    message += separator;
    message += entry.name;
    separator = ", ";
  }
  throw InvalidArgument(message);
}

namespace detail {

// std::bit_cast is a host function; nvcc's device side has the builtin behind it, which also works
// in constant evaluation, unlike __float_as_uint.
COLTRAIN_HOST_DEVICE constexpr std::uint32_t bits_of(float value) {
#if COLTRAIN_DEVICE_CODE
  return __builtin_bit_cast(std::uint32_t, value);
#else
  return std::bit_cast<std::uint32_t>(value);
#endif
}

COLTRAIN_HOST_DEVICE constexpr float float_from_bits(std::uint32_t bits) {
#if COLTRAIN_DEVICE_CODE
  return __builtin_bit_cast(float, bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

// Device code converts with the hardware instructions, except in constant evaluation, which nvcc's
// device pass also runs for host code and where they cannot be called; elsewhere the portable code
// runs. NaNs are handled before either: the hardware returns one canonical NaN, losing the sign,
// while quieting and keeping the payload's top bits gives the same bits on host and device.
COLTRAIN_HOST_DEVICE constexpr bool is_nan_bits(std::uint32_t float_bits) {
  return (float_bits & 0x7fffffffu) > 0x7f800000u;
}

COLTRAIN_HOST_DEVICE constexpr std::uint16_t half_nan_from_float_bits(std::uint32_t float_bits) {
  return static_cast<std::uint16_t>(((float_bits >> 16) & 0x8000u) | 0x7e00u |
                                    ((float_bits >> 13) & 0x03ffu));
}

COLTRAIN_HOST_DEVICE constexpr std::uint16_t bf16_nan_from_float_bits(std::uint32_t float_bits) {
  return static_cast<std::uint16_t>((float_bits >> 16) | 0x0040u);
}

// Written without branches, every case computed and the right one selected, so that loops of
// conversions vectorise (the f16 path of the collectives converts every element twice).
COLTRAIN_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float value) {
  const std::uint32_t x = bits_of(value);
#if COLTRAIN_DEVICE_CODE
  if (!__builtin_is_constant_evaluated() && !is_nan_bits(x)) {
    return __half_as_ushort(__float2half_rn(value));
  }
#endif
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t magnitude = x & 0x7fffffffu;
  // A normal half: rebias the exponent (127 - 15 = 112) and round off 13 mantissa bits, ties to
  // even. A carry out of the mantissa correctly increments the exponent.
  const std::uint32_t rebiased = magnitude - (112u << 23);
  const std::uint32_t normal = (rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13;
  // Below 2^-14 the result counts units of 2^-24, the ulp of 0.5f: adding 0.5f makes the FPU round
  // the value to that unit, ties to even, and 2^-25 and below to zero. Every float subnormal is
  // covered; it needs round-to-nearest and no flush-to-zero, the defaults.
  const std::uint32_t subnormal =
      bits_of(float_from_bits(magnitude) + 0.5f) - bits_of(0.5f);
  std::uint32_t result = magnitude >= 0x38800000u ? normal : subnormal;
  // From 65520, half an ulp above the largest half (65504), RNE rounds to Inf.
  result = magnitude >= 0x477ff000u ? 0x7c00u : result;
  result = is_nan_bits(x) ? half_nan_from_float_bits(x) & 0x7fffu : result;
  return static_cast<std::uint16_t>(sign | result);
}

COLTRAIN_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = bits & 0x03ffu;
  if (exponent == 0x1fu && mantissa != 0) {
    return float_from_bits(sign | 0x7fc00000u | (mantissa << 13));
  }
#if COLTRAIN_DEVICE_CODE
  if (!__builtin_is_constant_evaluated()) return __half2float(__ushort_as_half(bits));
#endif
  if (exponent == 0x1fu) return float_from_bits(sign | 0x7f800000u);
  if (exponent != 0) return float_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24 has at most 10 significant bits, so the product is exact.
  return float_from_bits(sign | bits_of(static_cast<float>(mantissa) * 0x1p-24f));
}

COLTRAIN_HOST_DEVICE constexpr std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t x = bits_of(value);
  if (is_nan_bits(x)) return bf16_nan_from_float_bits(x);
#if COLTRAIN_DEVICE_CODE
  if (!__builtin_is_constant_evaluated()) return __bfloat16_as_ushort(__float2bfloat16_rn(value));
#endif
  // bfloat16 is the top half of a float: round off the low 16 bits, ties to even. Subnormals need
  // no special case, and a carry out of the largest finite values reaches Inf as RNE demands.
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// The widening is exact and is a shift by definition, on device too: sm_90's cvt.f32.bf16, behind
// __bfloat162float, would replace NaNs by the canonical one.
COLTRAIN_HOST_DEVICE constexpr float bf16_bits_to_float(std::uint16_t bits) {
  return float_from_bits(static_cast<std::uint32_t>(bits) << 16);
}

}  // namespace detail

// IEEE 754 binary16. Distinct from CUDA's __half (see to_cuda/from_cuda) so that host-only and nvcc
// translation units see the same type. The default constructor leaves the value uninitialised, as
// for float: that keeps the type trivial, which __shared__ arrays in CUDA require.
class half {
 public:
  half() = default;
  COLTRAIN_HOST_DEVICE constexpr explicit half(float value)
      : bits_(detail::float_to_half_bits(value)) {}

  COLTRAIN_HOST_DEVICE static constexpr half from_bits(std::uint16_t raw) {
    half result;
    result.bits_ = raw;
    return result;
  }

  COLTRAIN_HOST_DEVICE constexpr std::uint16_t bits() const { return bits_; }
  COLTRAIN_HOST_DEVICE constexpr explicit operator float() const {
    return detail::half_bits_to_float(bits_);
  }

 private:
  std::uint16_t bits_;
};

// The top 16 bits of an IEEE 754 binary32: float's range with 8 bits of precision.
class bfloat16 {
 public:
  bfloat16() = default;
  COLTRAIN_HOST_DEVICE constexpr explicit bfloat16(float value)
      : bits_(detail::float_to_bf16_bits(value)) {}

  COLTRAIN_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t raw) {
    bfloat16 result;
    result.bits_ = raw;
    return result;
  }

  COLTRAIN_HOST_DEVICE constexpr std::uint16_t bits() const { return bits_; }
  COLTRAIN_HOST_DEVICE constexpr explicit operator float() const {
    return detail::bf16_bits_to_float(bits_);
  }

 private:
  std::uint16_t bits_;
};

// Buffers of these types are copied as bytes between ranks, files and devices.
static_assert(sizeof(half) == 2 && alignof(half) == 2 && std::is_trivially_copyable_v<half>);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2 &&
              std::is_trivially_copyable_v<bfloat16>);

namespace detail {

template <class T>
concept Float16Storage = std::same_as<T, half> || std::same_as<T, bfloat16>;

}  // namespace detail

// Comparisons follow float: NaN is unordered and -0 equals +0. Both operands must have the same
// type; comparing a half with a float or a bfloat16 needs an explicit conversion.
template <detail::Float16Storage T>
COLTRAIN_HOST_DEVICE constexpr bool operator==(T a, T b) {
  return static_cast<float>(a) == static_cast<float>(b);
}
template <detail::Float16Storage T>
COLTRAIN_HOST_DEVICE constexpr bool operator<(T a, T b) {
  return static_cast<float>(a) < static_cast<float>(b);
}
template <detail::Float16Storage T>
COLTRAIN_HOST_DEVICE constexpr bool operator<=(T a, T b) {
  return static_cast<float>(a) <= static_cast<float>(b);
}
template <detail::Float16Storage T>
COLTRAIN_HOST_DEVICE constexpr bool operator>(T a, T b) {
  return static_cast<float>(a) > static_cast<float>(b);
}
template <detail::Float16Storage T>
COLTRAIN_HOST_DEVICE constexpr bool operator>=(T a, T b) {
  return static_cast<float>(a) >= static_cast<float>(b);
}

#if defined(__CUDACC__)
// Bit-preserving conversions to CUDA's types, for cuBLAS, cuDNN and the CUDA math intrinsics.
COLTRAIN_HOST_DEVICE inline __half to_cuda(half value) {
  __half_raw raw;
  raw.x = value.bits();
  return __half(raw);
}
COLTRAIN_HOST_DEVICE inline half from_cuda(__half value) {
  return half::from_bits(static_cast<__half_raw>(value).x);
}
COLTRAIN_HOST_DEVICE inline __nv_bfloat16 to_cuda(bfloat16 value) {
  __nv_bfloat16_raw raw;
  raw.x = value.bits();
  return __nv_bfloat16(raw);
}
COLTRAIN_HOST_DEVICE inline bfloat16 from_cuda(__nv_bfloat16 value) {
  return bfloat16::from_bits(static_cast<__nv_bfloat16_raw>(value).x);
}
#endif

// C++ element type -> DataType. Specialised only for the types coltrain stores; use data_type_v,
// which explains an unsupported type instead of naming an incomplete class.
template <class T>
struct DataTypeOf;

template <>
struct DataTypeOf<float> {
  static constexpr DataType value = DataType::kFloat32;
};
template <>
struct DataTypeOf<double> {
  static constexpr DataType value = DataType::kFloat64;
};
template <>
struct DataTypeOf<half> {
  static constexpr DataType value = DataType::kFloat16;
};
template <>
struct DataTypeOf<bfloat16> {
  static constexpr DataType value = DataType::kBFloat16;
};
template <>
struct DataTypeOf<std::int32_t> {
  static constexpr DataType value = DataType::kInt32;
};
template <>
struct DataTypeOf<std::int64_t> {
  static constexpr DataType value = DataType::kInt64;
};
template <>
struct DataTypeOf<std::uint8_t> {
  static constexpr DataType value = DataType::kUInt8;
};

// Qualifiers do not change the element type: a view of const float is still f32.
template <class T>
concept SupportedElement = requires {
  DataTypeOf<std::remove_cv_t<T>>::value;
};

namespace detail {

template <class T>
consteval DataType checked_data_type() {
  static_assert(SupportedElement<T>,
                "coltrain: unsupported element type (use float, double, coltrain::half, "
                "coltrain::bfloat16, std::int32_t, std::int64_t or std::uint8_t)");
  if constexpr (SupportedElement<T>) {
    return DataTypeOf<std::remove_cv_t<T>>::value;
  } else {
    return DataType{};  // never used: returning keeps the static_assert the only error
  }
}

template <DataType D>
struct ElementTypeOf;

template <>
struct ElementTypeOf<DataType::kFloat32> {
  using type = float;
};
template <>
struct ElementTypeOf<DataType::kFloat64> {
  using type = double;
};
template <>
struct ElementTypeOf<DataType::kFloat16> {
  using type = half;
};
template <>
struct ElementTypeOf<DataType::kBFloat16> {
  using type = bfloat16;
};
template <>
struct ElementTypeOf<DataType::kInt32> {
  using type = std::int32_t;
};
template <>
struct ElementTypeOf<DataType::kInt64> {
  using type = std::int64_t;
};
template <>
struct ElementTypeOf<DataType::kUInt8> {
  using type = std::uint8_t;
};

}  // namespace detail

template <class T>
inline constexpr DataType data_type_v = detail::checked_data_type<T>();

// DataType -> C++ element type, for dispatching a runtime tag to templated code.
template <DataType D>
using ElementType = typename detail::ElementTypeOf<D>::type;

}  // namespace coltrain

namespace coltrain::detail {

// The constants of a 16-bit float format, as std::numeric_limits names them; bit patterns for
// values.
struct HalfFormat {
  static constexpr int digits = 11, digits10 = 3, max_digits10 = 5;
  static constexpr int min_exponent = -13, min_exponent10 = -4;
  static constexpr int max_exponent = 16, max_exponent10 = 4;
  static constexpr bool is_iec559 = true;
  static constexpr std::uint16_t min = 0x0400, lowest = 0xfbff, max = 0x7bff, epsilon = 0x1400,
                                 round_error = 0x3800, infinity = 0x7c00, quiet_nan = 0x7e00,
                                 signaling_nan = 0x7d00, denorm_min = 0x0001;
};

// bfloat16 is not an IEEE 754 interchange format, hence is_iec559 = false (as in PyTorch and JAX).
struct BFloat16Format {
  static constexpr int digits = 8, digits10 = 2, max_digits10 = 4;
  static constexpr int min_exponent = -125, min_exponent10 = -37;
  static constexpr int max_exponent = 128, max_exponent10 = 38;
  static constexpr bool is_iec559 = false;
  static constexpr std::uint16_t min = 0x0080, lowest = 0xff7f, max = 0x7f7f, epsilon = 0x3c00,
                                 round_error = 0x3f00, infinity = 0x7f80, quiet_nan = 0x7fc0,
                                 signaling_nan = 0x7fa0, denorm_min = 0x0001;
};

template <class T, class Format>
struct NarrowFloatLimits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr bool is_iec559 = Format::is_iec559;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = Format::digits;
  static constexpr int digits10 = Format::digits10;
  static constexpr int max_digits10 = Format::max_digits10;
  static constexpr int radix = 2;
  static constexpr int min_exponent = Format::min_exponent;
  static constexpr int min_exponent10 = Format::min_exponent10;
  static constexpr int max_exponent = Format::max_exponent;
  static constexpr int max_exponent10 = Format::max_exponent10;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  COLTRAIN_HOST_DEVICE static constexpr T min() noexcept { return T::from_bits(Format::min); }
  COLTRAIN_HOST_DEVICE static constexpr T lowest() noexcept { return T::from_bits(Format::lowest); }
  COLTRAIN_HOST_DEVICE static constexpr T max() noexcept { return T::from_bits(Format::max); }
  COLTRAIN_HOST_DEVICE static constexpr T epsilon() noexcept {
    return T::from_bits(Format::epsilon);
  }
  COLTRAIN_HOST_DEVICE static constexpr T round_error() noexcept {
    return T::from_bits(Format::round_error);
  }
  COLTRAIN_HOST_DEVICE static constexpr T infinity() noexcept {
    return T::from_bits(Format::infinity);
  }
  COLTRAIN_HOST_DEVICE static constexpr T quiet_NaN() noexcept {
    return T::from_bits(Format::quiet_nan);
  }
  COLTRAIN_HOST_DEVICE static constexpr T signaling_NaN() noexcept {
    return T::from_bits(Format::signaling_nan);
  }
  COLTRAIN_HOST_DEVICE static constexpr T denorm_min() noexcept {
    return T::from_bits(Format::denorm_min);
  }
};

}  // namespace coltrain::detail

template <>
struct std::numeric_limits<coltrain::half>
    : coltrain::detail::NarrowFloatLimits<coltrain::half, coltrain::detail::HalfFormat> {};

template <>
struct std::numeric_limits<coltrain::bfloat16>
    : coltrain::detail::NarrowFloatLimits<coltrain::bfloat16, coltrain::detail::BFloat16Format> {};
