#pragma once
// Shared by the data tests: raw file writing, IDX headers built by hand, and a check that an error
// names the file, the offset and what was wrong.

#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/dataset.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace coltrain::testing {

using Bytes = std::vector<std::uint8_t>;

inline void write_bytes(const std::filesystem::path& file, const Bytes& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline Bytes read_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// Big-endian u32 fields, as an IDX header.
inline Bytes be32(std::initializer_list<std::uint32_t> values) {
  Bytes bytes;
  for (const std::uint32_t v : values) {
    for (int shift = 24; shift >= 0; shift -= 8)
      bytes.push_back(static_cast<std::uint8_t>(v >> shift));
  }
  return bytes;
}

inline Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// n bytes of a pattern that differs between neighbours and between images.
inline Bytes pattern(std::size_t n, std::uint32_t salt = 0) {
  Bytes bytes(n);
  for (std::size_t i = 0; i < n; ++i)
    bytes[i] = static_cast<std::uint8_t>((i * 37 + salt * 101 + i / 7) & 0xff);
  return bytes;
}

// Runs `call`, which must throw E whose context names `file` and `offset` (nullopt: no offset) and
// whose what() contains `text`, the file's name and, when given, "offset <offset>".
template <class E = IoError>
void require_error(const std::function<void()>& call, const std::filesystem::path& file,
                   std::optional<std::uint64_t> offset, const std::string& text) {
  try {
    call();
  } catch (const E& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(e.context().file == file.string());
    CHECK(e.context().offset == offset);
    CHECK_THAT(what, Catch::Matchers::Contains(text));
    CHECK_THAT(what, Catch::Matchers::Contains(file.filename().string()));
    if (offset) CHECK_THAT(what, Catch::Matchers::Contains("offset " + std::to_string(*offset)));
    return;
  }
  FAIL("no exception for " << file << " (expected: " << text << ")");
}

// A small dataset whose pixels and labels are functions of the sample index.
inline data::ImageDataset synthetic_dataset(std::int64_t n, data::ImageShape shape) {
  Bytes pixels;
  std::vector<std::int32_t> labels;
  for (std::int64_t i = 0; i < n; ++i) {
    const Bytes image =
        pattern(static_cast<std::size_t>(shape.size()), static_cast<std::uint32_t>(i));
    pixels.insert(pixels.end(), image.begin(), image.end());
    labels.push_back(static_cast<std::int32_t>((i * 3) % 10));
  }
  return data::ImageDataset(shape, std::move(pixels), std::move(labels));
}

}  // namespace coltrain::testing
