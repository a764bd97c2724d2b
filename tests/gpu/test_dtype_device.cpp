// The device conversions of half and bfloat16 (hardware instructions plus coltrain's NaN handling)
// must give the same bits as the host conversions, which test_dtype.cpp checks exhaustively. Data
// moved between host and device code must not change value on the way.

#include "dtype_device_kernels.hpp"

#include <coltrain/core/dtype.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace {

using coltrain::bfloat16;
using coltrain::half;

constexpr std::uint32_t kPatterns = 0x10000;

std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }

// Every value of both formats (NaNs with their payloads included), the midpoint to the next pattern
// and the floats beside it, where rounding is decided; then a strided sweep of all float patterns.
std::vector<float> conversion_inputs() {
  std::vector<float> inputs;
  const auto add_around = [&inputs](float value, float next) {
    inputs.push_back(value);
    if (!std::isfinite(value) || !std::isfinite(next)) return;
    const auto midpoint =
        static_cast<float>((static_cast<double>(value) + static_cast<double>(next)) / 2);
    inputs.insert(inputs.end(), {midpoint, std::nextafter(midpoint, INFINITY),
                                 std::nextafter(midpoint, -INFINITY)});
  };
  for (std::uint32_t bits = 0; bits < kPatterns; ++bits) {
    const auto pattern = static_cast<std::uint16_t>(bits);
    const auto next = static_cast<std::uint16_t>(bits + 1);
    add_around(static_cast<float>(half::from_bits(pattern)),
               static_cast<float>(half::from_bits(next)));
    add_around(static_cast<float>(bfloat16::from_bits(pattern)),
               static_cast<float>(bfloat16::from_bits(next)));
  }
  inputs.insert(inputs.end(),
                {65519.99f, 65520.0f, -65520.0f, FLT_MAX, -FLT_MAX,
                 std::bit_cast<float>(0x7f7f8000u), std::bit_cast<float>(0x00018000u),
                 std::bit_cast<float>(0x7fa00000u), std::bit_cast<float>(0xff800001u)});
  constexpr std::uint64_t kStride = 4099;
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += kStride) {
    inputs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  }
  return inputs;
}

// Counts differences and keeps the first few for the failure message.
class Differences {
 public:
  void add(const char* what, std::uint32_t input, std::uint32_t device, std::uint32_t host) {
    if (count_++ < 10) {
      char line[160];
      std::snprintf(line, sizeof line, "%s of %08x: device %08x, host %08x\n", what, input, device,
                    host);
      report_ += line;
    }
  }
  std::size_t count() const { return count_; }
  const std::string& report() const { return report_; }

 private:
  std::size_t count_ = 0;
  std::string report_;
};

}  // namespace

TEST_CASE("device conversions of half and bfloat16 match the host bit for bit", "[gpu][dtype]") {
  const std::vector<float> inputs = conversion_inputs();
  const coltrain::test::DeviceDtypeConversions device =
      coltrain::test::convert_half_and_bf16_on_device(inputs);
  REQUIRE(device.half_to_float.size() == kPatterns);
  REQUIRE(device.bf16_to_float.size() == kPatterns);
  REQUIRE(device.float_to_half_bits.size() == inputs.size());
  REQUIRE(device.float_to_bf16_bits.size() == inputs.size());

  Differences differences;
  for (std::uint32_t bits = 0; bits < kPatterns; ++bits) {
    const auto pattern = static_cast<std::uint16_t>(bits);
    const std::uint32_t half_host = bits_of(static_cast<float>(half::from_bits(pattern)));
    const std::uint32_t bf16_host = bits_of(static_cast<float>(bfloat16::from_bits(pattern)));
    if (bits_of(device.half_to_float[bits]) != half_host) {
      differences.add("half -> float", bits, bits_of(device.half_to_float[bits]), half_host);
    }
    if (bits_of(device.bf16_to_float[bits]) != bf16_host) {
      differences.add("bfloat16 -> float", bits, bits_of(device.bf16_to_float[bits]), bf16_host);
    }
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::uint16_t half_host = half(inputs[i]).bits();
    const std::uint16_t bf16_host = bfloat16(inputs[i]).bits();
    if (device.float_to_half_bits[i] != half_host) {
      differences.add("float -> half", bits_of(inputs[i]), device.float_to_half_bits[i], half_host);
    }
    if (device.float_to_bf16_bits[i] != bf16_host) {
      differences.add("float -> bfloat16", bits_of(inputs[i]), device.float_to_bf16_bits[i],
                      bf16_host);
    }
  }
  INFO(differences.report());
  CHECK(differences.count() == 0);
}
