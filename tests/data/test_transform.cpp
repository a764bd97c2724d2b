// Normalisation and augmentation (coltrain/data/transform.hpp). The reference crops by building the
// zero-padded image explicitly, a different route from the transform's index arithmetic.

#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/transform.hpp>

#include <cstdint>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "data_test_helpers.hpp"

namespace {

namespace data = coltrain::data;
using coltrain::testing::Bytes;
using coltrain::testing::pattern;
using data::ImageShape;
using data::ImageTransform;
using data::SampleKey;

std::vector<float> apply(const ImageTransform& t, const Bytes& image, ImageShape shape,
                         SampleKey key) {
  std::vector<float> out(static_cast<std::size_t>(t.output_shape(shape).size()));
  t.apply(image, shape, key, out);
  return out;
}

// torchvision's arithmetic: ToTensor divides by 255 in float, Normalize subtracts and divides.
float normalized(std::uint8_t pixel, float mean, float std) {
  return (static_cast<float>(pixel) / 255.0f - mean) / std;
}

// Crop of the explicitly zero-padded image at (top, left), mirrored if `flip`, then normalised.
std::vector<float> reference(const Bytes& image, ImageShape shape, std::int64_t crop,
                             std::int64_t padding, data::AugmentationDraw d,
                             const data::Normalization& n) {
  const std::int64_t ph = shape.height + 2 * padding, pw = shape.width + 2 * padding;
  Bytes padded(static_cast<std::size_t>(shape.channels * ph * pw), 0);
  for (std::int64_t c = 0; c < shape.channels; ++c)
    for (std::int64_t y = 0; y < shape.height; ++y)
      for (std::int64_t x = 0; x < shape.width; ++x)
        padded[static_cast<std::size_t>((c * ph + y + padding) * pw + x + padding)] =
            image[static_cast<std::size_t>((c * shape.height + y) * shape.width + x)];
  std::vector<float> out;
  for (std::int64_t c = 0; c < shape.channels; ++c)
    for (std::int64_t y = 0; y < crop; ++y)
      for (std::int64_t x = 0; x < crop; ++x) {
        const std::int64_t cx = d.flip ? crop - 1 - x : x;
        const std::uint8_t p =
            padded[static_cast<std::size_t>((c * ph + d.top + y) * pw + d.left + cx)];
        out.push_back(
            normalized(p, n.mean[static_cast<std::size_t>(c)], n.std[static_cast<std::size_t>(c)]));
      }
  return out;
}

TEST_CASE("normalisation is (pixel / 255 - mean) / std per channel", "[transform]") {
  const ImageShape shape{3, 4, 5};
  Bytes image = pattern(60);
  image[0] = 0;
  image[1] = 255;
  const std::vector<float> out = apply(data::cifar10_eval_transform(), image, shape, {});
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::size_t c = i / 20;
    CHECK(out[i] == normalized(image[i], data::kCifar10Mean[c], data::kCifar10Std[c]));
  }
  const std::vector<float> plain = apply(ImageTransform{}, image, shape, {});
  for (std::size_t i = 0; i < out.size(); ++i)
    CHECK(plain[i] == static_cast<float>(image[i]) / 255.0f);

  const std::vector<float> mnist =
      apply(data::mnist_transform(), Bytes{0, 255, 128, 1}, ImageShape{1, 2, 2}, {});
  CHECK(mnist[0] == (0.0f - 0.1307f) / 0.3081f);
  CHECK(mnist[1] == (1.0f - 0.1307f) / 0.3081f);
}

TEST_CASE("CIFAR augmentation: crop offsets cover the padded range, flips about half",
          "[transform]") {
  const ImageTransform t = data::cifar10_train_transform(11);
  const ImageShape shape{3, 32, 32};
  CHECK(t.output_shape(shape) == shape);
  std::set<std::int64_t> tops, lefts;
  int flips = 0;
  constexpr int kDraws = 2000;
  for (int i = 0; i < kDraws; ++i) {
    const data::AugmentationDraw d = t.draw(shape, {.epoch = 0, .index = i});
    CHECK((d.top >= 0 && d.top <= 8 && d.left >= 0 && d.left <= 8));
    tops.insert(d.top);
    lefts.insert(d.left);
    flips += d.flip;
  }
  CHECK(tops.size() == 9);
  CHECK(lefts.size() == 9);
  // A fixed seed makes this a fixed number; the bounds say it is a fair coin (4.5 sigma).
  CHECK((flips > 900 && flips < 1100));
}

TEST_CASE("augmented images equal a crop of the explicitly zero-padded image", "[transform]") {
  const ImageShape shape{3, 6, 5};
  const Bytes image = pattern(90, 3);
  const ImageTransform t{.normalization = {{0.5f, 0.25f, 0.125f}, {0.5f, 2.0f, 0.25f}},
                         .crop = 4,
                         .padding = 2,
                         .flip_probability = 0.5,
                         .seed = 9};
  CHECK(t.output_shape(shape) == ImageShape{3, 4, 4});
  std::set<std::pair<std::int64_t, bool>> seen;
  for (std::int64_t index = 0; index < 200; ++index) {
    const SampleKey key{.epoch = 2, .index = index};
    const data::AugmentationDraw d = t.draw(shape, key);
    CHECK((d.top >= 0 && d.top <= 6 && d.left >= 0 && d.left <= 5));
    seen.insert({d.top, d.flip});
    CHECK(apply(t, image, shape, key) == reference(image, shape, 4, 2, d, t.normalization));
  }
  CHECK(seen.size() == 14);  // every top offset, flipped and not
}

TEST_CASE("padding is zero in pixel space: -mean / std after normalisation", "[transform]") {
  const ImageShape shape{1, 8, 8};
  const Bytes white(64, 255);
  ImageTransform t{.normalization = data::mnist_normalization(), .crop = 8, .padding = 4};
  // Find a sample whose crop starts in the padding's corner.
  std::int64_t index = 0;
  while (t.draw(shape, {.index = index}) != data::AugmentationDraw{0, 0, false}) ++index;
  const std::vector<float> out = apply(t, white, shape, {.index = index});
  const float zero = normalized(0, 0.1307f, 0.3081f), full = normalized(255, 0.1307f, 0.3081f);
  for (std::int64_t y = 0; y < 8; ++y)
    for (std::int64_t x = 0; x < 8; ++x)
      CHECK(out[static_cast<std::size_t>(y * 8 + x)] == (y < 4 || x < 4 ? zero : full));
}

TEST_CASE("a flip mirrors each row, and flipping the mirror gives the image back", "[transform]") {
  const ImageShape shape{2, 3, 4};
  const Bytes image = pattern(24, 5);
  const std::vector<float> plain = apply(ImageTransform{}, image, shape, {});
  const ImageTransform flip{.flip_probability = 1.0};
  CHECK(flip.draw(shape, {}).flip);
  const std::vector<float> mirrored = apply(flip, image, shape, {});
  Bytes mirrored_bytes(24);
  for (std::size_t row = 0; row < 6; ++row)
    for (std::size_t x = 0; x < 4; ++x) {
      CHECK(mirrored[row * 4 + x] == plain[row * 4 + 3 - x]);
      mirrored_bytes[row * 4 + x] = image[row * 4 + 3 - x];
    }
  CHECK(apply(flip, mirrored_bytes, shape, {}) == plain);
}

TEST_CASE("draws depend on (seed, epoch, index) only", "[transform]") {
  const ImageShape shape{3, 32, 32};
  const ImageTransform a = data::cifar10_train_transform(1);
  const ImageTransform b = data::cifar10_train_transform(2);
  int epoch_differs = 0, seed_differs = 0;
  for (std::int64_t i = 0; i < 100; ++i) {
    // The same key in any order gives the same draw.
    CHECK(a.draw(shape, {3, i}) == a.draw(shape, {3, i}));
    epoch_differs += a.draw(shape, {3, i}) != a.draw(shape, {4, i});
    seed_differs += a.draw(shape, {3, i}) != b.draw(shape, {3, i});
  }
  CHECK(epoch_differs > 80);
  CHECK(seed_differs > 80);
  const Bytes image = pattern(3072);
  CHECK(apply(a, image, shape, {5, 17}) == apply(a, image, shape, {5, 17}));
}

TEST_CASE("invalid transforms are errors", "[transform]") {
  using Catch::Matchers::Contains;
  const ImageShape rgb{3, 8, 8};
  CHECK_THROWS_WITH(data::mnist_transform().output_shape(rgb),
                    Contains("normalization has 1 means and 1 standard deviations"));
  CHECK_THROWS_WITH((ImageTransform{.crop = 20, .padding = 2}.output_shape(rgb)),
                    Contains("crop 20 is larger than the padded image"));
  CHECK_THROWS_WITH((ImageTransform{.padding = 2}.output_shape(rgb)),
                    Contains("padding without a crop size"));
  CHECK_THROWS_WITH((ImageTransform{.flip_probability = 1.5}.output_shape(rgb)),
                    Contains("flip probability"));
  std::vector<float> small(10);
  CHECK_THROWS_AS(ImageTransform{}.apply(pattern(192), rgb, {}, small), coltrain::InvalidArgument);
}

}  // namespace
