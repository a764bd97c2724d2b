#pragma once
// MNIST: finding its files and loading a split as an ImageDataset of 1 x 28 x 28 images.
//
// A directory holds the standard file names, raw or gzipped: train-images-idx3-ubyte[.gz],
// train-labels-idx1-ubyte[.gz] and t10k-* for the test split (the names of the official files and
// of torchvision's raw/ folder). default_mnist_dir() finds the subset shipped in data/mnist/
// (8,000 training and 2,000 test images, see data/mnist/README.md) when no directory is given.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/dataset.hpp>
#include <coltrain/data/idx.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace coltrain::data {

inline constexpr ImageShape kMnistImageShape{1, 28, 28};
inline constexpr int kMnistClasses = 10;

namespace detail {

// The first of `names` that exists in `dir`, raw preferred over gzipped (it reads faster).
inline std::optional<std::filesystem::path> find_first(const std::filesystem::path& dir,
                                                       const std::vector<std::string>& names) {
  std::error_code ignored;
  for (const std::string& name : names) {
    if (std::filesystem::is_regular_file(dir / name, ignored)) return dir / name;
  }
  return std::nullopt;
}

inline std::vector<std::string> mnist_file_names(Split split, const char* kind) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string stem = prefix + "-" + kind;
  return {stem, stem + ".gz"};
}

inline std::filesystem::path find_mnist_file(const std::filesystem::path& dir, Split split,
                                             const char* kind) {
  const std::vector<std::string> names = mnist_file_names(split, kind);
  if (auto found = find_first(dir, names)) return *found;
  ErrorContext c;
  c.operation = "load MNIST";
  c.file = dir.string();
  throw IoError("no MNIST " + std::string(name_of(split)) + " file " + names[0] + " or " +
                    names[1] + " in " + dir.string() +
                    " (scripts/download-data fetches the full set)",
                c);
}

inline bool has_mnist_files(const std::filesystem::path& dir) {
  return find_first(dir, mnist_file_names(Split::kTrain, "images-idx3-ubyte")).has_value();
}

// Where default_mnist_dir() looks, in order: $COLTRAIN_DATA_DIR/mnist, the COLTRAIN_DATA_DIR macro
// (CMake sets it to the source tree's data/)/mnist, data/mnist under the working directory, then
// under the executable's directory and each of its parents.
inline std::vector<std::filesystem::path> mnist_dir_candidates(
    const char* env_data_dir, const char* compiled_data_dir, const std::filesystem::path& cwd,
    const std::filesystem::path& executable) {
  std::vector<std::filesystem::path> candidates;
  if (env_data_dir != nullptr && *env_data_dir != '\0')
    candidates.push_back(std::filesystem::path(env_data_dir) / "mnist");
  if (compiled_data_dir != nullptr && *compiled_data_dir != '\0')
    candidates.push_back(std::filesystem::path(compiled_data_dir) / "mnist");
  if (!cwd.empty()) candidates.push_back(cwd / "data" / "mnist");
  if (!executable.empty()) {
    for (std::filesystem::path dir = executable.parent_path();; dir = dir.parent_path()) {
      candidates.push_back(dir / "data" / "mnist");
      if (dir == dir.parent_path() || dir.empty()) break;
    }
  }
  return candidates;
}

// The first candidate that holds MNIST's training images.
inline std::filesystem::path find_mnist_dir(const std::vector<std::filesystem::path>& candidates) {
  std::string looked;
  for (const std::filesystem::path& dir : candidates) {
    if (has_mnist_files(dir)) return dir;
    looked += "\n  " + dir.string();
  }
  ErrorContext c;
  c.operation = "find MNIST";
  throw ConfigError(
      "no MNIST data found; pass its directory (--data DIR) or set COLTRAIN_DATA_DIR (its mnist/ "
      "folder is used; scripts/download-data fetches the full set). Looked in:" +
          looked,
      c);
}

}  // namespace detail

// The directory of the MNIST files to use when none is given: the first of
// detail::mnist_dir_candidates that holds MNIST's training images. A bare `g++ -I include` build
// run from the repository finds the shipped subset through the working directory or the
// executable's location.
inline std::filesystem::path default_mnist_dir() {
#ifdef COLTRAIN_DATA_DIR
  const char* compiled = COLTRAIN_DATA_DIR;
#else
  const char* compiled = nullptr;
#endif
  std::error_code ignored;
  return detail::find_mnist_dir(detail::mnist_dir_candidates(
      std::getenv("COLTRAIN_DATA_DIR"), compiled, std::filesystem::current_path(ignored),
      std::filesystem::read_symlink("/proc/self/exe", ignored)));
}

// Loads one split of MNIST from `dir`. Checks the IDX headers, 28 x 28 images, labels below 10,
// and that the image and label files have the same count.
inline ImageDataset load_mnist(const std::filesystem::path& dir, Split split) {
  const std::filesystem::path images_file =
      detail::find_mnist_file(dir, split, "images-idx3-ubyte");
  const std::filesystem::path labels_file =
      detail::find_mnist_file(dir, split, "labels-idx1-ubyte");
  IdxImages images = read_idx_images(images_file);
  if (images.rows != kMnistImageShape.height || images.cols != kMnistImageShape.width) {
    throw IoError("expected MNIST's 28 x 28 images, found " + std::to_string(images.rows) + " x " +
                      std::to_string(images.cols),
                  detail::file_context(images_file, "load MNIST", 8));
  }
  const std::vector<std::uint8_t> labels = read_idx_labels(labels_file, kMnistClasses);
  if (static_cast<std::int64_t>(labels.size()) != images.count) {
    throw IoError(std::to_string(images.count) + " images in " + images_file.string() + " but " +
                      std::to_string(labels.size()) + " labels in " + labels_file.string(),
                  detail::file_context(labels_file, "load MNIST", 4));
  }
  return ImageDataset(kMnistImageShape, std::move(images.pixels),
                      std::vector<std::int32_t>(labels.begin(), labels.end()), kMnistClasses);
}

}  // namespace coltrain::data
