// The CIFAR-10 binary reader (coltrain/data/cifar10.hpp) on batch files generated here.

#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/cifar10.hpp>
#include <coltrain/data/file_io.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"
#include "data_test_helpers.hpp"

namespace {

namespace data = coltrain::data;
using coltrain::testing::Bytes;
using coltrain::testing::concat;
using coltrain::testing::pattern;
using coltrain::testing::require_error;
using coltrain::testing::TempDir;
using coltrain::testing::write_bytes;

constexpr std::size_t kRecord = 3073;
constexpr std::size_t kPixels = 3072;

// Record `r` of a file: label (first + r) % 10, then pixels that identify the record.
Bytes records(std::size_t count, std::uint32_t first) {
  Bytes bytes;
  for (std::size_t r = 0; r < count; ++r) {
    bytes.push_back(static_cast<std::uint8_t>((first + r) % 10));
    const Bytes image = pattern(kPixels, first + static_cast<std::uint32_t>(r));
    bytes.insert(bytes.end(), image.begin(), image.end());
  }
  return bytes;
}

TEST_CASE("CIFAR-10 records become CHW images and labels, file after file", "[cifar10]") {
  TempDir dir("coltrain_cifar");
  write_bytes(dir / "a.bin", records(2, 0));
  data::write_file_atomically(dir / "b.bin", records(3, 2), data::Compression::kGzip);
  const std::vector<std::filesystem::path> files = {dir / "a.bin", dir / "b.bin"};

  const data::ImageDataset set = data::read_cifar10(files);
  REQUIRE(set.size() == 5);
  CHECK(set.image_shape() == data::ImageShape{3, 32, 32});
  for (std::int64_t i = 0; i < 5; ++i) {
    CHECK(set.label(i) == i % 10);
    const Bytes expected = pattern(kPixels, static_cast<std::uint32_t>(i));
    CHECK(Bytes(set.image(i).begin(), set.image(i).end()) == expected);
  }
  // Channel planes in the record's order: red (c = 0) first, then green and blue, each row-major.
  const Bytes first = pattern(kPixels, 0);
  CHECK(set.image(0)[1 * 1024 + 5 * 32 + 7] == first[1024 + 5 * 32 + 7]);
}

TEST_CASE("load_cifar10 reads the standard file names, from the folder or its parent",
          "[cifar10]") {
  TempDir dir("coltrain_cifar");
  const auto batches = dir / "cifar-10-batches-bin";
  std::filesystem::create_directories(batches);
  for (int b = 1; b <= 5; ++b) {
    write_bytes(batches / ("data_batch_" + std::to_string(b) + ".bin"),
                records(1, static_cast<std::uint32_t>(b)));
  }
  write_bytes(batches / "test_batch.bin", records(2, 7));

  const data::ImageDataset train = data::load_cifar10(dir.path(), data::Split::kTrain);
  CHECK(train.size() == 5);
  CHECK(std::vector<std::int32_t>(train.labels().begin(), train.labels().end()) ==
        std::vector<std::int32_t>{1, 2, 3, 4, 5});
  const data::ImageDataset test = data::load_cifar10(batches, data::Split::kTest);
  CHECK(test.size() == 2);
  CHECK(test.label(1) == 8);

  std::filesystem::remove(batches / "data_batch_4.bin");
  require_error([&] { data::load_cifar10(batches, data::Split::kTrain); },
                batches / "data_batch_4.bin", std::nullopt,
                "no CIFAR-10 train file data_batch_4.bin in");
}

TEST_CASE("malformed CIFAR-10 files name the file, the offset and what was expected", "[cifar10]") {
  TempDir dir("coltrain_cifar");
  const auto file = dir / "data_batch_1.bin";
  auto check = [&](const Bytes& bytes, std::uint64_t offset, const std::string& text) {
    write_bytes(file, bytes);
    const std::vector<std::filesystem::path> files = {file};
    require_error([&] { data::read_cifar10(files); }, file, offset, text);
  };
  check({}, 0, "expected 3073-byte records, the file is empty");
  check(concat(records(2, 0), Bytes(5)), 2 * kRecord,
        "the file is 6151 bytes, 2 records and 5 bytes of an incomplete one (truncated file?)");
  const Bytes one = records(1, 0);
  check(Bytes(one.begin(), one.end() - 1), 0, "0 records and 3072 bytes of an incomplete one");
  Bytes bad_label = records(3, 0);
  bad_label[kRecord] = 10;
  check(bad_label, kRecord, "label 10 of record 1 is not below 10");
}

}  // namespace
