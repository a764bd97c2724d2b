// safetensors files (tensor/safetensors.hpp's SafetensorsReader): the header length, the JSON
// header and the byte ranges it gives. What the reader accepts must hold together: each tensor's
// bytes are its shape's elements of its dtype, and they tile the data section.

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using coltrain::fuzz::fuzz_check;
  const auto file = coltrain::fuzz::write_input("input.safetensors", data, size);
  try {
    const coltrain::tensor::SafetensorsReader reader(file);
    std::uint64_t tensor_bytes = 0;
    for (const coltrain::tensor::SafetensorsEntry& e : reader.entries()) {
      fuzz_check(reader.contains(e.name), "safetensors: every entry found by name");
      const std::size_t bytes = reader.bytes(e.name).size();
      fuzz_check(bytes == e.numel() * coltrain::size_of(e.dtype),
                 "safetensors: a tensor's bytes are its elements");
      tensor_bytes += bytes;
    }
    fuzz_check(tensor_bytes <= size, "safetensors: tensors within the file");
    if (reader.contains("x") && reader.entry("x").dtype == coltrain::DataType::kFloat32) {
      fuzz_check(reader.read<float>("x").size() == reader.entry("x").numel(),
                 "safetensors: read<float> gives numel values");
    }
  } catch (const coltrain::IoError&) {
  }
  return 0;
}
