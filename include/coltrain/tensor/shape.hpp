#pragma once
// Shapes: `Shape` is a tensor's runtime shape (the batch size is known only at run time);
// `StaticShape<Dims...>` is the compile-time shape of one sample, which flows through a network's
// layer types so that a mismatch is a compile error.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

namespace coltrain::tensor {

inline constexpr int kMaxRank = 5;

class Shape {
 public:
  constexpr Shape() = default;
  constexpr Shape(std::initializer_list<std::int64_t> dims) {
    if (dims.size() > static_cast<std::size_t>(kMaxRank))
      throw InvalidArgument("a tensor has at most " + std::to_string(kMaxRank) + " dimensions");
    for (std::int64_t d : dims) push_back(d);
  }
  explicit Shape(std::span<const std::int64_t> dims) {
    if (dims.size() > static_cast<std::size_t>(kMaxRank))
      throw InvalidArgument("a tensor has at most " + std::to_string(kMaxRank) + " dimensions");
    for (std::int64_t d : dims) push_back(d);
  }

  constexpr int rank() const { return rank_; }
  constexpr std::int64_t operator[](int axis) const { return dims_[static_cast<std::size_t>(axis)]; }
  constexpr std::span<const std::int64_t> dims() const {
    return {dims_.data(), static_cast<std::size_t>(rank_)};
  }
  constexpr std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }

  // The shape of one item along the first axis (a sample of a batch).
  constexpr Shape drop_front() const {
    Shape s;
    for (int i = 1; i < rank_; ++i) s.push_back(dims_[static_cast<std::size_t>(i)]);
    return s;
  }
  // This shape with a leading axis of n (a batch of n samples).
  constexpr Shape with_front(std::int64_t n) const {
    if (rank_ == kMaxRank) throw InvalidArgument("a tensor has at most 5 dimensions");
    Shape s;
    s.push_back(n);
    for (int i = 0; i < rank_; ++i) s.push_back(dims_[static_cast<std::size_t>(i)]);
    return s;
  }

  std::string to_string() const {
    std::string text = "[";
    for (int i = 0; i < rank_; ++i) {
      if (i) text += ", ";
      text += std::to_string(dims_[static_cast<std::size_t>(i)]);
    }
    return text + "]";
  }

  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[static_cast<std::size_t>(i)] != b.dims_[static_cast<std::size_t>(i)]) return false;
    return true;
  }

 private:
  constexpr void push_back(std::int64_t d) {
    if (d < 0) throw InvalidArgument("a tensor dimension is negative: " + std::to_string(d));
    dims_[static_cast<std::size_t>(rank_++)] = d;
  }

  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// The compile-time shape of one sample: StaticShape<C, H, W> for images, StaticShape<N> for vectors.
template <std::size_t... Dims>
struct StaticShape {
  static_assert(sizeof...(Dims) >= 1 && sizeof...(Dims) <= kMaxRank - 1,
                "coltrain: a sample has 1 to 4 dimensions");
  static_assert(((Dims > 0) && ...), "coltrain: every dimension of a sample must be positive");
  static constexpr int kRank = static_cast<int>(sizeof...(Dims));
  static constexpr std::size_t kSize = (Dims * ...);
  static constexpr std::array<std::size_t, sizeof...(Dims)> kDims{Dims...};

  // The runtime shape of a batch of n samples.
  static constexpr Shape batch(std::int64_t n) { return {n, static_cast<std::int64_t>(Dims)...}; }
};

template <std::size_t C, std::size_t H, std::size_t W>
using Chw = StaticShape<C, H, W>;
template <std::size_t N>
using Flat = StaticShape<N>;

template <class S>
inline constexpr bool is_static_shape_v = false;
template <std::size_t... Dims>
inline constexpr bool is_static_shape_v<StaticShape<Dims...>> = true;

template <class S>
concept SampleShape = is_static_shape_v<S>;

}  // namespace coltrain::tensor
