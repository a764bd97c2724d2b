#pragma once
// An in-memory image classification dataset: the images as bytes [N, C, H, W], as they are stored
// on disk, and int32 labels. Loading is a copy of the files' bytes; conversion to floats (and
// normalisation, augmentation) happens per batch, so a dataset costs 1 byte per pixel
// (MNIST 47 MB, CIFAR-10 184 MB) instead of 4.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/shape.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::data {

enum class Split {
  kTrain,
  kTest,
};

constexpr const char* name_of(Split split) { return split == Split::kTrain ? "train" : "test"; }

// The shape of one image, channels first.
struct ImageShape {
  std::int64_t channels = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;

  constexpr std::int64_t size() const { return channels * height * width; }
  // The shape of a batch of n images, [n, C, H, W].
  tensor::Shape batch(std::int64_t n) const { return {n, channels, height, width}; }
  std::string to_string() const {
    return std::to_string(channels) + "x" + std::to_string(height) + "x" + std::to_string(width);
  }
  friend constexpr bool operator==(const ImageShape&, const ImageShape&) = default;
};

class ImageDataset {
 public:
  ImageDataset() = default;
  // `pixels` holds labels.size() images of `shape`, channels first; every label is below
  // num_classes.
  ImageDataset(ImageShape shape, std::vector<std::uint8_t> pixels, std::vector<std::int32_t> labels,
               int num_classes = 10)
      : shape_(shape),
        pixels_(std::move(pixels)),
        labels_(std::move(labels)),
        num_classes_(num_classes) {
    auto invalid = [](const std::string& message) {
      ErrorContext c;
      c.operation = "ImageDataset";
      throw InvalidArgument(message, c);
    };
    if (shape_.channels <= 0 || shape_.height <= 0 || shape_.width <= 0)
      invalid("image shape " + shape_.to_string() + " has a dimension that is not positive");
    if (num_classes_ <= 0) invalid("num_classes is " + std::to_string(num_classes_));
    const auto expected = static_cast<std::uint64_t>(shape_.size()) * labels_.size();
    if (pixels_.size() != expected) {
      invalid(std::to_string(labels_.size()) + " labels need " + std::to_string(expected) +
              " pixels (" + shape_.to_string() + " each), got " + std::to_string(pixels_.size()));
    }
    for (std::size_t i = 0; i < labels_.size(); ++i) {
      if (labels_[i] < 0 || labels_[i] >= num_classes_) {
        invalid("label " + std::to_string(labels_[i]) + " of sample " + std::to_string(i) +
                " is outside [0, " + std::to_string(num_classes_) + ")");
      }
    }
  }

  std::int64_t size() const { return static_cast<std::int64_t>(labels_.size()); }
  bool empty() const { return labels_.empty(); }
  const ImageShape& image_shape() const { return shape_; }
  int num_classes() const { return num_classes_; }
  // [N, C, H, W]
  tensor::Shape shape() const { return shape_.batch(size()); }

  std::span<const std::uint8_t> pixels() const { return pixels_; }
  std::span<const std::int32_t> labels() const { return labels_; }

  std::span<const std::uint8_t> image(std::int64_t i) const {
    check_index(i);
    return std::span(pixels_).subspan(static_cast<std::size_t>(i * shape_.size()),
                                      static_cast<std::size_t>(shape_.size()));
  }
  std::int32_t label(std::int64_t i) const {
    check_index(i);
    return labels_[static_cast<std::size_t>(i)];
  }

  // The first `count` samples (all if there are fewer), for short runs.
  ImageDataset head(std::int64_t count) const {
    const std::int64_t n = count < 0 ? 0 : (count < size() ? count : size());
    const auto end = pixels_.begin() + static_cast<std::ptrdiff_t>(n * shape_.size());
    return ImageDataset(shape_, std::vector<std::uint8_t>(pixels_.begin(), end),
                        std::vector<std::int32_t>(labels_.begin(), labels_.begin() + n),
                        num_classes_);
  }

 private:
  void check_index(std::int64_t i) const {
    if (i < 0 || i >= size()) {
      throw InvalidArgument("sample " + std::to_string(i) + " is outside a dataset of " +
                            std::to_string(size()));
    }
  }

  ImageShape shape_;
  std::vector<std::uint8_t> pixels_;
  std::vector<std::int32_t> labels_;
  int num_classes_ = 10;
};

}  // namespace coltrain::data
