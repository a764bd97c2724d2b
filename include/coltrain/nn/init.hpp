#pragma once
// Parameter initialisation with PyTorch's defaults, so that a coltrain model and its PyTorch twin
// start from the same distributions: Linear and Conv2d weights kaiming_uniform_(a = sqrt(5)), that is
// U(-b, b) with b = 1 / sqrt(fan_in), and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>

#include <cmath>
#include <cstdint>
#include <span>

namespace coltrain::nn {

// SplitMix64: tiny, fast, and the same sequence on every platform (std:: distributions are not).
class Rng {
 public:
  COLTRAIN_HOST_DEVICE explicit Rng(std::uint64_t seed = 0) : state_(seed) {}

  COLTRAIN_HOST_DEVICE std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  COLTRAIN_HOST_DEVICE double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double low, double high) { return low + (high - low) * uniform(); }

 private:
  std::uint64_t state_;
};

// A stateless hash of (seed, a, b, c) to [0, 1): random masks that do not depend on the order in
// which threads visit the elements. Host and device (the GPU dropout draws the CPU's masks with it).
// In two steps for loops over c: hash_key(seed, a, b) once, then hash_bits(key, c), the 53 random
// bits that hash_uniform scales by 2^-53.
COLTRAIN_HOST_DEVICE constexpr std::uint64_t hash_key(std::uint64_t seed, std::uint64_t a,
                                                      std::uint64_t b) {
  return seed ^ (a * 0xD6E8FEB86659FD93ull) ^ (b * 0x9E3779B97F4A7C15ull);
}

COLTRAIN_HOST_DEVICE inline std::uint64_t hash_bits(std::uint64_t key, std::uint64_t c) {
  return Rng(key ^ (c * 0xC2B2AE3D27D4EB4Full)).next() >> 11;
}

COLTRAIN_HOST_DEVICE inline double hash_uniform(std::uint64_t seed, std::uint64_t a,
                                                std::uint64_t b, std::uint64_t c) {
  return static_cast<double>(hash_bits(hash_key(seed, a, b), c)) * 0x1.0p-53;
}

// The smallest 53-bit draw u with u * 2^-53 >= p, for p in [0, 1]: hash_bits(...) >= it decides
// hash_uniform(...) >= p exactly (scaling by a power of two is exact), with no double conversion.
constexpr std::uint64_t uniform_threshold(double p) {
  const double scaled = p * 0x1.0p53;
  const auto below = static_cast<std::uint64_t>(scaled);
  return static_cast<double>(below) < scaled ? below + 1 : below;
}

template <class T>
void fill_uniform(std::span<T> values, double bound, Rng& rng) {
  for (T& v : values) v = static_cast<T>(static_cast<float>(rng.uniform(-bound, bound)));
}

template <>
inline void fill_uniform<double>(std::span<double> values, double bound, Rng& rng) {
  for (double& v : values) v = rng.uniform(-bound, bound);
}

// kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + a^2)) = sqrt(1/3), bound gain * sqrt(3 / fan_in).
template <class T>
void kaiming_uniform_default(std::span<T> weight, std::int64_t fan_in, Rng& rng) {
  fill_uniform(weight, 1.0 / std::sqrt(static_cast<double>(fan_in)), rng);
}

template <class T>
void bias_uniform_default(std::span<T> bias, std::int64_t fan_in, Rng& rng) {
  fill_uniform(bias, 1.0 / std::sqrt(static_cast<double>(fan_in)), rng);
}

}  // namespace coltrain::nn
