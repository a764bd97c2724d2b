// IDX files (coltrain/data/idx.hpp), whole-file I/O with gzip (file_io.hpp) and MNIST loading
// (mnist.hpp) on files generated here.

#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/file_io.hpp>
#include <coltrain/data/idx.hpp>
#include <coltrain/data/mnist.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"
#include "data_test_helpers.hpp"

namespace {

namespace data = coltrain::data;
using coltrain::ConfigError;
using coltrain::InvalidArgument;
using coltrain::IoError;
using coltrain::testing::be32;
using coltrain::testing::Bytes;
using coltrain::testing::concat;
using coltrain::testing::pattern;
using coltrain::testing::read_bytes;
using coltrain::testing::require_error;
using coltrain::testing::TempDir;
using coltrain::testing::write_bytes;
using data::Compression;
using data::Split;

constexpr std::size_t kImage = 28 * 28;

// A complete MNIST directory of `n` images; labels i % 10.
void write_mnist(const std::filesystem::path& dir, Split split, std::size_t n,
                 Compression compression) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string suffix = compression == Compression::kGzip ? ".gz" : "";
  Bytes labels;
  for (std::size_t i = 0; i < n; ++i) labels.push_back(static_cast<std::uint8_t>(i % 10));
  data::write_idx_images(dir / (prefix + "-images-idx3-ubyte" + suffix), 28, 28,
                         pattern(n * kImage), compression);
  data::write_idx_labels(dir / (prefix + "-labels-idx1-ubyte" + suffix), labels, compression);
}

TEST_CASE("IDX images and labels round-trip, raw and gzip", "[idx]") {
  TempDir dir("coltrain_idx");
  const Compression compression = GENERATE(Compression::kNone, Compression::kGzip);
  const Bytes pixels = pattern(3 * 5 * 7);
  const Bytes labels = {0, 9, 4};
  data::write_idx_images(dir / "images", 5, 7, pixels, compression);
  data::write_idx_labels(dir / "labels", labels, compression);

  const Bytes file = read_bytes(dir / "images");
  if (compression == Compression::kGzip) {
    REQUIRE(file.size() >= 2);
    CHECK((file[0] == 0x1f && file[1] == 0x8b));
  } else {
    CHECK(file == concat(be32({0x803, 3, 5, 7}), pixels));
    CHECK(read_bytes(dir / "labels") == concat(be32({0x801, 3}), labels));
  }
  const data::IdxImages images = data::read_idx_images(dir / "images");
  CHECK(images.count == 3);
  CHECK(images.rows == 5);
  CHECK(images.cols == 7);
  CHECK(images.pixels == pixels);
  CHECK(data::read_idx_labels(dir / "labels") == labels);
  // Only the file itself: the temporary files are gone.
  CHECK(dir.names().size() == 2);
}

TEST_CASE("gzip is recognised by its magic bytes, not by the file name", "[idx]") {
  TempDir dir("coltrain_idx");
  data::write_idx_labels(dir / "gzipped.raw", Bytes{1, 2, 3}, Compression::kGzip);
  data::write_idx_labels(dir / "plain.gz", Bytes{4, 5}, Compression::kNone);
  CHECK(data::read_idx_labels(dir / "gzipped.raw") == Bytes{1, 2, 3});
  CHECK(data::read_idx_labels(dir / "plain.gz") == Bytes{4, 5});
  CHECK(data::read_file(dir / "gzipped.raw").gzip);
  CHECK_FALSE(data::read_file(dir / "plain.gz").gzip);
}

TEST_CASE("gzip reading: concatenated members, corrupt and truncated data", "[idx][gzip]") {
  TempDir dir("coltrain_idx");
  data::write_file_atomically(dir / "a", Bytes{1, 2, 3}, Compression::kGzip);
  data::write_file_atomically(dir / "b", Bytes{4, 5}, Compression::kGzip);
  const Bytes a = read_bytes(dir / "a");
  const Bytes b = read_bytes(dir / "b");

  write_bytes(dir / "two", concat(a, b));
  CHECK(data::read_file(dir / "two").bytes == Bytes{1, 2, 3, 4, 5});

  write_bytes(dir / "garbage", concat(a, Bytes{0, 0, 0}));
  require_error([&] { data::read_file(dir / "garbage"); }, dir / "garbage", a.size(),
                "3 bytes after the end of the gzip data");

  Bytes truncated(a.begin(), a.end() - 6);
  write_bytes(dir / "truncated", truncated);
  require_error([&] { data::read_file(dir / "truncated"); }, dir / "truncated", truncated.size(),
                "ends before its end-of-stream marker");

  Bytes corrupt = a;
  corrupt[3] = 0xff;  // reserved header flag bits
  write_bytes(dir / "corrupt", corrupt);
  // zlib reads the 4 bytes up to and including the flags before it objects.
  require_error([&] { data::read_file(dir / "corrupt"); }, dir / "corrupt", 4,
                "corrupt gzip data: unknown header flags set");

  // Large enough to need several output buffers.
  const Bytes big = pattern(300'000);
  data::write_file_atomically(dir / "big", big, Compression::kGzip);
  CHECK(data::read_file(dir / "big").bytes == big);
}

TEST_CASE("atomic writes replace the file and leave nothing behind on failure", "[idx]") {
  TempDir dir("coltrain_idx");
  data::write_file_atomically(dir / "f", Bytes{1, 2, 3});
  data::write_file_atomically(dir / "f", Bytes{4});
  CHECK(read_bytes(dir / "f") == Bytes{4});
  CHECK(dir.names() == std::vector<std::string>{"f"});
  try {
    data::write_file_atomically(dir / "missing" / "f", Bytes{1});
    FAIL("no exception");
  } catch (const IoError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("cannot create temporary file"));
    CHECK(e.context().file == (dir / "missing" / "f").string());
  }
  CHECK(dir.names() == std::vector<std::string>{"f"});
}

TEST_CASE("malformed IDX images files name the file, the offset and what was expected", "[idx]") {
  TempDir dir("coltrain_idx");
  const auto file = dir / "train-images-idx3-ubyte";
  auto check = [&](const Bytes& bytes, std::uint64_t offset, const std::string& text) {
    write_bytes(file, bytes);
    require_error([&] { data::read_idx_images(file); }, file, offset, text);
  };
  const Bytes pixels = pattern(3 * kImage);

  check({}, 0, "expected an IDX images header of 16 bytes, the file ends after 0 bytes");
  check({0, 0, 8}, 0, "the file ends after 3 bytes");
  check(concat(be32({0x801, 3}), Bytes(3)), 0,
        "expected the IDX images magic number 0x00000803, found 0x00000801 (an IDX labels file)");
  check(be32({0x12345678, 3, 28, 28}), 0, "found 0x12345678");
  check(concat(be32({0x803, 3}), Bytes{0, 0}), 10,
        "expected an IDX images header of 16 bytes, the file ends after 10 bytes");
  check(be32({0x803, 3, 0, 28}), 8, "expected a positive number of rows, found 0");
  check(be32({0x803, 3, 28, 0}), 12, "expected a positive number of columns, found 0");
  check(be32({0x803, 0xffffffff, 0xffffffff, 0xffffffff}), 4, "overflows 64 bits");
  check(concat(be32({0x803, 3, 28, 28}), Bytes(pixels.begin(), pixels.begin() + 1000)), 16,
        "expected 2352 bytes of pixels (3 images of 28 x 28), the file ends after 1000");
  check(concat(be32({0x803, 3, 28, 28}), concat(pixels, Bytes{7})), 16 + 2352,
        "expected the file to end after 2352 bytes of pixels (3 images of 28 x 28), found 1 byte "
        "more");

  // The same fault in a gzip file: offsets count decompressed bytes, and the message says so.
  data::write_file_atomically(file, concat(be32({0x803, 3, 28, 28}), Bytes(5)), Compression::kGzip);
  require_error([&] { data::read_idx_images(file); }, file, 16,
                "the file ends after 5 (truncated file?) (offsets count decompressed bytes)");
}

TEST_CASE("malformed IDX labels files name the file, the offset and what was expected", "[idx]") {
  TempDir dir("coltrain_idx");
  const auto file = dir / "train-labels-idx1-ubyte";
  auto check = [&](const Bytes& bytes, std::uint64_t offset, const std::string& text) {
    write_bytes(file, bytes);
    require_error([&] { data::read_idx_labels(file); }, file, offset, text);
  };
  check({}, 0, "expected an IDX labels header of 8 bytes, the file ends after 0 bytes");
  check(be32({0x803, 1, 28, 28}), 0,
        "expected the IDX labels magic number 0x00000801, found 0x00000803 (an IDX images file)");
  check(concat(be32({0x801}), Bytes{0, 0}), 6, "the file ends after 6 bytes");
  check(concat(be32({0x801, 4}), Bytes{1, 2}), 8,
        "expected 4 bytes of labels (4 items), the file ends after 2");
  check(concat(be32({0x801, 2}), Bytes{1, 2, 3}), 10,
        "expected the file to end after 2 bytes of labels (2 items), found 1 byte more");
  check(concat(be32({0x801, 4}), Bytes{1, 9, 10, 2}), 10,
        "label 10 of item 2 is not below the number of classes, 10");
  write_bytes(file, concat(be32({0x801, 2}), Bytes{25, 3}));
  CHECK(data::read_idx_labels(file, 26) == Bytes{25, 3});
}

TEST_CASE("IDX writers reject shapes the format cannot hold", "[idx]") {
  TempDir dir("coltrain_idx");
  CHECK_THROWS_AS(data::write_idx_images(dir / "f", 0, 28, Bytes{}), InvalidArgument);
  CHECK_THROWS_AS(data::write_idx_images(dir / "f", 28, 28, Bytes(785)), InvalidArgument);
  CHECK_THROWS_AS(data::write_idx_images(dir / "f", std::int64_t{1} << 32, 1, Bytes{}),
                  InvalidArgument);
  CHECK(dir.names().empty());
}

TEST_CASE("load_mnist finds raw and gzipped files and checks them against each other", "[mnist]") {
  TempDir dir("coltrain_mnist");
  write_mnist(dir.path(), Split::kTrain, 12, Compression::kGzip);
  write_mnist(dir.path(), Split::kTest, 5, Compression::kNone);

  const data::ImageDataset train = data::load_mnist(dir.path(), Split::kTrain);
  CHECK(train.size() == 12);
  CHECK(train.image_shape() == data::ImageShape{1, 28, 28});
  CHECK(train.shape() == coltrain::tensor::Shape{12, 1, 28, 28});
  CHECK(std::vector<std::uint8_t>(train.pixels().begin(), train.pixels().end()) ==
        pattern(12 * kImage));
  CHECK(train.label(11) == 1);
  const data::ImageDataset test = data::load_mnist(dir.path(), Split::kTest);
  CHECK(test.size() == 5);
  CHECK(test.label(4) == 4);

  SECTION("image and label counts must agree") {
    data::write_idx_labels(dir / "t10k-labels-idx1-ubyte", Bytes{1, 2, 3});
    require_error([&] { data::load_mnist(dir.path(), Split::kTest); },
                  dir / "t10k-labels-idx1-ubyte", 4,
                  "5 images in " + (dir / "t10k-images-idx3-ubyte").string() + " but 3 labels");
  }
  SECTION("images must be 28 x 28") {
    data::write_idx_images(dir / "t10k-images-idx3-ubyte", 27, 28, Bytes(5 * 27 * 28));
    require_error([&] { data::load_mnist(dir.path(), Split::kTest); },
                  dir / "t10k-images-idx3-ubyte", 8,
                  "expected MNIST's 28 x 28 images, found 27 x 28");
  }
  SECTION("a missing file names the directory and the names tried") {
    std::filesystem::remove(dir / "t10k-labels-idx1-ubyte");
    require_error([&] { data::load_mnist(dir.path(), Split::kTest); }, dir.path(), std::nullopt,
                  "no MNIST test file t10k-labels-idx1-ubyte or t10k-labels-idx1-ubyte.gz in");
  }
}

TEST_CASE("default_mnist_dir looks in a fixed order and says where it looked", "[mnist]") {
  const auto candidates =
      data::detail::mnist_dir_candidates("/env", "/compiled", "/work/run", "/opt/app/bin/train");
  const std::vector<std::filesystem::path> expected = {
      "/env/mnist",          "/compiled/mnist", "/work/run/data/mnist", "/opt/app/bin/data/mnist",
      "/opt/app/data/mnist", "/opt/data/mnist", "/data/mnist"};
  CHECK(candidates == expected);
  CHECK(data::detail::mnist_dir_candidates(nullptr, "", "/w", "").size() == 1);

  TempDir dir("coltrain_mnist");
  write_mnist(dir / "", Split::kTrain, 1, Compression::kNone);
  CHECK(data::detail::find_mnist_dir({dir / "nowhere", dir.path()}) == dir.path());
  try {
    data::detail::find_mnist_dir({dir / "nowhere", dir / "elsewhere"});
    FAIL("no exception");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("no MNIST data found"));
    CHECK_THAT(e.what(), Catch::Matchers::Contains("--data"));
    CHECK_THAT(e.what(), Catch::Matchers::Contains((dir / "nowhere").string()));
    CHECK_THAT(e.what(), Catch::Matchers::Contains((dir / "elsewhere").string()));
  }
}

}  // namespace
