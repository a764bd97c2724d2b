#pragma once
// Runs coltrain::half and coltrain::bfloat16 conversions on the device, so that a host-compiled
// test can compare them with the host conversions. Declared without CUDA types: the test that calls
// it is built by the host compiler.

#include <cstdint>
#include <vector>

namespace coltrain::test {

// Device results, indexed like their inputs.
struct DeviceDtypeConversions {
  std::vector<float> half_to_float;               // [i]: float(half::from_bits(i)), i < 65536
  std::vector<float> bf16_to_float;               // [i]: float(bfloat16::from_bits(i)), i < 65536
  std::vector<std::uint16_t> float_to_half_bits;  // [i]: half(inputs[i]).bits()
  std::vector<std::uint16_t> float_to_bf16_bits;  // [i]: bfloat16(inputs[i]).bits()
};

// Widens all 65,536 patterns of both types and narrows every float in `inputs`, on the current
// device. Throws BackendError if a CUDA call fails.
DeviceDtypeConversions convert_half_and_bf16_on_device(const std::vector<float>& inputs);

}  // namespace coltrain::test
