#pragma once
// A fresh, empty directory for one test, removed with everything in it when the test ends.

#include <unistd.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace coltrain::testing {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "coltrain_test") {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            (std::string(prefix) + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

  // The names of the entries in the directory.
  std::vector<std::string> names() const {
    std::vector<std::string> result;
    for (const auto& item : std::filesystem::directory_iterator(path_))
      result.push_back(item.path().filename().string());
    return result;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace coltrain::testing
