#pragma once
// Per-sample transforms from the stored bytes to a network's float input: augmentation in pixel
// space (random crop with zero padding, horizontal flip), then x = pixel / 255 normalised per
// channel, (x - mean) / std, with the arithmetic of torchvision's ToTensor and Normalize (a float
// division by 255, a subtraction, a division), so the same inputs give the same floats.
//
// Augmentation comes before normalisation, so the padding is 0 in pixel space (it becomes
// -mean / std), as torchvision's RandomCrop on the uint8 image does. Its randomness is a pure
// function of (seed, epoch, dataset index): a resumed run draws the same crops and flips.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/dataset.hpp>
#include <coltrain/data/random.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace coltrain::data {

// Which sample of which epoch a transform is applied to.
struct SampleKey {
  std::uint64_t epoch = 0;
  std::int64_t index = 0;  // in the dataset, not in the batch
};

// What a Loader needs of a transform: the output shape for an input shape, and `apply`, which turns
// one image's bytes into output_shape(shape).size() floats. `apply` is called from the loader's
// background thread and must give the same result for the same arguments.
template <class T>
concept SampleTransform = requires(const T& t, std::span<const std::uint8_t> image,
                                   ImageShape shape, SampleKey key, std::span<float> out) {
  { t.output_shape(shape) } -> std::same_as<ImageShape>;
  t.apply(image, shape, key, out);
};

// Per-channel mean and standard deviation of x = pixel / 255. Empty: no normalisation.
struct Normalization {
  std::vector<float> mean = {};
  std::vector<float> std = {};
};

// The usual constants: MNIST's training-set statistics, and CIFAR-10's as in the ResNet papers'
// PyTorch reproductions.
inline constexpr float kMnistMean = 0.1307f;
inline constexpr float kMnistStd = 0.3081f;
inline constexpr float kCifar10Mean[3] = {0.4914f, 0.4822f, 0.4465f};
inline constexpr float kCifar10Std[3] = {0.2470f, 0.2435f, 0.2616f};

inline Normalization mnist_normalization() { return {{kMnistMean}, {kMnistStd}}; }
inline Normalization cifar10_normalization() {
  return {{kCifar10Mean[0], kCifar10Mean[1], kCifar10Mean[2]},
          {kCifar10Std[0], kCifar10Std[1], kCifar10Std[2]}};
}

// The random choices for one sample: the crop's top-left corner in the padded image, and whether
// the crop is mirrored.
struct AugmentationDraw {
  std::int64_t top = 0;
  std::int64_t left = 0;
  bool flip = false;
  friend bool operator==(const AugmentationDraw&, const AugmentationDraw&) = default;
};

// Random crop (torchvision's RandomCrop(crop, padding)), then horizontal flip with probability
// flip_probability (RandomHorizontalFlip), then normalisation. The default is pixel / 255 alone.
struct ImageTransform {
  Normalization normalization = {};
  std::int64_t crop = 0;     // output height and width; 0: no crop (and no padding)
  std::int64_t padding = 0;  // zero pixels added on each side before cropping
  double flip_probability = 0.0;
  std::uint64_t seed = 0;  // of the augmentation

  ImageShape output_shape(ImageShape input) const {
    check(input);
    return crop == 0 ? input : ImageShape{input.channels, crop, crop};
  }

  AugmentationDraw draw(ImageShape input, SampleKey key) const {
    check(input);
    SplitMix64 rng = SplitMix64::keyed(seed, key.epoch, key.index);
    AugmentationDraw d;
    if (crop != 0) {
      d.top = static_cast<std::int64_t>(
          rng.below(static_cast<std::uint64_t>(input.height + 2 * padding - crop + 1)));
      d.left = static_cast<std::int64_t>(
          rng.below(static_cast<std::uint64_t>(input.width + 2 * padding - crop + 1)));
    }
    d.flip = flip_probability > 0.0 && rng.uniform() < flip_probability;
    return d;
  }

  void apply(std::span<const std::uint8_t> image, ImageShape input, SampleKey key,
             std::span<float> out) const {
    const ImageShape output = output_shape(input);
    if (image.size() != static_cast<std::size_t>(input.size()) ||
        out.size() != static_cast<std::size_t>(output.size())) {
      throw InvalidArgument("ImageTransform: " + std::to_string(image.size()) + " pixels for a " +
                            input.to_string() + " image and room for " +
                            std::to_string(out.size()) + " values of " + output.to_string());
    }
    const AugmentationDraw d = draw(input, key);
    // Output (y, x) shows padded-image pixel (top + y, left + x'), x' = x or mirrored; the padded
    // image is the input shifted by `padding`. The crop and flip move bytes into a plane of their
    // own; then each plane is normalised in one long run, which the compiler vectorises (rows of
    // 28 or 32 pixels are too short for that).
    const std::int64_t shift = crop == 0 ? 0 : padding;
    const std::int64_t plane_size = output.height * output.width;
    static thread_local std::vector<std::uint8_t> cropped;
    for (std::int64_t c = 0; c < output.channels; ++c) {
      const std::uint8_t* plane = image.data() + c * input.height * input.width;
      if (crop != 0 || d.flip) {
        cropped.assign(static_cast<std::size_t>(plane_size), 0);
        for (std::int64_t y = 0; y < output.height; ++y) {
          const std::int64_t sy = d.top + y - shift;
          if (sy < 0 || sy >= input.height) continue;
          // Output column x reads input column first + x, or first - x when mirrored; the
          // columns [begin, end) read inside the image.
          const std::int64_t first = d.flip ? d.left + output.width - 1 - shift : d.left - shift;
          const std::int64_t begin =
              std::clamp<std::int64_t>(d.flip ? first - input.width + 1 : -first, 0, output.width);
          const std::int64_t end = std::clamp<std::int64_t>(
              d.flip ? first + 1 : input.width - first, begin, output.width);
          std::uint8_t* target = cropped.data() + y * output.width;
          const std::uint8_t* row = plane + sy * input.width;
          if (d.flip) {
            for (std::int64_t x = begin; x < end; ++x) target[x] = row[first - x];
          } else if (end > begin) {
            std::memcpy(target + begin, row + first + begin, static_cast<std::size_t>(end - begin));
          }
        }
        plane = cropped.data();
      }
      normalize_plane(c, plane, plane_size, out.data() + c * plane_size);
    }
  }

 private:
  // out[i] = pixels[i] / 255, then (x - mean) / std of `channel` when normalising.
  void normalize_plane(std::int64_t channel, const std::uint8_t* COLTRAIN_RESTRICT pixels,
                       std::int64_t count, float* COLTRAIN_RESTRICT out) const {
    if (normalization.mean.empty()) {
      for (std::int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(pixels[i]) / 255.0f;
      return;
    }
    const float mean = normalization.mean[static_cast<std::size_t>(channel)];
    const float deviation = normalization.std[static_cast<std::size_t>(channel)];
    for (std::int64_t i = 0; i < count; ++i)
      out[i] = (static_cast<float>(pixels[i]) / 255.0f - mean) / deviation;
  }

  void check(ImageShape input) const {
    auto invalid = [&](const std::string& message) {
      throw InvalidArgument("ImageTransform on " + input.to_string() + " images: " + message);
    };
    if (!normalization.mean.empty() || !normalization.std.empty()) {
      if (normalization.mean.size() != static_cast<std::size_t>(input.channels) ||
          normalization.std.size() != static_cast<std::size_t>(input.channels)) {
        invalid("normalization has " + std::to_string(normalization.mean.size()) + " means and " +
                std::to_string(normalization.std.size()) + " standard deviations, expected one " +
                "per channel");
      }
      for (const float s : normalization.std)
        if (!(s > 0.0f)) invalid("a standard deviation is not positive: " + std::to_string(s));
    }
    if (crop < 0 || padding < 0) invalid("crop and padding must not be negative");
    if (crop == 0 && padding != 0) invalid("padding without a crop size");
    if (crop > input.height + 2 * padding || crop > input.width + 2 * padding) {
      invalid("crop " + std::to_string(crop) + " is larger than the padded image (padding " +
              std::to_string(padding) + ")");
    }
    if (!(flip_probability >= 0.0 && flip_probability <= 1.0))
      invalid("flip probability " + std::to_string(flip_probability) + " is outside [0, 1]");
  }
};

static_assert(SampleTransform<ImageTransform>);

// MNIST: normalisation only.
inline ImageTransform mnist_transform() { return {.normalization = mnist_normalization()}; }

// CIFAR-10 training as in He et al.: 4-pixel zero padding, random 32 x 32 crop, flip with p = 0.5,
// normalisation.
inline ImageTransform cifar10_train_transform(std::uint64_t seed) {
  return {.normalization = cifar10_normalization(),
          .crop = 32,
          .padding = 4,
          .flip_probability = 0.5,
          .seed = seed};
}

// CIFAR-10 evaluation: normalisation only.
inline ImageTransform cifar10_eval_transform() {
  return {.normalization = cifar10_normalization()};
}

}  // namespace coltrain::data
