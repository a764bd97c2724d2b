#pragma once
// Winograd's minimal filtering F(2x2, 3x3) and F(4x4, 3x3) (Lavin & Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2015) for stride-1 3x3 convolutions whose output height and
// width are multiples of the output tile (2 or 4).
//
// Each Tile x Tile tile of the output comes from an a x a tile of the padded input, a = Tile + 2
// (tiles overlap by two):
//   Y = A^T [(G g G^T) . (B^T d B)] A        (. the element-wise product)
// With the a^2 positions of the transformed tile as the outer index, the element-wise products over
// all channels become a^2 GEMMs, U[pos] [Cout x Cin] * V[pos] [Cin x tiles]: per output and input
// channel 4 multiply-adds for F(2x2) and 2.25 for F(4x4), against 9 for the direct product. The
// input gradient of a stride-1 convolution is itself one (flipped kernel, channels swapped), and
// the weight gradient is the adjoint of the same map:
//   dg = G^T [sum over tiles (A dY A^T) . (B^T d B)] G
// that is a^2 GEMMs dU[pos] [Cout x Cin] = dY'[pos] [Cout x tiles] * V[pos]^T, folded back to 3x3.
// F(2x2)'s coefficients are 0, +-1 and +-1/2, so its rounding stays within a few units in the last
// place of the direct product's; F(4x4)'s reach 8 and 1/24 (points 0, +-1, +-2), which costs about
// one decimal digit in float (measured: docs/benchmarks.md) for 1.8x fewer products and transforms
// that move 2.25 values per input instead of 4.
//
// Layouts: a transformed tensor is [a^2][rows][ld], column `first + ty * kTileCols + tx` for tile
// (ty, tx) of an image placed at column `first`, so that several images share one GEMM. The padded
// input is kept with its columns split by their remainder modulo Tile ("phases"): the a columns of
// every tile in a row of tiles are then contiguous runs, and the transforms are plain vector
// arithmetic.

#include <coltrain/core/config.hpp>
#include <coltrain/tensor/cpu_microkernels.hpp>
#include <coltrain/tensor/vector_pack.hpp>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace coltrain::nn::detail {

// parts[0] ++ ... ++ parts[R - 1]: R packs of N lanes as one pack of R * N, R a power of two.
// One shuffle per pair of parts; nvcc's host code rejects __builtin_shufflevector's indices from a
// pack expansion, so there the pack is built lane by lane (5% slower where measured; only CPU code
// compiled into a .cu file takes that path).
template <class S, int N, int R, class P = tensor::pack_t<S, N>>
COLTRAIN_FORCE_INLINE tensor::pack_t<S, N * R> concatenate(const P* parts) {
  if constexpr (R == 1) {
    return parts[0];
  } else if constexpr (N == 1) {  // scalars (images of one tile each)
    return [&]<int... L>(std::integer_sequence<int, L...>) {
      return tensor::pack_t<S, R>{parts[L]...};
    }
    (std::make_integer_sequence<int, R>{});
  } else {
    const auto low = concatenate<S, N, R / 2>(parts),
               high = concatenate<S, N, R / 2>(parts + R / 2);
    return [&]<int... L>(std::integer_sequence<int, L...>) {
#if defined(__CUDACC__)
      return tensor::pack_t<S, N * R>{(L < N * R / 2 ? low[L] : high[L - N * R / 2])...};
#else
      return __builtin_shufflevector(low, high, L...);
#endif
    }
    (std::make_integer_sequence<int, N * R>{});
  }
}

// Lanes [First, First + N) of wide.
template <class S, int N, int First, class Wide>
COLTRAIN_FORCE_INLINE tensor::pack_t<S, N> extract_lanes(Wide wide) {
  return [&]<int... L>(std::integer_sequence<int, L...>) {
#if defined(__CUDACC__)
    return tensor::pack_t<S, N>{wide[First + L]...};
#else
    return __builtin_shufflevector(wide, wide, (First + L)...);
#endif
  }
  (std::make_integer_sequence<int, N>{});
}

// The inverse of concatenate: parts[q] = lanes [q * N, q * N + N) of wide.
template <class S, int N, int R, class P = tensor::pack_t<S, N>>
COLTRAIN_FORCE_INLINE void split_pack(tensor::pack_t<S, N * R> wide, P (&parts)[R]) {
  if constexpr (R == 1) {
    parts[0] = wide;
  } else {
    [&]<int... Q>(std::integer_sequence<int, Q...>) {
      ((parts[Q] = extract_lanes<S, N, Q * N>(wide)), ...);
    }
    (std::make_integer_sequence<int, R>{});
  }
}

// phase[r][l] = p[Ways * l + r], l < N, for Ways 2 or 4.
template <int Ways, class S, int N, class P = tensor::pack_t<S, N>>
COLTRAIN_FORCE_INLINE void load_phases(const S* p, P (&phase)[Ways]) {
  static_assert(Ways == 2 || Ways == 4);
  if constexpr (Ways == 2) {
    tensor::deinterleave<S, N>(tensor::load_pack<P>(p), tensor::load_pack<P>(p + N), phase[0],
                               phase[1]);
  } else {
    // Even and odd elements of each half, then of the evens and of the odds: 4l, 4l+2 and
    // 4l+1, 4l+3.
    P even_low, odd_low, even_high, odd_high;
    tensor::deinterleave<S, N>(tensor::load_pack<P>(p), tensor::load_pack<P>(p + N), even_low,
                               odd_low);
    tensor::deinterleave<S, N>(tensor::load_pack<P>(p + 2 * N), tensor::load_pack<P>(p + 3 * N),
                               even_high, odd_high);
    tensor::deinterleave<S, N>(even_low, even_high, phase[0], phase[2]);
    tensor::deinterleave<S, N>(odd_low, odd_high, phase[1], phase[3]);
  }
}

// p[Ways * l + r] = phase[r][l]: the inverse of load_phases.
template <int Ways, class S, int N, class P = tensor::pack_t<S, N>>
COLTRAIN_FORCE_INLINE void store_phases(S* p, const P (&phase)[Ways]) {
  static_assert(Ways == 2 || Ways == 4);
  if constexpr (Ways == 2) {
    P low, high;
    tensor::interleave<S, N>(phase[0], phase[1], low, high);
    tensor::store_pack(p, low);
    tensor::store_pack(p + N, high);
  } else {
    P even_low, even_high, odd_low, odd_high, out[4];
    tensor::interleave<S, N>(phase[0], phase[2], even_low, even_high);
    tensor::interleave<S, N>(phase[1], phase[3], odd_low, odd_high);
    tensor::interleave<S, N>(even_low, odd_low, out[0], out[1]);
    tensor::interleave<S, N>(even_high, odd_high, out[2], out[3]);
    for (int i = 0; i < 4; ++i) tensor::store_pack(p + i * N, out[i]);
  }
}

// The one-dimensional transforms of F(Tile, 3), on packs or scalars V; the two-dimensional ones
// apply them to the rows, then to the columns.
template <int Tile>
struct WinogradMatrices;

template <>
struct WinogradMatrices<2> {
  // B^T's rows: (1 0 -1 0), (0 1 1 0), (0 -1 1 0), (0 1 0 -1).
  template <class S, class V>
  COLTRAIN_FORCE_INLINE static void input(const V (&d)[4], V (&o)[4]) {
    o[0] = d[0] - d[2];
    o[1] = d[1] + d[2];
    o[2] = d[2] - d[1];
    o[3] = d[1] - d[3];
  }
  // A^T's rows: (1 1 1 0), (0 1 -1 -1).
  template <class S, class V>
  COLTRAIN_FORCE_INLINE static void output(const V (&m)[4], V (&y)[2]) {
    y[0] = m[0] + m[1] + m[2];
    y[1] = m[1] - m[2] - m[3];
  }
  // A's rows, the adjoint: (1 0), (1 1), (1 -1), (0 -1).
  template <class S, class V>
  COLTRAIN_FORCE_INLINE static void output_adjoint(const V (&g)[2], V (&e)[4]) {
    e[0] = g[0];
    e[1] = g[0] + g[1];
    e[2] = g[0] - g[1];
    e[3] = -g[1];
  }
  // G's rows: (1 0 0), (1/2 1/2 1/2), (1/2 -1/2 1/2), (0 0 1).
  template <class S, class V>
  COLTRAIN_FORCE_INLINE static void kernel(const V (&g)[3], V (&u)[4]) {
    u[0] = g[0];
    u[1] = S(0.5) * (g[0] + g[1] + g[2]);
    u[2] = S(0.5) * (g[0] - g[1] + g[2]);
    u[3] = g[2];
  }
  // G^T's rows: (1 1/2 1/2 0), (0 1/2 -1/2 0), (0 1/2 1/2 1).
  template <class S, class V>
  COLTRAIN_FORCE_INLINE static void kernel_adjoint(const V (&x)[4], V (&g)[3]) {
    g[0] = x[0] + S(0.5) * (x[1] + x[2]);
    g[1] = S(0.5) * (x[1] - x[2]);
    g[2] = S(0.5) * (x[1] + x[2]) + x[3];
  }
};

template <>
struct WinogradMatrices<4> {
  // B^T's rows: (4 0 -5 0 1 0), (0 -4 -4 1 1 0), (0 4 -4 -1 1 0), (0 -2 -1 2 1 0),
  // (0 2 -1 -2 1 0), (0 4 0 -5 0 1).
  template <class S, class V>
  COLTRAIN_FORCE_INLINE static void input(const V (&d)[6], V (&o)[6]) {
    const V four_apart = d[4] - S(4) * d[2], four_odd = d[3] - S(4) * d[1];
    const V two_apart = d[4] - d[2], two_odd = S(2) * (d[3] - d[1]);
    o[0] = S(4) * d[0] - S(5) * d[2] + d[4];
    o[1] = four_apart + four_odd;
    o[2] = four_apart - four_odd;
    o[3] = two_apart + two_odd;
    o[4] = two_apart - two_odd;
    o[5] = S(4) * d[1] - S(5) * d[3] + d[5];
  }
  // A^T's rows: (1 1 1 1 1 0), (0 1 -1 2 -2 0), (0 1 1 4 4 0), (0 1 -1 8 -8 1).
  template <class S, class V>
  COLTRAIN_FORCE_INLINE static void output(const V (&m)[6], V (&y)[4]) {
    const V sum12 = m[1] + m[2], difference12 = m[1] - m[2];
    const V sum34 = m[3] + m[4], difference34 = m[3] - m[4];
    y[0] = m[0] + sum12 + sum34;
    y[1] = difference12 + S(2) * difference34;
    y[2] = sum12 + S(4) * sum34;
    y[3] = difference12 + S(8) * difference34 + m[5];
  }
  // A's rows, the adjoint: (1 0 0 0), (1 1 1 1), (1 -1 1 -1), (1 2 4 8), (1 -2 4 -8), (0 0 0 1).
  template <class S, class V>
  COLTRAIN_FORCE_INLINE static void output_adjoint(const V (&g)[4], V (&e)[6]) {
    const V even = g[0] + g[2], odd = g[1] + g[3];
    const V even_scaled = g[0] + S(4) * g[2], odd_scaled = S(2) * g[1] + S(8) * g[3];
    e[0] = g[0];
    e[1] = even + odd;
    e[2] = even - odd;
    e[3] = even_scaled + odd_scaled;
    e[4] = even_scaled - odd_scaled;
    e[5] = g[3];
  }
  // G's rows: (1/4 0 0), (-1/6 -1/6 -1/6), (-1/6 1/6 -1/6), (1/24 1/12 1/6), (1/24 -1/12 1/6),
  // (0 0 1).
  template <class S, class V>
  COLTRAIN_FORCE_INLINE static void kernel(const V (&g)[3], V (&u)[6]) {
    const V outer = g[0] + g[2], weighted = S(1.0 / 24) * g[0] + S(1.0 / 6) * g[2];
    const V middle = S(1.0 / 12) * g[1];
    u[0] = S(0.25) * g[0];
    u[1] = S(-1.0 / 6) * (outer + g[1]);
    u[2] = S(-1.0 / 6) * (outer - g[1]);
    u[3] = weighted + middle;
    u[4] = weighted - middle;
    u[5] = g[2];
  }
  // G^T's rows: (1/4 -1/6 -1/6 1/24 1/24 0), (0 -1/6 1/6 1/12 -1/12 0), (0 -1/6 -1/6 1/6 1/6 1).
  template <class S, class V>
  COLTRAIN_FORCE_INLINE static void kernel_adjoint(const V (&x)[6], V (&g)[3]) {
    const V sum12 = x[1] + x[2], sum34 = x[3] + x[4];
    g[0] = S(0.25) * x[0] - S(1.0 / 6) * sum12 + S(1.0 / 24) * sum34;
    g[1] = S(1.0 / 6) * (x[2] - x[1]) + S(1.0 / 12) * (x[3] - x[4]);
    g[2] = S(1.0 / 6) * (sum34 - sum12) + x[5];
  }
};

// Elements from one position's [rows][ld] matrix to the next: one 64-byte line more than the
// matrix, so that the positions of a tile, written or read together, fall in different L1 sets
// (with a stride that is a multiple of 4 KiB they share one set and evict each other: 2.5x slower).
constexpr std::int64_t winograd_position_stride(std::int64_t rows, std::int64_t ld) {
  return rows * ld + 16;
}

// Images per group of products: about 256 KiB of transformed group (positions x channels x columns,
// float), within 64 to 256 columns of tiles. ResNet-20's step measured 3% faster with that bound
// than with twice or half of it for F(2x2); F(4x4)'s 64 x 64 stage (4 tiles an image) ran 15%
// faster with 56 columns than with 28, its 16 x 16 stage 8% slower with 192 than with 64
// (winograd_bench). `channels` is the larger of the two sides.
constexpr std::int64_t winograd_group_images(std::int64_t channels, std::int64_t tiles_per_image,
                                             std::int64_t positions) {
  const std::int64_t columns = std::clamp<std::int64_t>(65536 / (positions * channels), 64, 256);
  return std::max<std::int64_t>(1, columns / tiles_per_image);
}

template <int Tile, std::int64_t Channels, std::int64_t Height, std::int64_t Width,
          std::int64_t Padding>
struct WinogradConvolution {
  static_assert(Tile == 2 || Tile == 4);
  using Matrices = WinogradMatrices<Tile>;
  static constexpr int kAlpha = Tile + 2;  // input tile side
  static constexpr std::int64_t kPositions = kAlpha * kAlpha;
  static constexpr std::int64_t kOutHeight = Height + 2 * Padding - 2;
  static constexpr std::int64_t kOutWidth = Width + 2 * Padding - 2;
  static constexpr bool kApplicable = kOutHeight > 0 && kOutWidth > 0 && kOutHeight % Tile == 0 &&
                                      kOutWidth % Tile == 0 && Width % Tile == 0;
  static constexpr std::int64_t kTileRows = kOutHeight / Tile, kTileCols = kOutWidth / Tile;
  static constexpr std::int64_t kTiles = kTileRows * kTileCols;  // per image
  static constexpr std::int64_t kPaddedHeight = kOutHeight + 2;
  // Padded column Tile * i + r is element i of phase r; a row is Tile phases of kPhaseWidth.
  static constexpr std::int64_t kPhaseWidth = kTileCols + 1;
  static constexpr std::int64_t kSplitRow = Tile * kPhaseWidth;
  // Elements of a split padded image.
  static constexpr std::int64_t kSplitSize = Channels * kPaddedHeight * kSplitRow;

  // Rows of tiles the transforms handle in one pack. Where a pack holds a whole row of tiles, the
  // transformed columns of consecutive rows are contiguous, so R rows fill the target's widest pack
  // instead of leaving part of every operation idle: two rows of 2 lanes took ResNet-20's step
  // from 627 to 671 images/s (medians of 10 rounds, 2026-11-28), and filling 16 lanes on the
  // input side (the input and output-gradient transforms) another 2.5% (2026-12-03). The output
  // transform writes rows of the image, which must be split again into packs of kTileCols
  // lanes: there only the 2-lane case gains.
  template <class S>
  static constexpr int rows_per_pack() {
    constexpr int n = tensor::pack_lanes<S>(kTileCols);
    int rows = 1;
    if (n > 1 && n == kTileCols)
      while (2 * rows * n <= tensor::widest_pack_lanes<S>() && kTileRows % (2 * rows) == 0)
        rows *= 2;
    return rows;
  }
  template <class S>
  static constexpr int output_rows_per_pack() {
    return kTileCols == 2 ? rows_per_pack<S>() : 1;
  }
  // Images the input-side transforms handle in one pack: where a pack holds all of an image's
  // tiles (8 x 8 maps under F(4x4): 4 tiles), the next images' tiles follow in the group's columns,
  // so up to the widest pack's worth of images are transformed together.
  template <class S>
  static constexpr int images_per_pack() {
    constexpr int tiles = tensor::pack_lanes<S>(kTileCols) * rows_per_pack<S>();
    int images = 1;
    if (tiles == kTiles)
      while (2 * images * tiles <= tensor::widest_pack_lanes<S>()) images *= 2;
    return images;
  }

  // The padded image (a zero border of `Padding`) with its columns split into phases. The border
  // is never written: the owner zeroes the buffer once.
  template <class S>
  static void split_image(const S* COLTRAIN_RESTRICT image, S* COLTRAIN_RESTRICT split) {
    constexpr int N = tensor::pack_lanes<S>(Width / Tile);
    using P = tensor::pack_t<S, N>;
    for (std::int64_t c = 0; c < Channels; ++c)
      for (std::int64_t h = 0; h < Height; ++h) {
        const S* src = image + (c * Height + h) * Width;
        S* row = split + (c * kPaddedHeight + h + Padding) * kSplitRow;
        for (std::int64_t i = 0; i < Width / Tile; i += N) {
          // Image column Tile * (i + l) + r is padded column Tile * (i + l) + r + Padding.
          P phase[Tile];
          load_phases<Tile, S, N>(src + Tile * i, phase);
          for (int r = 0; r < Tile; ++r)
            tensor::store_pack(row + (r + Padding) % Tile * kPhaseWidth + i + (r + Padding) / Tile,
                               phase[r]);
        }
      }
  }

  // split_image, then transform_input, for Images images [Channels][Height][Width] one after
  // another, through `split`, room for Images split images.
  template <class S, int Images = 1>
  static void transform_input_images(const S* images, S* split, S* v, std::int64_t ld,
                                     std::int64_t first) {
    for (int i = 0; i < Images; ++i)
      split_image(images + i * Channels * Height * Width, split + i * kSplitSize);
    transform_input<S, Images>(split, v, ld, first);
  }

  // v[pos][c][first + tile] = (B^T d B)[pos] for every tile d of the split image, or of Images
  // split images kSplitSize apart (placed one after another from column `first`).
  template <class S, int Images = 1>
  static void transform_input(const S* COLTRAIN_RESTRICT split, S* COLTRAIN_RESTRICT v,
                              std::int64_t ld, std::int64_t first) {
    constexpr int N = tensor::pack_lanes<S>(kTileCols), R = rows_per_pack<S>();
    static_assert(Images == 1 || N * R == kTiles, "transform_input: images join whole");
    using P = tensor::pack_t<S, N>;
    using Wide = tensor::pack_t<S, N * R * Images>;  // R rows of tiles of each image, contiguous
    const std::int64_t position_stride = winograd_position_stride(Channels, ld);
    for (std::int64_t c = 0; c < Channels; ++c)
      for (std::int64_t ty = 0; ty < kTileRows; ty += R) {
        const S* rows = split + (c * kPaddedHeight + Tile * ty) * kSplitRow;
        S* out = v + c * ld + first + ty * kTileCols;
        for (std::int64_t tx = 0; tx < kTileCols; tx += N) {
          Wide t[kAlpha][kAlpha];  // d B, row by row
          for (int r = 0; r < kAlpha; ++r) {
            Wide d[kAlpha];
            for (int col = 0; col < kAlpha; ++col) {
              P parts[Images * R];  // image by image, row of tiles by row
              for (int q = 0; q < Images * R; ++q)
                parts[q] = tensor::load_pack<P>(rows + q / R * kSplitSize +
                                                (Tile * (q % R) + r) * kSplitRow +
                                                col % Tile * kPhaseWidth + tx + col / Tile);
              d[col] = concatenate<S, N, Images * R>(parts);
            }
            Matrices::template input<S>(d, t[r]);
          }
          for (int j = 0; j < kAlpha; ++j) {
            Wide column[kAlpha], o[kAlpha];
            for (int r = 0; r < kAlpha; ++r) column[r] = t[r][j];
            Matrices::template input<S>(column, o);
            for (int i = 0; i < kAlpha; ++i)
              tensor::store_pack(out + (i * kAlpha + j) * position_stride + tx, o[i]);
          }
        }
      }
  }

  // out[k] = A^T m A for every tile (+ bias[k] when given, then the ReLU when Relu), from
  // m[pos][k][first + tile], k < out_channels; out is [out_channels][kOutHeight][kOutWidth].
  template <bool Relu, class S>
  static void transform_output(std::int64_t out_channels, const S* COLTRAIN_RESTRICT m,
                               std::int64_t ld, std::int64_t first, S* COLTRAIN_RESTRICT out,
                               const S* bias) {
    constexpr int N = tensor::pack_lanes<S>(kTileCols), R = output_rows_per_pack<S>();
    using P = tensor::pack_t<S, N>;
    using Wide = tensor::pack_t<S, N * R>;  // R rows of tiles, contiguous in m
    const std::int64_t position_stride = winograd_position_stride(out_channels, ld);
    for (std::int64_t k = 0; k < out_channels; ++k) {
      const Wide shift = Wide{} + (bias ? bias[k] : S(0));
      for (std::int64_t ty = 0; ty < kTileRows; ty += R) {
        const S* in = m + k * ld + first + ty * kTileCols;
        S* top = out + (k * kOutHeight + Tile * ty) * kOutWidth;
        for (std::int64_t tx = 0; tx < kTileCols; tx += N) {
          // A^T m column by column, then each output row from it, stored at once: R rows of
          // tiles held as 16 R packs at the end would spill.
          Wide t[Tile][kAlpha];
          for (int j = 0; j < kAlpha; ++j) {
            Wide column[kAlpha], o[Tile];
            for (int r = 0; r < kAlpha; ++r)
              column[r] = tensor::load_pack<Wide>(in + (r * kAlpha + j) * position_stride + tx);
            Matrices::template output<S>(column, o);
            for (int i = 0; i < Tile; ++i) t[i][j] = o[i];
          }
          for (int i = 0; i < Tile; ++i) {
            Wide o[Tile];
            Matrices::template output<S>(t[i], o);
            P y[R][Tile];  // y[q][j]: output row i of tile row ty + q, column j
            for (int j = 0; j < Tile; ++j) {
              Wide value = o[j] + shift;
              if constexpr (Relu) value = tensor::relu_pack(value);
              P parts[R];
              split_pack<S, N, R>(value, parts);
              for (int q = 0; q < R; ++q) y[q][j] = parts[q];
            }
            for (int q = 0; q < R; ++q)
              store_phases<Tile, S, N>(top + (Tile * q + i) * kOutWidth + Tile * tx, y[q]);
          }
        }
      }
    }
  }

  // d[pos][k][first + tile] = (A dy A^T)[pos] for every Tile x Tile tile dy of the output gradient
  // [out_channels][kOutHeight][kOutWidth], or of Images such gradients one after another: the
  // adjoint of transform_output.
  template <class S, int Images = 1>
  static void transform_output_gradient(std::int64_t out_channels, const S* COLTRAIN_RESTRICT dy,
                                        S* COLTRAIN_RESTRICT d, std::int64_t ld,
                                        std::int64_t first) {
    constexpr int N = tensor::pack_lanes<S>(kTileCols), R = rows_per_pack<S>();
    static_assert(Images == 1 || N * R == kTiles, "transform_output_gradient: images join whole");
    using P = tensor::pack_t<S, N>;
    using Wide = tensor::pack_t<S, N * R * Images>;  // R rows of tiles of each image, contiguous
    const std::int64_t position_stride = winograd_position_stride(out_channels, ld);
    const std::int64_t image_stride = out_channels * kOutHeight * kOutWidth;
    for (std::int64_t k = 0; k < out_channels; ++k)
      for (std::int64_t ty = 0; ty < kTileRows; ty += R) {
        const S* top = dy + (k * kOutHeight + Tile * ty) * kOutWidth;
        S* out = d + k * ld + first + ty * kTileCols;
        for (std::int64_t tx = 0; tx < kTileCols; tx += N) {
          // dy A^T row by row as the rows are loaded, then A times each of its columns.
          Wide e[Tile][kAlpha];
          for (int i = 0; i < Tile; ++i) {
            P rows[Images * R][Tile];  // rows[q][j]: row i of image q / R's tile row ty + q % R
            for (int q = 0; q < Images * R; ++q)
              load_phases<Tile, S, N>(
                  top + q / R * image_stride + (Tile * (q % R) + i) * kOutWidth + Tile * tx,
                  rows[q]);
            Wide g[Tile];
            for (int j = 0; j < Tile; ++j) {
              P parts[Images * R];
              for (int q = 0; q < Images * R; ++q) parts[q] = rows[q][j];
              g[j] = concatenate<S, N, Images * R>(parts);
            }
            Matrices::template output_adjoint<S>(g, e[i]);
          }
          for (int j = 0; j < kAlpha; ++j) {
            Wide column[Tile], o[kAlpha];
            for (int i = 0; i < Tile; ++i) column[i] = e[i][j];
            Matrices::template output_adjoint<S>(column, o);
            for (int r = 0; r < kAlpha; ++r)
              tensor::store_pack(out + (r * kAlpha + j) * position_stride + tx, o[r]);
          }
        }
      }
  }
};

// Rows [row_begin, row_end) of u[pos][k][c] = (G g G^T)[pos], u being rows x columns per position,
// for the 3x3 kernels g = weights[k][c] ([rows][columns][3][3]) or, when Flipped, the kernels of
// the input-gradient convolution: weights[c][k] ([columns][rows][3][3]) turned by 180 degrees.
// A pack of consecutive columns at a time, so that each of the 16 or 36 positions gets whole
// vectors: one float per position matrix, megabytes apart, was a cache miss per store.
template <int Tile, bool Flipped = false, class S>
void winograd_transform_weights(std::int64_t rows, std::int64_t columns, std::int64_t row_begin,
                                std::int64_t row_end, const S* COLTRAIN_RESTRICT weights,
                                S* COLTRAIN_RESTRICT u) {
  using Matrices = WinogradMatrices<Tile>;
  constexpr int kAlpha = Tile + 2, kWide = tensor::widest_pack_lanes<S>();
  const std::int64_t position_stride = rows * columns;
  const auto transform = [&]<int N>(std::int64_t k, std::int64_t c) {
    using P = tensor::pack_t<S, N>;
    S lanes[9][N];  // the N kernels' taps, tap by tap
    for (int l = 0; l < N; ++l) {
      const S* kernel = weights + (Flipped ? (c + l) * rows + k : k * columns + c + l) * 9;
      for (int tap = 0; tap < 9; ++tap) lanes[tap][l] = kernel[Flipped ? 8 - tap : tap];
    }
    P g[9];
    for (int tap = 0; tap < 9; ++tap) g[tap] = tensor::load_pack<P>(lanes[tap]);
    P t[kAlpha][3];  // G g, column by column
    for (int l = 0; l < 3; ++l) {
      const P column[3] = {g[l], g[3 + l], g[6 + l]};
      P o[kAlpha];
      Matrices::template kernel<S>(column, o);
      for (int i = 0; i < kAlpha; ++i) t[i][l] = o[i];
    }
    S* out = u + k * columns + c;
    for (int i = 0; i < kAlpha; ++i) {
      P o[kAlpha];
      Matrices::template kernel<S>(t[i], o);
      for (int j = 0; j < kAlpha; ++j)
        tensor::store_pack(out + (i * kAlpha + j) * position_stride, o[j]);
    }
  };
  // The leftover columns counted in an int below kWide: g++ -O3 could not bound a loop that
  // continued the packed one, and warned of overflow at an impossible iteration.
  const std::int64_t packed = columns / kWide * kWide;
  const int leftover = static_cast<int>(columns % kWide);
  for (std::int64_t k = row_begin; k < row_end; ++k) {
    for (std::int64_t c = 0; c < packed; c += kWide) transform.template operator()<kWide>(k, c);
    for (int l = 0; l < leftover; ++l) transform.template operator()<1>(k, packed + l);
  }
}

// The products of a transformed batch of tiles: m[pos] [out_channels x columns] =
// u[pos] [out_channels x in_channels] * v[pos] [in_channels x columns]; v and m as above, ld apart.
template <class S>
void winograd_multiply(std::int64_t positions, std::int64_t out_channels, std::int64_t in_channels,
                       std::int64_t columns, const S* u, const S* v, S* m, std::int64_t ld) {
  for (std::int64_t pos = 0; pos < positions; ++pos)
    tensor::gemm_nn_small_m(out_channels, columns, in_channels,
                            u + pos * out_channels * in_channels, in_channels,
                            v + pos * winograd_position_stride(in_channels, ld), ld,
                            m + pos * winograd_position_stride(out_channels, ld), ld, false);
}

// The transformed weight gradient of a batch of tiles, into du (or added to it when accumulate):
// du[pos] [out_channels x in_channels] (=|+=) d[pos] [out_channels x columns] * v[pos]^T, with d
// from transform_output_gradient and v from transform_input.
template <class S>
void winograd_add_weight_gradient(std::int64_t positions, std::int64_t out_channels,
                                  std::int64_t in_channels, std::int64_t columns, const S* d,
                                  const S* v, std::int64_t ld, S* du, bool accumulate) {
  for (std::int64_t pos = 0; pos < positions; ++pos)
    tensor::gemm_nt_long_k(out_channels, in_channels, columns,
                           d + pos * winograd_position_stride(out_channels, ld), ld,
                           v + pos * winograd_position_stride(in_channels, ld), ld,
                           du + pos * out_channels * in_channels, in_channels, accumulate);
}

// grad[k][c] += G^T du[pos][k][c] G for every kernel (out_channels x in_channels x 3 x 3): the
// adjoint of winograd_transform_weights, and like it a pack of consecutive kernels at a time.
template <int Tile, class S>
void winograd_fold_weight_gradient(std::int64_t out_channels, std::int64_t in_channels,
                                   const S* COLTRAIN_RESTRICT du, S* COLTRAIN_RESTRICT grad) {
  using Matrices = WinogradMatrices<Tile>;
  constexpr int kAlpha = Tile + 2, kWide = tensor::widest_pack_lanes<S>();
  const std::int64_t position_stride = out_channels * in_channels;
  const auto fold = [&]<int N>(std::int64_t kc) {
    using P = tensor::pack_t<S, N>;
    P t[3][kAlpha];  // G^T x, column by column
    for (int j = 0; j < kAlpha; ++j) {
      P column[kAlpha], o[3];
      for (int i = 0; i < kAlpha; ++i)
        column[i] = tensor::load_pack<P>(du + (i * kAlpha + j) * position_stride + kc);
      Matrices::template kernel_adjoint<S>(column, o);
      for (int a = 0; a < 3; ++a) t[a][j] = o[a];
    }
    S lanes[9][N];  // the N kernels' gradients, tap by tap
    for (int a = 0; a < 3; ++a) {
      P o[3];
      Matrices::template kernel_adjoint<S>(t[a], o);
      for (int b = 0; b < 3; ++b) tensor::store_pack(lanes[a * 3 + b], o[b]);
    }
    for (int l = 0; l < N; ++l)
      for (int tap = 0; tap < 9; ++tap) grad[(kc + l) * 9 + tap] += lanes[tap][l];
  };
  const std::int64_t packed = position_stride / kWide * kWide;  // as in the transform
  const int leftover = static_cast<int>(position_stride % kWide);
  for (std::int64_t kc = 0; kc < packed; kc += kWide) fold.template operator()<kWide>(kc);
  for (int l = 0; l < leftover; ++l) fold.template operator()<1>(packed + l);
}

}  // namespace coltrain::nn::detail
