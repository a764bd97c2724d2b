// coltrain and tests/parity/safetensors_io.py (the numpy reader and writer of the PyTorch parity
// scripts) read each other's files with exact values. The Python half is safetensors_interop.py.

#include <catch2/catch.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/safetensors.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"

#ifndef COLTRAIN_TEST_PYTHON
#error "COLTRAIN_TEST_PYTHON must name the Python interpreter (tests/tensor/CMakeLists.txt)"
#endif
#ifndef COLTRAIN_TEST_SAFETENSORS_SCRIPT
#error "COLTRAIN_TEST_SAFETENSORS_SCRIPT must name safetensors_interop.py"
#endif

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using coltrain::bfloat16;
using coltrain::DataType;
using coltrain::half;
using coltrain::tensor::SafetensorsReader;
using coltrain::tensor::SafetensorsWriter;

namespace {

using coltrain::testing::TempDir;

std::string quoted(const std::string& text) { return "'" + text + "'"; }

template <class T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& values) {
  std::vector<std::uint16_t> bits;
  for (const T value : values) bits.push_back(value.bits());
  return bits;
}

void write_cpp_file(const fs::path& file) {
  SafetensorsWriter writer;
  writer.add("f32", {2, 4},
             std::vector<float>{0.0f, -0.0f, 1.5f, -2.25f, std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::denorm_min(), 0.1f});
  writer.add("f64", {3},
             std::vector<double>{0.1, -1e300, std::numeric_limits<double>::denorm_min()});
  std::vector<half> f16;
  for (const std::uint16_t bits : {0x0000, 0x8000, 0x3c00, 0x7bff, 0x0001, 0x7c00}) {
    f16.push_back(half::from_bits(bits));
  }
  writer.add("f16", {2, 3}, f16);
  std::vector<bfloat16> bf16;
  for (const std::uint16_t bits : {0x0000, 0x8000, 0x3f80, 0x7f7f, 0x0001, 0xff80}) {
    bf16.push_back(bfloat16::from_bits(bits));
  }
  writer.add("bf16", {3, 2}, bf16);
  writer.add("i32", {5},
             std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min(), -1, 0, 1,
                                       std::numeric_limits<std::int32_t>::max()});
  writer.add(
      "i64", {2, 3},
      std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), -1, 0, 1,
                                std::numeric_limits<std::int64_t>::max(), std::int64_t{1} << 40});
  std::vector<std::uint8_t> u8(256);
  for (int i = 0; i < 256; ++i) u8[i] = static_cast<std::uint8_t>(i);
  writer.add("u8", {16, 16}, u8);
  writer.add("scalar", {}, std::vector<float>{42.5f});
  writer.add("num_batches_tracked", {}, std::vector<std::int64_t>{7});
  writer.add("empty", {0, 3}, std::vector<float>{});
  writer.set_metadata("format", "pt");
  writer.set_metadata("producer", "coltrain");
  writer.write(file);
}

}  // namespace

TEST_CASE("coltrain and the numpy safetensors module read each other's files exactly",
          "[safetensors][python]") {
  TempDir dir;
  const fs::path cpp_file = dir / "cpp.safetensors";
  const fs::path py_file = dir / "py.safetensors";
  const fs::path bool_file = dir / "py_bool.safetensors";
  write_cpp_file(cpp_file);

  // The script asserts the values of cpp_file and writes the other two.
  const std::string command =
      quoted(COLTRAIN_TEST_PYTHON) + " " + quoted(COLTRAIN_TEST_SAFETENSORS_SCRIPT) + " " +
      quoted(cpp_file.string()) + " " + quoted(py_file.string()) + " " + quoted(bool_file.string());
  INFO(command);
  const int status = std::system(command.c_str());
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);

  const SafetensorsReader reader(py_file);
  CHECK(reader.metadata() == std::map<std::string, std::string>{{"producer", "numpy"},
                                                                {"note",
                                                                 "\xc3\xbc"
                                                                 "n\xc3\xaf"
                                                                 "code \xe2\x9c\x93"}});
  CHECK(reader.entries().size() == 12);
  for (const auto& entry : reader.entries()) {
    INFO(entry.name);
    CHECK((8 + entry.begin) % coltrain::size_of(entry.dtype) == 0);  // header is padded to 8
  }

  std::vector<float> f32;
  for (int i = 0; i < 12; ++i) f32.push_back(static_cast<float>(i) * 0.5f - 1.0f);
  CHECK(reader.entry("py.f32").shape == std::vector<std::int64_t>{3, 4});
  CHECK(reader.read<float>("py.f32") == f32);
  CHECK(reader.read<double>("py.f64") == std::vector<double>{1.0 / 3.0, -2.5e-310, 1e308});
  CHECK(reader.entry("py.f16").shape == std::vector<std::int64_t>{2, 2});
  CHECK(bits_of(reader.read<half>("py.f16")) ==
        std::vector<std::uint16_t>{0x3800, 0xfbff, 0x0001, 0x7e00});
  // numpy's float32 -> float16 rounding agrees with coltrain's, at the overflow threshold too.
  const std::vector<std::uint16_t> f16_rounded = bits_of(reader.read<half>("py.f16_rounded"));
  CHECK(f16_rounded == std::vector<std::uint16_t>{0x2e66, 0x3555, 0x7bff, 0x7c00});
  CHECK(f16_rounded ==
        bits_of(std::vector<half>{half(0.1f), half(1.0f / 3.0f), half(65519.0f), half(65520.0f)}));
  const std::vector<std::uint16_t> bf16 = bits_of(reader.read<bfloat16>("py.bf16"));
  CHECK(bf16 == std::vector<std::uint16_t>{0x3f80, 0xc000, 0x4049, 0x3f80, 0x3f82});
  CHECK(bf16 == bits_of(std::vector<bfloat16>{bfloat16(1.0f), bfloat16(-2.0f), bfloat16(3.140625f),
                                              bfloat16(1.00390625f), bfloat16(1.01171875f)}));
  CHECK(reader.entry("py.i32").shape == std::vector<std::int64_t>{2, 2});
  CHECK(reader.read<std::int32_t>("py.i32") == std::vector<std::int32_t>{-7, 8, 9, -10});
  CHECK(reader.read<std::int64_t>("py.i64") ==
        std::vector<std::int64_t>{std::int64_t{1} << 62, -(std::int64_t{1} << 62), 0});
  CHECK(reader.read<std::uint8_t>("py.u8") == std::vector<std::uint8_t>{255, 0, 128});
  CHECK(reader.entry("py.scalar").shape.empty());
  CHECK(reader.read<double>("py.scalar") == std::vector<double>{3.25});
  CHECK(reader.entry("py.empty").shape == std::vector<std::int64_t>{2, 0, 5});
  CHECK(reader.entry("py.empty").dtype == DataType::kInt32);
  CHECK(reader.read<std::int32_t>("py.empty").empty());
  CHECK(reader.read<float>("py.bigendian") == std::vector<float>{1.5f, 2.5f});
  CHECK(reader.entry("py.transposed").shape == std::vector<std::int64_t>{3, 2});
  CHECK(reader.read<float>("py.transposed") == std::vector<float>{0, 3, 1, 4, 2, 5});

  // A valid file with a dtype coltrain has no type for.
  CHECK_THROWS_MATCHES(SafetensorsReader(bool_file), coltrain::IoError,
                       Catch::Matchers::Predicate<coltrain::IoError>([&](const auto& e) {
                         const std::string what = e.what();
                         return what.find("'mask'") != std::string::npos &&
                                what.find("'BOOL' is not supported") != std::string::npos &&
                                what.find(bool_file.string()) != std::string::npos;
                       }));
}
