#pragma once
// The data pipeline's random numbers: SplitMix64 streams keyed by (seed, epoch, index), so that a
// shuffle or an augmentation is a pure function of those numbers. A run resumed at epoch e draws
// what it would have drawn, whichever thread prepares the batch. (The same generator as nn::Rng;
// data/ keeps its own so that it does not depend on nn/.)

#include <coltrain/core/config.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace coltrain::data {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}

  // A stream for a key of several numbers: each is mixed in, so (1, 0) and (0, 1) differ.
  template <class... Keys>
  static SplitMix64 keyed(std::uint64_t seed, Keys... keys) {
    std::uint64_t state = seed;
    ((state = SplitMix64(state ^ mix(static_cast<std::uint64_t>(keys))).next()), ...);
    return SplitMix64(state);
  }

  std::uint64_t next() { return mix(state_ += kIncrement); }

  // Uniform in [0, n), n > 0, without modulo bias: draws below 2^64 mod n are drawn again.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t threshold = (0 - n) % n;
    for (;;) {
      const std::uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // Fisher-Yates, from the last element down.
  template <class T>
  void shuffle(std::span<T> items) {
    for (std::size_t i = items.size(); i > 1; --i) {
      const std::size_t j = below(i);
      std::swap(items[i - 1], items[j]);
    }
  }

 private:
  static constexpr std::uint64_t kIncrement = 0x9E3779B97F4A7C15ull;

  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  std::uint64_t state_;
};

}  // namespace coltrain::data
