// IDX images and labels files (MNIST's format), raw or gzip-compressed: data/idx.hpp through
// data/file_io.hpp's read_file and gunzip. The same input is read as both kinds; each refuses the
// other's magic number in its first four bytes.

#include <coltrain/core/error.hpp>
#include <coltrain/data/idx.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using coltrain::fuzz::fuzz_check;
  const auto file = coltrain::fuzz::write_input("input.idx", data, size);
  try {
    const coltrain::data::IdxImages images = coltrain::data::read_idx_images(file);
    fuzz_check(images.count >= 0 && images.rows > 0 && images.cols > 0,
               "IDX images: count, rows and columns in range");
    fuzz_check(
        images.pixels.size() == static_cast<std::size_t>(images.count * images.rows * images.cols),
        "IDX images: count x rows x columns pixels");
  } catch (const coltrain::IoError&) {
  }
  try {
    constexpr int kClasses = 10;
    const std::vector<std::uint8_t> labels = coltrain::data::read_idx_labels(file, kClasses);
    for (const std::uint8_t label : labels) fuzz_check(label < kClasses, "IDX labels: below 10");
  } catch (const coltrain::IoError&) {
  }
  return 0;
}
