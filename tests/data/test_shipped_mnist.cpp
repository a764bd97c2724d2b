// The MNIST subset shipped in data/mnist/: its files match the sha256 digests data/mnist/README.md
// lists (a corrupted or half-fetched checkout fails here), hold 8,000 and 2,000 28 x 28 images of
// all ten digits, and default_mnist_dir() finds them.

#include <catch2/catch.hpp>
#include <coltrain/data/mnist.hpp>

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>

#include "../support/temp_dir.hpp"
#include "data_test_helpers.hpp"
#include "sha256.hpp"

#ifndef COLTRAIN_DATA_DIR
#error "the coltrain CMake target defines COLTRAIN_DATA_DIR as the source tree's data/ folder"
#endif

namespace {

namespace data = coltrain::data;
namespace fs = std::filesystem;

const fs::path kShipped = fs::path(COLTRAIN_DATA_DIR) / "mnist";

// The digest README.md lists for `name`: the 64 hex digits on the table row naming the file.
std::string readme_sha256(const std::string& name) {
  std::ifstream readme(kShipped / "README.md");
  REQUIRE(readme.good());
  const std::regex row("^\\|\\s*`" + std::regex_replace(name, std::regex("\\."), "\\.") +
                       "`\\s*\\|.*`([0-9a-f]{64})`");
  std::smatch match;
  for (std::string line; std::getline(readme, line);) {
    if (std::regex_search(line, match, row)) return match[1];
  }
  FAIL("README.md has no row for " << name);
  return {};
}

TEST_CASE("the shipped files match the digests in their README", "[mnist][shipped]") {
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                           "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    INFO(name);
    const auto bytes = coltrain::testing::read_bytes(kShipped / name);
    CHECK(coltrain::testing::sha256_hex(bytes) == readme_sha256(name));
  }
  // The digest function itself, on FIPS 180-4's example.
  const std::string abc = "abc";
  CHECK(coltrain::testing::sha256_hex(
            std::span(reinterpret_cast<const std::uint8_t*>(abc.data()), abc.size())) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("the shipped subset: 8000 + 2000 images of every digit", "[mnist][shipped]") {
  const data::ImageDataset train = data::load_mnist(kShipped, data::Split::kTrain);
  const data::ImageDataset test = data::load_mnist(kShipped, data::Split::kTest);
  CHECK(train.size() == 8000);
  CHECK(test.size() == 2000);
  for (const data::ImageDataset* set : {&train, &test}) {
    CHECK(set->image_shape() == data::ImageShape{1, 28, 28});
    const std::set<std::int32_t> classes(set->labels().begin(), set->labels().end());
    CHECK(classes.size() == 10);
    // Real digits: MNIST's mean intensity is 0.1307, and most pixels are background.
    std::uint64_t sum = 0;
    for (const std::uint8_t p : set->pixels()) sum += p;
    const double mean =
        static_cast<double>(sum) / 255.0 / static_cast<double>(set->pixels().size());
    CHECK((mean > 0.12 && mean < 0.14));
  }
}

TEST_CASE("default_mnist_dir finds the shipped subset, or COLTRAIN_DATA_DIR's", "[mnist]") {
  ::unsetenv("COLTRAIN_DATA_DIR");
  CHECK(fs::equivalent(data::default_mnist_dir(), kShipped));

  coltrain::testing::TempDir dir("coltrain_mnist_env");
  ::setenv("COLTRAIN_DATA_DIR", dir.path().c_str(), 1);
  CHECK(fs::equivalent(data::default_mnist_dir(), kShipped));  // no mnist/ there: skipped
  fs::create_directories(dir / "mnist");
  fs::copy_file(kShipped / "train-images-idx3-ubyte.gz",
                dir / "mnist" / "train-images-idx3-ubyte.gz");
  CHECK(data::default_mnist_dir() == dir / "mnist");
  ::unsetenv("COLTRAIN_DATA_DIR");
}

}  // namespace
