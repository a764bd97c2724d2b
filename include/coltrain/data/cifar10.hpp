#pragma once
// CIFAR-10, binary version (cifar-10-batches-bin): files of 3,073-byte records, each a label byte
// (0-9) then the 32 x 32 image as 1,024 red, 1,024 green and 1,024 blue bytes, row-major: channels
// first, as the dataset keeps them. The official files hold 10,000 records each; data_batch_1.bin
// to data_batch_5.bin are the training split, test_batch.bin the test split.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/dataset.hpp>
#include <coltrain/data/file_io.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace coltrain::data {

inline constexpr ImageShape kCifar10ImageShape{3, 32, 32};
inline constexpr int kCifar10Classes = 10;
inline constexpr std::size_t kCifar10RecordBytes = 1 + 3 * 32 * 32;
inline constexpr std::array<const char*, 10> kCifar10ClassNames = {
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};

// Reads CIFAR-10 binary batch files (raw or gzip) into one dataset, in the order given. Each file
// must be a non-empty whole number of records with labels below 10.
inline ImageDataset read_cifar10(std::span<const std::filesystem::path> files) {
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;
  for (const std::filesystem::path& file : files) {
    const FileContents contents = read_file(file);
    const std::vector<std::uint8_t>& bytes = contents.bytes;
    auto fail = [&](const std::string& message, std::uint64_t offset) {
      throw IoError(contents.gzip ? message + " (offsets count decompressed bytes)" : message,
                    detail::file_context(file, "read CIFAR-10", offset));
    };
    if (bytes.empty()) fail("expected 3073-byte records, the file is empty", 0);
    if (const std::size_t partial = bytes.size() % kCifar10RecordBytes; partial != 0) {
      const std::size_t last = bytes.size() - partial;
      fail("expected " + std::to_string(kCifar10RecordBytes) + "-byte records: the file is " +
               std::to_string(bytes.size()) + " bytes, " +
               std::to_string(bytes.size() / kCifar10RecordBytes) + " records and " +
               std::to_string(partial) + " bytes of an incomplete one (truncated file?)",
           last);
    }
    const std::size_t records = bytes.size() / kCifar10RecordBytes;
    pixels.reserve(pixels.size() + records * (kCifar10RecordBytes - 1));
    labels.reserve(labels.size() + records);
    for (std::size_t r = 0; r < records; ++r) {
      const std::uint8_t* record = bytes.data() + r * kCifar10RecordBytes;
      if (record[0] >= kCifar10Classes) {
        fail("label " + std::to_string(record[0]) + " of record " + std::to_string(r) +
                 " is not below " + std::to_string(kCifar10Classes),
             r * kCifar10RecordBytes);
      }
      labels.push_back(record[0]);
      pixels.insert(pixels.end(), record + 1, record + kCifar10RecordBytes);
    }
  }
  return ImageDataset(kCifar10ImageShape, std::move(pixels), std::move(labels), kCifar10Classes);
}

// The standard file names of a split, in order.
inline std::vector<std::string> cifar10_file_names(Split split) {
  if (split == Split::kTest) return {"test_batch.bin"};
  return {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
          "data_batch_5.bin"};
}

// Loads one split from `dir`: the cifar-10-batches-bin folder itself or the folder holding it.
inline ImageDataset load_cifar10(const std::filesystem::path& dir, Split split) {
  std::error_code ignored;
  const std::filesystem::path nested = dir / "cifar-10-batches-bin";
  const std::filesystem::path base = std::filesystem::is_directory(nested, ignored) ? nested : dir;
  std::vector<std::filesystem::path> files;
  for (const std::string& name : cifar10_file_names(split)) {
    files.push_back(base / name);
    if (!std::filesystem::is_regular_file(files.back(), ignored)) {
      throw IoError("no CIFAR-10 " + std::string(name_of(split)) + " file " + name + " in " +
                        base.string() + " (scripts/download-data fetches it)",
                    detail::file_context(files.back(), "load CIFAR-10"));
    }
  }
  return read_cifar10(files);
}

}  // namespace coltrain::data
