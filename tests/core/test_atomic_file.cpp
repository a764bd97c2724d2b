// Tests for crash-safe file replacement (coltrain/core/atomic_file.hpp): the contents are replaced
// whole, no temporary file stays behind, and every failure leaves the old file and says which file
// and why; and the temporary names are recognised by cleanups.

#include <coltrain/core/atomic_file.hpp>

#include <sys/resource.h>
#include <catch2/catch.hpp>

#include <csignal>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "../support/file_size_limit.hpp"
#include "../support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using coltrain::testing::TempDir;

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The IoError that `write` throws; fails the test when it returns without one.
template <class Write>
coltrain::IoError io_error_of(Write&& write) {
  try {
    write();
  } catch (const coltrain::IoError& e) {
    return e;
  }
  FAIL("the write succeeded but should have thrown IoError");
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("an atomic write replaces the contents and leaves no temporary file", "[atomic_file]") {
  TempDir dir("coltrain_atomic");
  const fs::path file = dir / "f.json";
  coltrain::write_file_atomically(file, std::string("first, longer contents"));
  CHECK(read_text(file) == "first, longer contents");
  const std::vector<std::byte> bytes{std::byte{'a'}, std::byte{0}, std::byte{'b'}};
  coltrain::write_file_atomically(file, bytes);
  CHECK(read_text(file) == std::string("a\0b", 3));
  coltrain::write_file_atomically(file, std::string());
  CHECK(fs::file_size(file) == 0);
  CHECK(dir.names() == std::vector<std::string>{"f.json"});
}

TEST_CASE("the writer writes in pieces and touches the target only at commit", "[atomic_file]") {
  TempDir dir("coltrain_atomic");
  const fs::path file = dir / "f";
  coltrain::write_file_atomically(file, std::string("old"));
  {
    coltrain::AtomicFileWriter writer(file);
    writer.write(std::string("new "));
    writer.write(std::string("contents"));
    CHECK(fs::exists(writer.temporary_path()));
    CHECK(writer.temporary_path().parent_path() == dir.path());
    CHECK(read_text(file) == "old");
    writer.commit();
    CHECK_THROWS_AS(writer.write(std::string("more")), coltrain::InvalidArgument);
  }
  CHECK(read_text(file) == "new contents");
  {
    coltrain::AtomicFileWriter abandoned(file);
    abandoned.write(std::string("never committed"));
  }
  CHECK(read_text(file) == "new contents");
  CHECK(dir.names() == std::vector<std::string>{"f"});
}

TEST_CASE("a missing directory is IoError naming the file, the operation and the cause",
          "[atomic_file]") {
  TempDir dir("coltrain_atomic");
  const fs::path file = dir / "missing" / "f";
  const coltrain::IoError error =
      io_error_of([&] { coltrain::write_file_atomically(file, std::string("x"), "save things"); });
  CHECK(error.context().file == file.string());
  CHECK(error.context().operation == "save things");
  CHECK_THAT(error.what(), Contains("cannot create temporary file") && Contains("No such file"));
  CHECK(dir.names().empty());
}

TEST_CASE("a directory in the file's place stays, and the temporary file goes", "[atomic_file]") {
  TempDir dir("coltrain_atomic");
  const fs::path file = dir / "taken";
  fs::create_directories(file / "inside");  // a non-empty directory cannot be renamed over
  const coltrain::IoError error =
      io_error_of([&] { coltrain::write_file_atomically(file, std::string("x")); });
  CHECK(error.context().file == file.string());
  CHECK(error.context().operation == "write file");
  CHECK_THAT(error.what(), Contains("cannot rename temporary file") && Contains("into place"));
  CHECK(fs::is_directory(file / "inside"));
  CHECK(dir.names() == std::vector<std::string>{"taken"});
}

TEST_CASE("a failed write keeps the old file, removes the temporary file and ends the writer",
          "[atomic_file]") {
  TempDir dir("coltrain_atomic");
  const fs::path file = dir / "f";
  coltrain::write_file_atomically(file, std::string("old"));
  coltrain::AtomicFileWriter writer(file);
  {
    const coltrain::testing::FileSizeLimit limit(64 * 1024);
    const coltrain::IoError error = io_error_of([&] { writer.write(std::string(1 << 20, 'x')); });
    CHECK(error.context().file == file.string());
    CHECK_THAT(error.what(), Contains("cannot write temporary file"));
  }
  CHECK_FALSE(fs::exists(writer.temporary_path()));
  // Committing what is left would put a file with a hole in place.
  CHECK_THROWS_AS(writer.commit(), coltrain::InvalidArgument);
  CHECK(read_text(file) == "old");
  CHECK(dir.names() == std::vector<std::string>{"f"});
}

TEST_CASE("a long file name still gets a temporary name within the limit", "[atomic_file]") {
  TempDir dir("coltrain_atomic");
  const fs::path file = dir / std::string(250, 'n');
  coltrain::write_file_atomically(file, std::string("x"));
  CHECK(read_text(file) == "x");
}

TEST_CASE("cleanups recognise the temporary names and only those", "[atomic_file]") {
  TempDir dir("coltrain_atomic");
  coltrain::AtomicFileWriter writer(dir / "checkpoint-000003.json");
  const std::string temporary = writer.temporary_path().filename().string();
  CHECK(coltrain::is_atomic_write_temporary(temporary, "checkpoint-"));
  CHECK(coltrain::is_atomic_write_temporary(temporary, "checkpoint-000003.json"));
  CHECK_FALSE(coltrain::is_atomic_write_temporary(temporary, "result"));
  CHECK(coltrain::is_atomic_write_temporary(".checkpoint-000009.json.tmp.4242.0", "checkpoint-"));
  for (const char* other :
       {"checkpoint-000003.json", "checkpoint-000003.json.tmp.1.2", ".checkpoint-notes.tmp.txt",
        ".checkpoint-1.json.tmp.1.", ".checkpoint-1.json.tmp..2", ".checkpoint-1.json.tmp.12",
        ".tmp.1.2", ".checkpoint-1.json.tmp.1.2x"}) {
    INFO(other);
    CHECK_FALSE(coltrain::is_atomic_write_temporary(other, "checkpoint-"));
  }
}

TEST_CASE("sync_directory flushes a directory and names one it cannot open", "[atomic_file]") {
  TempDir dir("coltrain_atomic");
  coltrain::sync_directory(dir.path());
  const coltrain::IoError error = io_error_of([&] { coltrain::sync_directory(dir / "absent"); });
  CHECK(error.context().file == (dir / "absent").string());
  CHECK(error.context().operation == "sync directory");
}
