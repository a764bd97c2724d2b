// Element types: exhaustive checks of the half and bfloat16 conversions against independent
// references (the compiler's _Float16 for half, a distance-based rounding written here for
// bfloat16), and the DataType tables and traits.

#include <coltrain/core/dtype.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// The compiler's own binary16 is the reference for half, so the half tests cannot run without it.
#ifndef __FLT16_MANT_DIG__
#error "test_dtype.cpp needs _Float16 (g++ >= 12 or clang >= 15 on x86-64, or an AArch64 compiler)"
#endif

namespace {

using coltrain::bfloat16;
using coltrain::DataType;
using coltrain::half;

constexpr std::uint32_t kPatterns = 0x10000;

std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }
float float_from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }

// A sweep over many values reports its first few mismatches in one assertion instead of asserting
// per value, which keeps the run fast and the failure readable.
class Mismatches {
 public:
  void add(const char* format, std::uint32_t input, std::uint32_t got, std::uint32_t expected) {
    if (count_++ < kShown) {
      char line[128];
      std::snprintf(line, sizeof line, format, input, got, expected);
      report_ += line;
      report_ += '\n';
    }
  }
  std::size_t count() const { return count_; }
  const std::string& report() const { return report_; }

 private:
  static constexpr std::size_t kShown = 10;
  std::size_t count_ = 0;
  std::string report_;
};

#define CHECK_NO_MISMATCHES(m) \
  do {                         \
    INFO((m).report());        \
    CHECK((m).count() == 0);   \
  } while (0)

bool is_nan_float_bits(std::uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }
bool is_nan_half_bits(std::uint16_t bits) { return (bits & 0x7fffu) > 0x7c00u; }

std::uint16_t reference_half_bits(float value) {
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
}

double half_value(std::uint16_t bits) { return static_cast<double>(std::bit_cast<_Float16>(bits)); }

// Values equal as bits, or both NaN with the same sign.
bool same_half(std::uint16_t got, std::uint16_t expected) {
  if (is_nan_half_bits(expected)) {
    return is_nan_half_bits(got) && (got & 0x8000u) == (expected & 0x8000u);
  }
  return got == expected;
}

// The value of a bfloat16 pattern by the format's definition: the high half of a float.
double bf16_value(std::uint32_t bits) { return static_cast<double>(float_from_bits(bits << 16)); }

// Rounds a non-NaN float to bfloat16 by picking the nearer of the two bfloat16 values around it,
// measured in double (exact for two floats this close), ties to the even pattern. Past the largest
// finite value the next value up is 2^128, which the format encodes as Inf.
std::uint16_t reference_bf16_bits(float value) {
  const std::uint32_t x = bits_of(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t magnitude = x & 0x7fffffffu;
  const std::uint32_t below = magnitude >> 16;
  if ((below << 16) == magnitude) return static_cast<std::uint16_t>(sign | below);
  const std::uint32_t above = below + 1;
  const double low = bf16_value(below);
  const double high = above == 0x7f80u ? 0x1p128 : bf16_value(above);
  const double distance_low = std::fabs(static_cast<double>(value)) - low;
  const double distance_high = high - std::fabs(static_cast<double>(value));
  std::uint32_t nearest = (below & 1u) == 0 ? below : above;
  if (distance_low < distance_high) nearest = below;
  if (distance_high < distance_low) nearest = above;
  return static_cast<std::uint16_t>(sign | nearest);
}

// Appends v, the midpoint m between v and the next value up in magnitude (`next`), and m's
// neighbours in float. Both formats have at most 11 significant bits, so m, with one more, is exact
// in double and in float.
void add_value_and_midpoint(std::vector<float>& out, double value, double next) {
  const auto v = static_cast<float>(value);
  const auto m = static_cast<float>((value + next) / 2);
  const float away = std::copysign(std::numeric_limits<float>::infinity(), v);
  out.insert(out.end(), {v, m, std::nextafter(m, away), std::nextafter(m, -away)});
}

// Every finite half value and, around each, the midpoint to its successor in magnitude and the
// floats just beside that midpoint. The successor of the largest half is 65536, one ulp up, so the
// midpoint 65520 is the first value that rounds to Inf.
std::vector<float> half_rounding_inputs() {
  std::vector<float> inputs;
  inputs.reserve(4 * kPatterns);
  for (std::uint32_t bits = 0; bits < kPatterns; ++bits) {
    if ((bits & 0x7c00u) == 0x7c00u) continue;
    const double value = half_value(static_cast<std::uint16_t>(bits));
    const double next = (bits & 0x7fffu) == 0x7bffu
                            ? std::copysign(65536.0, value)
                            : half_value(static_cast<std::uint16_t>(bits + 1));
    add_value_and_midpoint(inputs, value, next);
  }
  return inputs;
}

// The same for bfloat16, whose largest finite value's successor is 2^128.
std::vector<float> bf16_rounding_inputs() {
  std::vector<float> inputs;
  inputs.reserve(4 * kPatterns);
  for (std::uint32_t bits = 0; bits < kPatterns; ++bits) {
    if ((bits & 0x7f80u) == 0x7f80u) continue;
    const double value = bf16_value(bits);
    const double next =
        (bits & 0x7fffu) == 0x7f7fu ? std::copysign(0x1p128, value) : bf16_value(bits + 1);
    add_value_and_midpoint(inputs, value, next);
  }
  return inputs;
}

// Every float pattern reachable by a prime stride: all exponents, both signs, NaNs and subnormals.
std::vector<float> strided_float_inputs() {
  constexpr std::uint64_t kStride = 4099;
  std::vector<float> inputs;
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += kStride) {
    inputs.push_back(float_from_bits(static_cast<std::uint32_t>(bits)));
  }
  return inputs;
}

}  // namespace

TEST_CASE("half to float matches _Float16 for all 65536 bit patterns", "[dtype][half]") {
  Mismatches mismatches;
  for (std::uint32_t bits = 0; bits < kPatterns; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const std::uint32_t got = bits_of(static_cast<float>(half::from_bits(h)));
    const std::uint32_t expected = bits_of(static_cast<float>(std::bit_cast<_Float16>(h)));
    const bool same = is_nan_float_bits(expected)
                          ? is_nan_float_bits(got) && (got >> 31) == (expected >> 31)
                          : got == expected;
    if (!same) mismatches.add("half %04x -> float %08x, _Float16 gives %08x", bits, got, expected);
  }
  CHECK_NO_MISMATCHES(mismatches);
  // A NaN is quieted and keeps its sign and payload.
  CHECK(bits_of(static_cast<float>(half::from_bits(0xfd01))) == 0xffe02000u);
  CHECK(bits_of(static_cast<float>(half::from_bits(0x7fff))) == 0x7fffe000u);
}

TEST_CASE("float to half rounds like _Float16 at every half value, midpoint and midpoint neighbour",
          "[dtype][half]") {
  const std::vector<float> inputs = half_rounding_inputs();
  Mismatches mismatches;
  for (const float value : inputs) {
    const std::uint16_t got = half(value).bits();
    const std::uint16_t expected = reference_half_bits(value);
    if (got != expected) {
      mismatches.add("float %08x -> half %04x, _Float16 gives %04x", bits_of(value), got, expected);
    }
  }
  CHECK_NO_MISMATCHES(mismatches);
}

TEST_CASE("float to half matches _Float16 on a strided sweep of all float bit patterns",
          "[dtype][half]") {
  Mismatches mismatches;
  for (const float value : strided_float_inputs()) {
    const std::uint16_t got = half(value).bits();
    const std::uint16_t expected = reference_half_bits(value);
    if (!same_half(got, expected)) {
      mismatches.add("float %08x -> half %04x, _Float16 gives %04x", bits_of(value), got, expected);
    }
  }
  CHECK_NO_MISMATCHES(mismatches);
}

TEST_CASE("float to half handles overflow, infinities, NaN payloads, subnormals and signed zero",
          "[dtype][half]") {
  struct Case {
    std::uint32_t input;
    std::uint16_t expected;
  };
  const Case cases[] = {
      {bits_of(65504.0f), 0x7bff},   // largest half
      {bits_of(65519.99f), 0x7bff},  // just below the midpoint to 65536
      {bits_of(65520.0f), 0x7c00},   // the midpoint: ties away from the odd 0x7bff, to Inf
      {bits_of(-65520.0f), 0xfc00},
      {bits_of(1e6f), 0x7c00},
      {bits_of(FLT_MAX), 0x7c00},
      {0x7f800000u, 0x7c00},  // +Inf
      {0xff800000u, 0xfc00},  // -Inf
      {0x80000000u, 0x8000},  // -0
      {0x00000000u, 0x0000},
      {0x00000001u, 0x0000},        // smallest float subnormal
      {0x807fffffu, 0x8000},        // largest float subnormal, negative
      {bits_of(0x1p-25f), 0x0000},  // half the smallest half subnormal: tie to even 0
      {bits_of(0x1.000002p-25f), 0x0001},
      {bits_of(0x1p-24f), 0x0001},             // smallest half subnormal
      {bits_of(0x1.8p-24f), 0x0002},           // 1.5 units: tie to even 2
      {bits_of(0x1p-14f - 0x1p-25f), 0x0400},  // midpoint of largest subnormal and min normal
      {0x7fc00000u, 0x7e00},                   // quiet NaN
      {0xffc00000u, 0xfe00},                   // negative quiet NaN keeps its sign
      {0x7f800001u, 0x7e00},                   // signalling NaN, payload below half's: quieted
      {0xff800001u, 0xfe00},
      {0x7fa00000u, 0x7f00},  // signalling NaN, payload's top bits kept
      {0xffffe000u, 0xffff},  // every payload bit that half can hold
  };
  for (const Case& c : cases) {
    CAPTURE(c.input);
    const std::uint16_t got = half(float_from_bits(c.input)).bits();
    CHECK(got == c.expected);
    CHECK(got == reference_half_bits(float_from_bits(c.input)));
  }
}

TEST_CASE("bfloat16 to float is the pattern shifted into the high half for all 65536 patterns",
          "[dtype][bfloat16]") {
  Mismatches mismatches;
  for (std::uint32_t bits = 0; bits < kPatterns; ++bits) {
    const std::uint32_t got =
        bits_of(static_cast<float>(bfloat16::from_bits(static_cast<std::uint16_t>(bits))));
    if (got != bits << 16) {
      mismatches.add("bfloat16 %04x -> float %08x, expected %08x", bits, got, bits << 16);
    }
  }
  CHECK_NO_MISMATCHES(mismatches);
}

TEST_CASE(
    "float to bfloat16 rounds to nearest even at every value, midpoint and midpoint neighbour",
    "[dtype][bfloat16]") {
  const std::vector<float> inputs = bf16_rounding_inputs();
  Mismatches mismatches;
  for (const float value : inputs) {
    const std::uint16_t got = bfloat16(value).bits();
    const std::uint16_t expected = reference_bf16_bits(value);
    if (got != expected) {
      mismatches.add("float %08x -> bfloat16 %04x, reference gives %04x", bits_of(value), got,
                     expected);
    }
  }
  CHECK_NO_MISMATCHES(mismatches);
}

TEST_CASE("float to bfloat16 matches the reference on a strided sweep of all float bit patterns",
          "[dtype][bfloat16]") {
  Mismatches mismatches;
  for (const float value : strided_float_inputs()) {
    const std::uint32_t x = bits_of(value);
    const std::uint16_t got = bfloat16(value).bits();
    if (is_nan_float_bits(x)) {
      // Quieted, with the sign and the payload's top bits.
      const std::uint32_t expected = (x >> 16) | 0x0040u;
      if (got != expected)
        mismatches.add("NaN %08x -> bfloat16 %04x, expected %04x", x, got, expected);
    } else if (got != reference_bf16_bits(value)) {
      mismatches.add("float %08x -> bfloat16 %04x, reference gives %04x", x, got,
                     reference_bf16_bits(value));
    }
  }
  CHECK_NO_MISMATCHES(mismatches);
}

TEST_CASE("float to bfloat16 handles overflow, NaN payloads, subnormals and signed zero",
          "[dtype][bfloat16]") {
  struct Case {
    std::uint32_t input;
    std::uint16_t expected;
  };
  const Case cases[] = {
      {0x7f7f7fffu, 0x7f7f},  // below the midpoint between the largest bfloat16 and 2^128
      {0x7f7f8000u, 0x7f80},  // the midpoint: ties away from the odd 0x7f7f, to Inf
      {bits_of(FLT_MAX), 0x7f80},
      {bits_of(-FLT_MAX), 0xff80},
      {0x7f7e8000u, 0x7f7e},  // a tie next to an even pattern stays
      {0x7f800000u, 0x7f80},
      {0xff800000u, 0xff80},
      {0x80000000u, 0x8000},
      {0x00000001u, 0x0000},  // smallest float subnormal
      {0x00008000u, 0x0000},  // subnormal tie to even 0
      {0x00018000u, 0x0002},  // subnormal tie to even 2
      {0x00008001u, 0x0001},
      {0x807fffffu, 0x8080},  // largest subnormal rounds up to the smallest normal
      {0x7fc00000u, 0x7fc0},
      {0xffc00000u, 0xffc0},  // negative NaN keeps its sign
      {0x7f800001u, 0x7fc0},  // signalling NaN, payload below bfloat16's: quieted, not Inf
      {0xff810000u, 0xffc1},  // signalling NaN, payload's top bits kept
  };
  for (const Case& c : cases) {
    CAPTURE(c.input);
    CHECK(bfloat16(float_from_bits(c.input)).bits() == c.expected);
  }
}

TEST_CASE("half and bfloat16 are two-byte trivially copyable types usable in constant expressions",
          "[dtype]") {
  STATIC_REQUIRE(sizeof(half) == 2);
  STATIC_REQUIRE(alignof(half) == 2);
  STATIC_REQUIRE(std::is_trivially_copyable_v<half>);
  STATIC_REQUIRE(std::is_trivially_default_constructible_v<bfloat16>);
  STATIC_REQUIRE(!std::is_convertible_v<float, half>);
  STATIC_REQUIRE(!std::is_convertible_v<half, float>);
  STATIC_REQUIRE(half(1.0f).bits() == 0x3c00);
  STATIC_REQUIRE(half(-2.0f).bits() == 0xc000);
  STATIC_REQUIRE(static_cast<float>(half::from_bits(0x0001)) == 0x1p-24f);
  STATIC_REQUIRE(bfloat16(1.0f).bits() == 0x3f80);
  STATIC_REQUIRE(static_cast<float>(bfloat16::from_bits(0xc040)) == -3.0f);
  STATIC_REQUIRE(half{}.bits() == 0);
}

TEST_CASE("half and bfloat16 compare like the floats they hold", "[dtype]") {
  CHECK(half(1.0f) < half(2.0f));
  CHECK(half(2.0f) >= half(2.0f));
  CHECK(half(0.0f) == half(-0.0f));
  const half nan = std::numeric_limits<half>::quiet_NaN();
  CHECK_FALSE(nan == nan);
  CHECK(nan != nan);
  CHECK_FALSE(nan < half(1.0f));
  CHECK_FALSE(nan >= half(1.0f));
  CHECK(bfloat16(-1.0f) < bfloat16(0.5f));
  CHECK(bfloat16(3.0f) > bfloat16(2.0f));
  CHECK(bfloat16(3.0f) <= bfloat16(3.0f));
  CHECK(bfloat16(1.0f) == bfloat16(1.001f));  // 1.001 rounds to 1 with 8 bits of precision
}

TEST_CASE("numeric_limits of half and bfloat16 hold the formats' constants", "[dtype]") {
  using HalfLimits = std::numeric_limits<half>;
  using Bf16Limits = std::numeric_limits<bfloat16>;
  CHECK(static_cast<float>(HalfLimits::max()) == 65504.0f);
  CHECK(static_cast<float>(HalfLimits::lowest()) == -65504.0f);
  CHECK(static_cast<float>(HalfLimits::min()) == 0x1p-14f);
  CHECK(static_cast<float>(HalfLimits::denorm_min()) == 0x1p-24f);
  CHECK(static_cast<float>(HalfLimits::epsilon()) == 0x1p-10f);
  CHECK(std::isinf(static_cast<float>(HalfLimits::infinity())));
  CHECK(std::isnan(static_cast<float>(HalfLimits::quiet_NaN())));
  CHECK(std::isnan(static_cast<float>(HalfLimits::signaling_NaN())));
  CHECK(static_cast<float>(Bf16Limits::max()) == 0x1.fep127f);
  CHECK(static_cast<float>(Bf16Limits::lowest()) == -0x1.fep127f);
  CHECK(static_cast<float>(Bf16Limits::min()) == FLT_MIN);
  CHECK(static_cast<float>(Bf16Limits::denorm_min()) == 0x1p-133f);
  CHECK(static_cast<float>(Bf16Limits::epsilon()) == 0x1p-7f);
  CHECK(std::isinf(static_cast<float>(Bf16Limits::infinity())));
  CHECK(std::isnan(static_cast<float>(Bf16Limits::quiet_NaN())));
  CHECK(std::isnan(static_cast<float>(Bf16Limits::signaling_NaN())));
  STATIC_REQUIRE(HalfLimits::is_iec559);
  STATIC_REQUIRE(!Bf16Limits::is_iec559);
  STATIC_REQUIRE(HalfLimits::digits == 11);
  STATIC_REQUIRE(Bf16Limits::digits == 8);
}

TEST_CASE("DataType traits map each element type to its tag and back", "[dtype]") {
  STATIC_REQUIRE(coltrain::data_type_v<float> == DataType::kFloat32);
  STATIC_REQUIRE(coltrain::data_type_v<double> == DataType::kFloat64);
  STATIC_REQUIRE(coltrain::data_type_v<half> == DataType::kFloat16);
  STATIC_REQUIRE(coltrain::data_type_v<bfloat16> == DataType::kBFloat16);
  STATIC_REQUIRE(coltrain::data_type_v<std::int32_t> == DataType::kInt32);
  STATIC_REQUIRE(coltrain::data_type_v<std::int64_t> == DataType::kInt64);
  STATIC_REQUIRE(coltrain::data_type_v<std::uint8_t> == DataType::kUInt8);
  STATIC_REQUIRE(coltrain::data_type_v<const volatile float> == DataType::kFloat32);
  STATIC_REQUIRE(coltrain::SupportedElement<half>);
  STATIC_REQUIRE(!coltrain::SupportedElement<char>);
  STATIC_REQUIRE(!coltrain::SupportedElement<std::string>);

  // size_of agrees with sizeof of the mapped type, and the reverse map inverts the forward one.
  []<std::size_t... I>(std::index_sequence<I...>) {
    constexpr auto& all = coltrain::kAllDataTypes;
    STATIC_REQUIRE(((coltrain::data_type_v<coltrain::ElementType<all[I]>> == all[I]) && ...));
    STATIC_REQUIRE(((coltrain::size_of(all[I]) == sizeof(coltrain::ElementType<all[I]>)) && ...));
    STATIC_REQUIRE(((coltrain::is_floating(all[I]) ==
                     !std::is_integral_v<coltrain::ElementType<all[I]>>)&&...));
  }
  (std::make_index_sequence<coltrain::kAllDataTypes.size()>{});
}

TEST_CASE("name_of gives the short names and parse_data_type reads them back", "[dtype]") {
  CHECK(coltrain::name_of(DataType::kFloat32) == "f32");
  CHECK(coltrain::name_of(DataType::kFloat64) == "f64");
  CHECK(coltrain::name_of(DataType::kFloat16) == "f16");
  CHECK(coltrain::name_of(DataType::kBFloat16) == "bf16");
  CHECK(coltrain::name_of(DataType::kInt32) == "i32");
  CHECK(coltrain::name_of(DataType::kInt64) == "i64");
  CHECK(coltrain::name_of(DataType::kUInt8) == "u8");
  for (const DataType type : coltrain::kAllDataTypes) {
    CHECK(coltrain::parse_data_type(coltrain::name_of(type)) == type);
  }
}

TEST_CASE("parse_data_type accepts the long aliases", "[dtype]") {
  CHECK(coltrain::parse_data_type("float32") == DataType::kFloat32);
  CHECK(coltrain::parse_data_type("float") == DataType::kFloat32);
  CHECK(coltrain::parse_data_type("float64") == DataType::kFloat64);
  CHECK(coltrain::parse_data_type("double") == DataType::kFloat64);
  CHECK(coltrain::parse_data_type("float16") == DataType::kFloat16);
  CHECK(coltrain::parse_data_type("half") == DataType::kFloat16);
  CHECK(coltrain::parse_data_type("bfloat16") == DataType::kBFloat16);
  CHECK(coltrain::parse_data_type("int32") == DataType::kInt32);
  CHECK(coltrain::parse_data_type("int64") == DataType::kInt64);
  CHECK(coltrain::parse_data_type("uint8") == DataType::kUInt8);
}

TEST_CASE("parse_data_type rejects an unknown name with a message naming it and the valid names",
          "[dtype]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_AS(coltrain::parse_data_type("float8"), coltrain::InvalidArgument);
  CHECK_THROWS_WITH(coltrain::parse_data_type("float8"), Contains("'float8'") && Contains("f32") &&
                                                             Contains("bf16") && Contains("uint8"));
  CHECK_THROWS_WITH(coltrain::parse_data_type(""), Contains("''"));
  CHECK_THROWS_AS(coltrain::parse_data_type("F32"), coltrain::InvalidArgument);
}

TEST_CASE("size_of, name_of and is_floating describe each DataType", "[dtype]") {
  STATIC_REQUIRE(coltrain::size_of(DataType::kBFloat16) == 2);
  STATIC_REQUIRE(coltrain::size_of(DataType::kInt64) == 8);
  STATIC_REQUIRE(coltrain::size_of(DataType::kUInt8) == 1);
  STATIC_REQUIRE(coltrain::is_floating(DataType::kFloat16));
  STATIC_REQUIRE(!coltrain::is_floating(DataType::kInt32));
  // A value outside the enum, as from a corrupted header, is recognisable rather than undefined.
  constexpr auto corrupt = static_cast<DataType>(200);
  STATIC_REQUIRE(coltrain::size_of(corrupt) == 0);
  STATIC_REQUIRE(coltrain::name_of(corrupt) == "invalid");
  STATIC_REQUIRE(!coltrain::is_floating(corrupt));
}
