#pragma once
// What the fuzz targets share. Parsers that read a path get the input through a file in a scratch
// folder of this process, rewritten for every input and removed at exit. The coltrain::Error that a
// parser's documentation promises for bad input (IoError for a file) is the parser refusing it, as
// it should, and each target catches that one; anything else that escapes (another coltrain
// error, such as a JsonError the parser did not wrap, std::bad_alloc, std::out_of_range) reaches
// libFuzzer as a crash, and so does a broken promise about what a parser accepted (fuzz_check).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "temp_dir.hpp"

namespace coltrain::fuzz {

inline const std::filesystem::path& scratch_dir() {
  static const coltrain::testing::TempDir dir("coltrain_fuzz");
  return dir.path();
}

// Writes the input to `name` in the scratch folder and returns its path.
inline std::filesystem::path write_input(std::string_view name, const std::uint8_t* data,
                                         std::size_t size) {
  std::filesystem::path file = scratch_dir() / name;
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", file.c_str());
    std::abort();
  }
  return file;
}

// A property of what a parser accepted; a false one aborts, so libFuzzer keeps the input.
inline void fuzz_check(bool holds, const char* what) {
  if (!holds) {
    std::fprintf(stderr, "fuzz: accepted input breaks: %s\n", what);
    std::abort();
  }
}

}  // namespace coltrain::fuzz
