// A build without zlib (COLTRAIN_WITH_ZLIB=0, as where zlib.h is missing): gzip files are an error
// that says zlib is missing, and raw files still work. Its own executable, so that no other
// translation unit sees the zlib-enabled versions of the same inline functions.

#undef COLTRAIN_WITH_ZLIB
#define COLTRAIN_WITH_ZLIB 0

#include <catch2/catch.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/idx.hpp>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "../support/temp_dir.hpp"
#include "data_test_helpers.hpp"

namespace {

namespace data = coltrain::data;
using coltrain::testing::Bytes;

static_assert(!coltrain::BuildConfig::kWithZlib);

TEST_CASE("without zlib, gzip files are an error naming the file and the missing library",
          "[idx][nozlib]") {
  const std::filesystem::path gz =
      std::filesystem::path(COLTRAIN_DATA_DIR) / "mnist" / "t10k-labels-idx1-ubyte.gz";
  coltrain::testing::require_error<coltrain::ConfigError>(
      [&] { data::read_idx_labels(gz); }, gz, std::nullopt,
      "the file is gzip-compressed but coltrain was built without zlib");

  coltrain::testing::TempDir dir("coltrain_nozlib");
  coltrain::testing::require_error<coltrain::ConfigError>(
      [&] { data::write_idx_labels(dir / "labels.gz", Bytes{1}, data::Compression::kGzip); },
      dir / "labels.gz", std::nullopt, "built without zlib");
  CHECK(dir.names().empty());

  data::write_idx_labels(dir / "labels", Bytes{3, 1});
  CHECK(data::read_idx_labels(dir / "labels") == Bytes{3, 1});
}

}  // namespace
