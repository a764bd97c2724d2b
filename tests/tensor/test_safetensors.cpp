#include <catch2/catch.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/safetensors.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../support/parity.hpp"
#include "../support/file_size_limit.hpp"
#include "../support/temp_dir.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using coltrain::bfloat16;
using coltrain::DataType;
using coltrain::half;
using coltrain::tensor::SafetensorsReader;
using coltrain::tensor::SafetensorsWriter;

namespace {

using coltrain::testing::TempDir;

std::vector<std::byte> file_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::vector<char> chars{std::istreambuf_iterator<char>(in), {}};
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// A file as a malformed writer might produce it: the length field (by default the header's true
// length), the header text exactly as given, then `data_bytes` bytes of data.
void write_raw(const fs::path& file, std::string_view header, std::size_t data_bytes,
               std::optional<std::uint64_t> length = std::nullopt) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  const std::uint64_t n = length.value_or(header.size());
  char field[8];
  std::memcpy(field, &n, 8);
  out.write(field, 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (std::size_t i = 0; i < data_bytes; ++i) out.put(static_cast<char>(i * 7 + 1));
  REQUIRE(out.good());
}

void write_bytes(const fs::path& file, std::span<const unsigned char> bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// The IoError that reading `file` throws; fails the test when it reads without one.
coltrain::IoError read_error(const fs::path& file) {
  try {
    const SafetensorsReader reader(file);
  } catch (const coltrain::IoError& e) {
    return e;
  }
  FAIL("reading " << file << " succeeded but should have thrown IoError");
  throw std::logic_error("unreachable");
}

// Every malformed-file check: the message names the cause and the file, and the operation.
void require_rejected(const fs::path& file, std::initializer_list<std::string_view> causes) {
  const coltrain::IoError error = read_error(file);
  const std::string what = error.what();
  INFO(what);
  for (const std::string_view cause : causes) CHECK_THAT(what, Contains(std::string(cause)));
  CHECK_THAT(what, Contains(file.string()));
  CHECK(error.context().operation == "read safetensors");
}

std::uint64_t header_length(const fs::path& file) {
  const std::vector<std::byte> bytes = file_bytes(file);
  REQUIRE(bytes.size() >= 8);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

template <class T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& values) {
  std::vector<std::uint16_t> bits;
  for (const T value : values) bits.push_back(value.bits());
  return bits;
}

}  // namespace

// --- Round trips --------------------------------------------------------------------------------

TEST_CASE("every dtype round-trips with its shape and exact values", "[safetensors]") {
  TempDir dir;
  const fs::path file = dir / "all.safetensors";
  const std::vector<float> f32 = {0.0f,
                                  -0.0f,
                                  1.5f,
                                  -2.25f,
                                  std::numeric_limits<float>::max(),
                                  std::numeric_limits<float>::denorm_min()};
  const std::vector<double> f64 = {0.1, -1e300, std::numeric_limits<double>::denorm_min()};
  const std::vector<half> f16 = {half::from_bits(0x0000), half::from_bits(0x8000),
                                 half::from_bits(0x3c00), half::from_bits(0x7bff),
                                 half::from_bits(0x0001), half::from_bits(0x7e01)};  // NaN
  const std::vector<bfloat16> bf16 = {bfloat16(1.0f), bfloat16(-3.0f), bfloat16::from_bits(0x7f7f),
                                      bfloat16::from_bits(0xff80)};
  const std::vector<std::int32_t> i32 = {std::numeric_limits<std::int32_t>::min(), -1, 0,
                                         std::numeric_limits<std::int32_t>::max()};
  const std::vector<std::int64_t> i64 = {std::numeric_limits<std::int64_t>::min(), -1,
                                         std::numeric_limits<std::int64_t>::max()};
  const std::vector<std::uint8_t> u8 = {0, 1, 127, 128, 255};

  SafetensorsWriter writer;
  writer.add("f32", {2, 3}, f32);
  writer.add<double>("f64", {3}, f64);  // the span overload, with the type spelled
  writer.add("f16", {3, 2}, f16);
  writer.add("bf16", {2, 1, 2}, bf16);
  writer.add("i32", {4}, i32);
  writer.add("i64", {1, 3}, i64);
  writer.add("u8", {5}, std::span<const std::uint8_t>(u8));
  writer.write(file);

  const SafetensorsReader reader(file);
  CHECK(reader.path() == file);
  REQUIRE(reader.entries().size() == 7);
  CHECK(reader.read<float>("f32") == f32);
  CHECK(std::signbit(reader.read<float>("f32")[1]));
  CHECK(reader.read<double>("f64") == f64);
  CHECK(bits_of(reader.read<half>("f16")) == bits_of(f16));  // bits: the NaN too
  CHECK(bits_of(reader.read<bfloat16>("bf16")) == bits_of(bf16));
  CHECK(reader.read<std::int32_t>("i32") == i32);
  CHECK(reader.read<std::int64_t>("i64") == i64);
  CHECK(reader.read<std::uint8_t>("u8") == u8);

  const std::map<std::string, std::pair<DataType, std::vector<std::int64_t>>> expected = {
      {"f32", {DataType::kFloat32, {2, 3}}}, {"f64", {DataType::kFloat64, {3}}},
      {"f16", {DataType::kFloat16, {3, 2}}}, {"bf16", {DataType::kBFloat16, {2, 1, 2}}},
      {"i32", {DataType::kInt32, {4}}},      {"i64", {DataType::kInt64, {1, 3}}},
      {"u8", {DataType::kUInt8, {5}}}};
  for (const auto& [name, type_and_shape] : expected) {
    INFO(name);
    REQUIRE(reader.contains(name));
    const auto& entry = reader.entry(name);
    CHECK(entry.name == name);
    CHECK(entry.dtype == type_and_shape.first);
    CHECK(entry.shape == type_and_shape.second);
    CHECK(entry.end - entry.begin == entry.numel() * coltrain::size_of(entry.dtype));
    CHECK(reader.bytes(name).size() == entry.end - entry.begin);
  }
  CHECK_FALSE(reader.contains("missing"));
  CHECK(reader.metadata().empty());

  std::vector<float> into(6);
  reader.read_into<float>("f32", into);
  CHECK(into == f32);
  const auto raw = reader.bytes("i32");
  std::int32_t first = 0;
  std::memcpy(&first, raw.data(), 4);
  CHECK(first == std::numeric_limits<std::int32_t>::min());
}

TEST_CASE("scalars and zero-element tensors round-trip", "[safetensors]") {
  TempDir dir;
  const fs::path file = dir / "edge.safetensors";
  const std::vector<float> scalar = {42.5f};
  const std::vector<std::int64_t> count = {7};
  SafetensorsWriter writer;
  writer.add("scalar", {}, scalar);
  writer.add("num_batches_tracked", {}, count);
  writer.add("empty", {0}, std::vector<double>{});
  writer.add("empty3d", {2, 0, 3}, std::vector<std::int32_t>{});
  writer.add("empty_half", {0, 4}, std::vector<half>{});
  writer.write(file);

  const SafetensorsReader reader(file);
  CHECK(reader.entry("scalar").shape.empty());
  CHECK(reader.entry("scalar").numel() == 1);
  CHECK(reader.read<float>("scalar") == scalar);
  CHECK(reader.read<std::int64_t>("num_batches_tracked") == count);
  CHECK(reader.entry("empty").shape == std::vector<std::int64_t>{0});
  CHECK(reader.entry("empty3d").shape == std::vector<std::int64_t>{2, 0, 3});
  CHECK(reader.entry("empty3d").numel() == 0);
  CHECK(reader.read<double>("empty").empty());
  CHECK(reader.read<std::int32_t>("empty3d").empty());
  CHECK(reader.read<half>("empty_half").empty());
  CHECK(reader.bytes("empty").empty());
  reader.read_into("empty3d", std::span<std::int32_t>());
}

TEST_CASE("a file with no tensors round-trips", "[safetensors]") {
  TempDir dir;
  const fs::path file = dir / "none.safetensors";
  SafetensorsWriter().write(file);
  const SafetensorsReader reader(file);
  CHECK(reader.entries().empty());
  CHECK(reader.metadata().empty());
  CHECK(file_bytes(file).size() == 8 + header_length(file));
}

TEST_CASE("metadata round-trips, and a later value for a key replaces the earlier",
          "[safetensors]") {
  TempDir dir;
  const fs::path file = dir / "meta.safetensors";
  SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  writer.set_metadata("step", "1");
  writer.set_metadata("step", "1200");
  writer.set_metadata("note", "quotes \" and \\ and \xc3\xbcnicode");
  writer.set_metadata("", "");
  writer.add("w", {1}, std::vector<float>{1.0f});
  writer.write(file);

  const SafetensorsReader reader(file);
  const std::map<std::string, std::string> expected = {
      {"format", "pt"},
      {"step", "1200"},
      {"note", "quotes \" and \\ and \xc3\xbcnicode"},
      {"", ""}};
  CHECK(reader.metadata() == expected);
  CHECK_FALSE(reader.contains("__metadata__"));
  CHECK(reader.entries().size() == 1);
}

TEST_CASE("the header is padded with spaces to a multiple of 8 and data is aligned",
          "[safetensors]") {
  TempDir dir;
  // Names of several lengths, so that at least one header needs padding.
  for (const std::string name : {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg"}) {
    INFO(name);
    const fs::path file = dir / (name + ".safetensors");
    SafetensorsWriter writer;
    // Added narrowest first: the writer places the widest elements first, so that every tensor
    // starts at a multiple of its element size.
    writer.add(name + "_u8", {3}, std::vector<std::uint8_t>{1, 2, 3});
    writer.add(name + "_f16", {1}, std::vector<half>{half(1.0f)});
    writer.add(name + "_f32", {1}, std::vector<float>{2.0f});
    writer.add(name + "_f64", {1}, std::vector<double>{3.0});
    writer.write(file);

    const std::uint64_t n = header_length(file);
    CHECK(n % 8 == 0);
    const std::vector<std::byte> bytes = file_bytes(file);
    const std::string header(reinterpret_cast<const char*>(bytes.data()) + 8, n);
    const std::size_t json_end = header.find_last_of('}');
    REQUIRE(json_end != std::string::npos);
    CHECK(n - json_end - 1 < 8);
    CHECK(header.find_first_not_of(' ', json_end + 1) == std::string::npos);

    const SafetensorsReader reader(file);
    for (const auto& entry : reader.entries()) {
      CHECK((8 + n + entry.begin) % coltrain::size_of(entry.dtype) == 0);
    }
    CHECK(reader.entries().front().dtype == DataType::kFloat64);
    CHECK(reader.entries().back().dtype == DataType::kUInt8);
    CHECK(reader.read<std::uint8_t>(name + "_u8") == std::vector<std::uint8_t>{1, 2, 3});
    CHECK(reader.read<double>(name + "_f64") == std::vector<double>{3.0});
  }
}

TEST_CASE("hand-written files: any key order, unpadded header, entries in data order",
          "[safetensors]") {
  TempDir dir;
  const fs::path file = dir / "hand.safetensors";
  // JSON order differs from data order, and the header is not padded; both are valid.
  write_raw(file,
            R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
            R"("__metadata__":{"k":"v"},"a":{"shape":[1],"data_offsets":[0,4],"dtype":"I32"}})",
            6);
  const SafetensorsReader reader(file);
  REQUIRE(reader.entries().size() == 2);
  CHECK(reader.entries()[0].name == "a");
  CHECK(reader.entries()[1].name == "b");
  CHECK(reader.metadata() == std::map<std::string, std::string>{{"k", "v"}});
  CHECK(reader.read<std::uint8_t>("b") == std::vector<std::uint8_t>{4 * 7 + 1, 5 * 7 + 1});
}

TEST_CASE("zero-size tensors may share an offset, and a zero dimension makes huge shapes empty",
          "[safetensors]") {
  TempDir dir;
  const fs::path file = dir / "zeros.safetensors";
  write_raw(file,
            R"({"z1":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
            R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("z2":{"dtype":"F64","shape":[0,4611686018427387904,4611686018427387904],)"
            R"("data_offsets":[4,4]}})",
            4);
  const SafetensorsReader reader(file);
  CHECK(reader.entries().size() == 3);
  CHECK(reader.entry("z2").numel() == 0);
  CHECK(reader.read<double>("z2").empty());
}

// --- API misuse ----------------------------------------------------------------------------------

TEST_CASE("reading with the wrong type or size or name is InvalidArgument", "[safetensors]") {
  TempDir dir;
  const fs::path file = dir / "typed.safetensors";
  SafetensorsWriter writer;
  writer.add("w", {2, 2}, std::vector<float>{1, 2, 3, 4});
  writer.add("h", {1}, std::vector<half>{half(1.0f)});
  writer.write(file);
  const SafetensorsReader reader(file);

  CHECK_THROWS_MATCHES(reader.read<double>("w"), coltrain::InvalidArgument,
                       Catch::Matchers::Predicate<coltrain::InvalidArgument>([&](const auto& e) {
                         const std::string what = e.what();
                         return what.find("'w'") != std::string::npos &&
                                what.find("F32") != std::string::npos &&
                                what.find("f64") != std::string::npos &&
                                what.find(file.string()) != std::string::npos;
                       }));
  CHECK_THROWS_AS(reader.read<bfloat16>("h"), coltrain::InvalidArgument);
  CHECK_THROWS_WITH(reader.read<std::int32_t>("w"), Contains("f32") && Contains("i32"));

  std::vector<float> small(3);
  CHECK_THROWS_WITH(reader.read_into<float>("w", small),
                    Contains("4 elements") && Contains("holds 3") && Contains("'w'"));

  CHECK_THROWS_AS(reader.entry("nope"), coltrain::InvalidArgument);
  CHECK_THROWS_WITH(reader.read<float>("nope"), Contains("'nope'") && Contains(file.string()));
  CHECK_THROWS_AS(reader.bytes("nope"), coltrain::InvalidArgument);
}

TEST_CASE("the writer rejects bad tensors with InvalidArgument naming them", "[safetensors]") {
  SafetensorsWriter writer;
  writer.add("w", {2}, std::vector<float>{1, 2});
  CHECK_THROWS_WITH(writer.add("w", {2}, std::vector<float>{1, 2}),
                    Contains("duplicate") && Contains("'w'"));
  CHECK_THROWS_WITH(writer.add("x", {2, 2}, std::vector<float>{1, 2, 3}),
                    Contains("'x'") && Contains("4 elements") && Contains("holds 3"));
  CHECK_THROWS_WITH(writer.add("y", {-1}, std::vector<float>{}), Contains("negative"));
  CHECK_THROWS_WITH(writer.add("__metadata__", {1}, std::vector<float>{1}), Contains("reserved"));
  CHECK_THROWS_WITH(writer.add("bad\xff", {1}, std::vector<float>{1}), Contains("UTF-8"));
  CHECK_THROWS_WITH(
      writer.add("huge", {std::int64_t{1} << 40, std::int64_t{1} << 40}, std::vector<float>{}),
      Contains("overflows"));
  CHECK_THROWS_AS(writer.add_bytes("raw", DataType::kInt32, {2}, std::span<const std::byte>()),
                  coltrain::InvalidArgument);
  CHECK_THROWS_AS(writer.set_metadata("k", "\xc0"), coltrain::InvalidArgument);

  // Failed adds leave no trace: "x" can still be added.
  const std::vector<std::uint8_t> raw = {1, 0, 0, 0, 2, 0, 0, 0};
  writer.add_bytes("x", DataType::kInt32, {2}, std::as_bytes(std::span(raw)));
  TempDir dir;
  writer.write(dir / "ok.safetensors");
  const SafetensorsReader reader(dir / "ok.safetensors");
  CHECK(reader.read<std::int32_t>("x") == std::vector<std::int32_t>{1, 2});
  CHECK(reader.entries().size() == 2);
}

// --- Malformed files -----------------------------------------------------------------------------

namespace {

// A valid entry for `name` covering [begin, end) of F32 data.
std::string f32_entry(std::string_view name, std::uint64_t begin, std::uint64_t end) {
  return "\"" + std::string(name) + R"(":{"dtype":"F32","shape":[)" +
         std::to_string((end - begin) / 4) + R"(],"data_offsets":[)" + std::to_string(begin) + "," +
         std::to_string(end) + "]}";
}

}  // namespace

TEST_CASE("malformed: too short for the header length", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "short.safetensors";
  write_bytes(file, std::vector<unsigned char>{1, 0, 0});
  require_rejected(file, {"3 bytes", "too short"});
  write_bytes(file, std::vector<unsigned char>{});
  require_rejected(file, {"0 bytes", "too short"});
  CHECK(read_error(file).context().offset == 0u);
}

TEST_CASE("malformed: header length larger than the file", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "long.safetensors";
  write_raw(file, "{}", 0, 3);
  require_rejected(file, {"header length 3", "larger than the 2 bytes"});
  write_raw(file, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, 1000);
  require_rejected(file, {"header length 1000", "truncated"});
  write_raw(file, "", 0, 8);  // nothing after the length field
  require_rejected(file, {"header length 8", "0 bytes after it"});
}

TEST_CASE("malformed: header length over the 100 MB limit", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "huge.safetensors";
  write_raw(file, "{}", 0, std::uint64_t{100'000'001});
  require_rejected(file, {"header length 100000001", "exceeds the limit"});
  write_raw(file, "{}", 0, std::numeric_limits<std::uint64_t>::max());
  require_rejected(file, {"exceeds the limit"});
}

TEST_CASE("malformed: header that is not JSON or not an object", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "json.safetensors";
  write_raw(file, R"({"w":{"dtype":"F32",)", 0);
  require_rejected(file, {"not valid JSON"});
  write_raw(file, R"({"w": tru})", 0);
  require_rejected(file, {"not valid JSON"});
  CHECK(read_error(file).context().offset == 8u + 9u);  // the '}' after "tru"
  write_raw(file, "", 0);
  require_rejected(file, {"not valid JSON"});
  write_raw(file, "{\"w\xff\":1}", 0);  // not UTF-8
  require_rejected(file, {"not valid JSON"});
  write_raw(file, "[1, 2]", 0);
  require_rejected(file, {"not a JSON object"});
  write_raw(file, R"({"w": [1, 2]})", 0);
  require_rejected(file, {"'w'", "entry is not a JSON object"});
  write_raw(file, R"({"w": {"shape": [[[[1]]]]}})", 0);
  require_rejected(file, {"deeper than the format allows"});
}

TEST_CASE("malformed: missing, unknown and duplicate fields and names",
          "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "fields.safetensors";
  write_raw(file, R"({"w":{"dtype":"F32","shape":[1]}})", 4);
  require_rejected(file, {"'w'", "missing field 'data_offsets'"});
  write_raw(file, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"stride":[1]}})", 4);
  require_rejected(file, {"'w'", "unknown field 'stride'"});
  write_raw(file, "{" + f32_entry("w", 0, 4) + "," + f32_entry("w", 4, 8) + "}", 8);
  require_rejected(file, {"duplicate tensor name 'w'"});
  write_raw(file, R"({"w":{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'w'", "duplicate key 'dtype'"});
}

TEST_CASE("malformed: unknown and unsupported dtypes", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "dtype.safetensors";
  write_raw(file, R"({"mask":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'mask'", "dtype 'BOOL' is not supported", "F32, F64, F16, BF16"});
  write_raw(file, R"({"q":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'q'", "'I8' is not supported"});
  write_raw(file, R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16);
  require_rejected(file, {"'w'", "unknown dtype 'F128'"});
  write_raw(file, R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"unknown dtype 'f32'"});  // dtype names are case-sensitive
  write_raw(file, R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'w'", "dtype is not a string"});
}

TEST_CASE("malformed: negative, fractional and oversized shapes", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "shape.safetensors";
  write_raw(file, R"({"w":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'w'", "dimension 1 (-3)", "not a non-negative"});
  write_raw(file, R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'w'", "dimension 0", "not a non-negative"});
  write_raw(file, R"({"w":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'w'", "not a non-negative"});
  write_raw(file, R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'w'", "shape is not an array"});
  write_raw(file, R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'w'", "not a non-negative 64-bit integer"});
  // 2^32 x 2^32 elements overflow 64 bits; 2^62 F32 elements are 2^64 bytes.
  write_raw(file, R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
            4);
  require_rejected(file, {"'w'", "overflows 64 bits"});
  write_raw(file, R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'w'", "overflows 64 bits"});
}

TEST_CASE("malformed: data_offsets that are not a pair of byte offsets",
          "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "offsets.safetensors";
  write_raw(file, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4);
  require_rejected(file, {"'w'", "not a pair"});
  write_raw(file, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4);
  require_rejected(file, {"'w'", "not a pair"});
  write_raw(file, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4);
  require_rejected(file, {"'w'", "[4, 0]", "out of order"});
}

TEST_CASE("malformed: offsets past the end of the file (truncated data)",
          "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "truncated.safetensors";
  const std::string header = "{" + f32_entry("a", 0, 8) + "," + f32_entry("b", 8, 24) + "}";
  write_raw(file, header, 20);  // 4 bytes of "b" missing
  require_rejected(file, {"'b'", "[8, 24]", "past the end", "20 bytes", "truncated"});
  CHECK(read_error(file).context().offset == 8 + header.size() + 8);
}

TEST_CASE("malformed: a gap between tensors", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "gap.safetensors";
  const std::string header = "{" + f32_entry("a", 0, 8) + "," + f32_entry("b", 12, 16) + "}";
  write_raw(file, header, 16);
  require_rejected(file, {"'b'", "gap of 4 bytes", "[12, 16]"});
  CHECK(read_error(file).context().offset == 8 + header.size() + 8);
  // A gap before the first tensor, too.
  write_raw(file, "{" + f32_entry("a", 4, 8) + "}", 8);
  require_rejected(file, {"'a'", "gap of 4 bytes"});
}

TEST_CASE("malformed: overlapping tensors", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "overlap.safetensors";
  const std::string header = "{" + f32_entry("a", 0, 8) + "," + f32_entry("b", 4, 12) + "}";
  write_raw(file, header, 12);
  require_rejected(file, {"'b'", "[4, 12]", "overlap tensor 'a' [0, 8]"});
  // Two tensors on the same bytes.
  write_raw(file, "{" + f32_entry("a", 0, 8) + "," + f32_entry("b", 0, 8) + "}", 8);
  require_rejected(file, {"overlap"});
}

TEST_CASE("malformed: bytes after the last tensor", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "trailing.safetensors";
  const std::string header = "{" + f32_entry("a", 0, 8) + "}";
  write_raw(file, header, 11);
  require_rejected(file, {"3 trailing bytes"});
  CHECK(read_error(file).context().offset == 8 + header.size() + 8);
  write_raw(file, "{}", 1);
  require_rejected(file, {"1 trailing bytes"});
}

TEST_CASE("malformed: byte range and shape disagree", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "size.safetensors";
  write_raw(file, R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12]}})", 12);
  require_rejected(file, {"'w'", "size mismatch", "12 bytes", "[2, 3]", "needs 24"});
  write_raw(file, R"({"w":{"dtype":"BF16","shape":[],"data_offsets":[0,4]}})", 4);
  require_rejected(file, {"'w'", "size mismatch", "needs 2"});
}

TEST_CASE("malformed: __metadata__ that is not a map of strings", "[safetensors][malformed]") {
  TempDir dir;
  const fs::path file = dir / "meta.safetensors";
  write_raw(file, R"({"__metadata__":{"step":3}})", 0);
  require_rejected(file, {"__metadata__ value of 'step' is not a string"});
  write_raw(file, R"({"__metadata__":["a"]})", 0);
  require_rejected(file, {"__metadata__ is not a JSON object"});
  write_raw(file, R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}})", 0);
  require_rejected(file, {"duplicate"});
}

TEST_CASE("unreadable paths are IoError naming the file", "[safetensors][malformed]") {
  TempDir dir;
  require_rejected(dir / "absent.safetensors", {"cannot open", "No such file"});
  require_rejected(dir.path(), {"not a regular file"});
}

// --- Atomic writes -------------------------------------------------------------------------------

TEST_CASE("writing into a directory that does not exist is IoError naming the file",
          "[safetensors][write]") {
  TempDir dir;
  const fs::path file = dir / "missing" / "out.safetensors";
  SafetensorsWriter writer;
  writer.add("w", {1}, std::vector<float>{1.0f});
  try {
    writer.write(file);
    FAIL("write succeeded");
  } catch (const coltrain::IoError& e) {
    CHECK_THAT(e.what(), Contains(file.string()) && Contains("No such file"));
    CHECK(e.context().operation == "write safetensors");
  }
  CHECK_FALSE(fs::exists(dir / "missing"));
}

TEST_CASE("writing replaces an existing file and leaves no temporary file",
          "[safetensors][write]") {
  TempDir dir;
  const fs::path file = dir / "ckpt.safetensors";
  SafetensorsWriter first;
  first.add("w", {1}, std::vector<float>{1.0f});
  first.write(file);
  SafetensorsWriter second;
  second.add("v", {2}, std::vector<std::int64_t>{5, 6});
  second.write(file);
  const SafetensorsReader reader(file);
  CHECK_FALSE(reader.contains("w"));
  CHECK(reader.read<std::int64_t>("v") == std::vector<std::int64_t>{5, 6});
  CHECK(dir.names() == std::vector<std::string>{"ckpt.safetensors"});
}

TEST_CASE("a path without a directory part is written in the working directory",
          "[safetensors][write]") {
  TempDir dir;
  const fs::path previous = fs::current_path();
  fs::current_path(dir.path());
  SafetensorsWriter writer;
  writer.add("w", {1}, std::vector<float>{3.0f});
  writer.write("relative.safetensors");
  fs::current_path(previous);
  CHECK(SafetensorsReader(dir / "relative.safetensors").read<float>("w") ==
        std::vector<float>{3.0f});
}

TEST_CASE("a failed write leaves the existing file intact and removes the temporary file",
          "[safetensors][write]") {
  TempDir dir;
  const fs::path file = dir / "ckpt.safetensors";
  SafetensorsWriter old_writer;
  old_writer.add("w", {3}, std::vector<float>{1.0f, 2.0f, 3.0f});
  old_writer.set_metadata("version", "old");
  old_writer.write(file);
  const std::vector<std::byte> old_bytes = file_bytes(file);

  SafetensorsWriter big;
  big.add("big", {1 << 18}, std::vector<float>(1 << 18, 0.5f));  // 1 MB
  big.set_metadata("version", "new");
  {
    const coltrain::testing::FileSizeLimit limit(64 * 1024);
    try {
      big.write(file);
      FAIL("write succeeded past the file size limit");
    } catch (const coltrain::IoError& e) {
      CHECK_THAT(e.what(), Contains(file.string()) && Contains("cannot write"));
    }
  }
  CHECK(file_bytes(file) == old_bytes);
  CHECK(dir.names() == std::vector<std::string>{"ckpt.safetensors"});
  const SafetensorsReader reader(file);
  CHECK(reader.metadata().at("version") == "old");
  CHECK(reader.read<float>("w") == std::vector<float>{1.0f, 2.0f, 3.0f});
}

TEST_CASE("a failed rename leaves the target alone and removes the temporary file",
          "[safetensors][write]") {
  TempDir dir;
  const fs::path target = dir / "taken";
  fs::create_directories(target / "inside");  // a non-empty directory cannot be renamed over
  SafetensorsWriter writer;
  writer.add("w", {1}, std::vector<float>{1.0f});
  CHECK_THROWS_WITH(writer.write(target), Contains(target.string()) && Contains("rename"));
  CHECK(fs::is_directory(target / "inside"));
  CHECK(dir.names() == std::vector<std::string>{"taken"});
}

TEST_CASE("a long file name still gets a temporary file within the name limit",
          "[safetensors][write]") {
  TempDir dir;
  const fs::path file = dir / (std::string(240, 'n') + ".safetensors");
  SafetensorsWriter writer;
  writer.add("w", {1}, std::vector<float>{1.0f});
  writer.write(file);
  CHECK(SafetensorsReader(file).read<float>("w") == std::vector<float>{1.0f});
}

// --- Parity helpers (tests/support/parity.hpp)
// ----------------------------------------------------

TEST_CASE("parity_reference reads from COLTRAIN_PARITY_DIR and explains when it is unset",
          "[safetensors][parity]") {
  TempDir dir;
  SafetensorsWriter writer;
  writer.add("y", {2}, std::vector<float>{1.0f, 2.0f});
  writer.write(dir / "ref.safetensors");

  const char* saved = std::getenv("COLTRAIN_PARITY_DIR");
  const std::optional<std::string> previous =
      saved ? std::optional<std::string>(saved) : std::nullopt;
  ::setenv("COLTRAIN_PARITY_DIR", dir.path().c_str(), 1);
  const SafetensorsReader reference = coltrain::testing::parity_reference("ref.safetensors");
  CHECK(reference.read<float>("y") == std::vector<float>{1.0f, 2.0f});
  ::unsetenv("COLTRAIN_PARITY_DIR");
  CHECK_THROWS_AS(coltrain::testing::parity_reference("ref.safetensors"), coltrain::ConfigError);
  CHECK_THROWS_WITH(coltrain::testing::parity_reference("ref.safetensors"),
                    Contains("COLTRAIN_PARITY_DIR") && Contains("ref.safetensors"));
  if (previous) ::setenv("COLTRAIN_PARITY_DIR", previous->c_str(), 1);
}

TEST_CASE("require_close accepts values within tolerance", "[safetensors][parity]") {
  // Near zero the floor (1e-3) sets the scale: |a - e| up to 1e-8 passes there.
  const std::vector<float> expected = {1.0f,
                                       -100.0f,
                                       0.0f,
                                       1e-9f,
                                       std::numeric_limits<float>::quiet_NaN(),
                                       std::numeric_limits<float>::infinity()};
  const std::vector<float> actual = {1.0f + 1e-6f,
                                     -100.0001f,
                                     1e-9f,
                                     0.0f,
                                     std::numeric_limits<float>::quiet_NaN(),
                                     std::numeric_limits<float>::infinity()};
  coltrain::testing::require_close(actual, expected, 1e-5, 1e-3, "floats");
  coltrain::testing::require_close(std::span<const float>(actual), std::span<const float>(expected),
                                   1e-5, 1e-3, "float spans");
  const std::vector<half> h = {half(1.0f), half(2.0f)};
  const std::vector<half> h2 = {half(1.0f), half(2.001f)};
  coltrain::testing::require_close(h2, h, 1e-3, 1e-3, "halves");
  CHECK(coltrain::testing::detail::parity_relative_error(1.1, 1.0, 1e-3) == Approx(0.1));
  CHECK(coltrain::testing::detail::parity_relative_error(1e-4, 0.0, 1e-2) == Approx(1e-2));
  CHECK(coltrain::testing::detail::parity_relative_error(1.0, std::nan(""), 1.0) ==
        std::numeric_limits<double>::infinity());
  CHECK(coltrain::testing::detail::parity_relative_error(1.0, 0.0, 0.0) ==
        std::numeric_limits<double>::infinity());
}
