// CIFAR-10 binary batches (data/cifar10.hpp), raw or gzip-compressed (data/file_io.hpp).

#include <coltrain/core/error.hpp>
#include <coltrain/data/cifar10.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using coltrain::fuzz::fuzz_check;
  const std::filesystem::path file = coltrain::fuzz::write_input("data_batch_1.bin", data, size);
  try {
    const coltrain::data::ImageDataset dataset = coltrain::data::read_cifar10({&file, 1});
    fuzz_check(dataset.size() > 0, "CIFAR-10: at least one record");
  } catch (const coltrain::IoError&) {
  }
  return 0;
}
