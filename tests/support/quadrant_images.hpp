#pragma once
// A tiny classification set for the training tests: four classes of 1 x 6 x 6 images, the bright
// quadrant being the class, on a noisy background. A small network learns it in a few epochs.

#include <coltrain/data/dataset.hpp>
#include <coltrain/nn/init.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace coltrain::testing {

inline data::ImageDataset quadrant_images(std::int64_t count, std::uint64_t seed) {
  const data::ImageShape shape{1, 6, 6};
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(count * shape.size()));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(count));
  nn::Rng rng(seed);
  for (std::int64_t i = 0; i < count; ++i) {
    const auto label = static_cast<std::int32_t>(i % 4);
    labels[static_cast<std::size_t>(i)] = label;
    for (std::int64_t y = 0; y < 6; ++y)
      for (std::int64_t x = 0; x < 6; ++x) {
        const bool bright = (y / 3) * 2 + x / 3 == label;
        pixels[static_cast<std::size_t>(i * 36 + y * 6 + x)] =
            static_cast<std::uint8_t>(rng.uniform(0, 120) + (bright ? 120 : 0));
      }
  }
  return data::ImageDataset(shape, std::move(pixels), std::move(labels), 4);
}

}  // namespace coltrain::testing
