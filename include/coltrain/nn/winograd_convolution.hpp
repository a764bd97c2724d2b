#pragma once
// Winograd's minimal filtering F(2x2, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural
// Networks", 2015) for stride-1 3x3 convolutions whose output has even height and width.
//
// Each 2x2 tile of the output comes from a 4x4 tile of the padded input (tiles overlap by two):
//   Y = A^T [(G g G^T) . (B^T d B)] A        (. the element-wise product)
// With the 16 positions of the transformed tile as the outer index, the element-wise products over
// all channels become 16 GEMMs, U[pos] [Cout x Cin] * V[pos] [Cin x tiles]: 16 multiply-adds per 4
// outputs and input channel instead of 36, 2.25x fewer. The input gradient of a stride-1
// convolution is itself one (flipped kernel, channels swapped), and the weight gradient is the
// adjoint of the same map:
//   dg = G^T [sum over tiles (A dY A^T) . (B^T d B)] G
// that is 16 GEMMs dU[pos] [Cout x Cin] = dY'[pos] [Cout x tiles] * V[pos]^T, folded back to 3x3.
// The transforms' coefficients are 0, +-1 and +-1/2, so the rounding stays close to the direct
// product's (within a few units in the last place at these depths).
//
// Layouts: a transformed tensor is [16][rows][ld], column `first + ty * kTileCols + tx` for tile
// (ty, tx) of an image placed at column `first`, so that several images share one GEMM. The padded
// input is kept with its even and odd columns apart ("split"): the four columns of every tile in a
// row of tiles are then four contiguous runs, and the transforms are plain vector arithmetic.

#include <coltrain/core/config.hpp>
#include <coltrain/tensor/cpu_microkernels.hpp>
#include <coltrain/tensor/vector_pack.hpp>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace coltrain::nn::detail {

// even[l] = p[2l], odd[l] = p[2l + 1], l < N.
template <class S, int N, class P = tensor::pack_t<S, N>>
COLTRAIN_FORCE_INLINE void load_deinterleaved(const S* p, P& even, P& odd) {
  if constexpr (N == 1) {
    even = p[0];
    odd = p[1];
  } else {
    const P low = tensor::load_pack<P>(p), high = tensor::load_pack<P>(p + N);
    [&]<int... L>(std::integer_sequence<int, L...>) {
#if defined(__clang__)
      even = __builtin_shufflevector(low, high, (2 * L)...);
      odd = __builtin_shufflevector(low, high, (2 * L + 1)...);
#else
      using Indices = typename tensor::Pack<S, N>::Indices;
      even = __builtin_shuffle(low, high, Indices{(2 * L)...});
      odd = __builtin_shuffle(low, high, Indices{(2 * L + 1)...});
#endif
    }
    (std::make_integer_sequence<int, N>{});
  }
}

// p[2l] = even[l], p[2l + 1] = odd[l], l < N.
template <class S, int N, class P = tensor::pack_t<S, N>>
COLTRAIN_FORCE_INLINE void store_interleaved(S* p, P even, P odd) {
  if constexpr (N == 1) {
    p[0] = even;
    p[1] = odd;
  } else {
    // Lane o of the result is lane o/2 of even (o even) or of odd (o odd), from the low half of
    // the tiles for the first vector and the high half for the second.
    [&]<int... L>(std::integer_sequence<int, L...>) {
#if defined(__clang__)
      tensor::store_pack(p, P(__builtin_shufflevector(even, odd, (L / 2 + (L % 2) * N)...)));
      tensor::store_pack(p + N,
                         P(__builtin_shufflevector(even, odd, (L / 2 + N / 2 + (L % 2) * N)...)));
#else
      using Indices = typename tensor::Pack<S, N>::Indices;
      tensor::store_pack(p, __builtin_shuffle(even, odd, Indices{(L / 2 + (L % 2) * N)...}));
      tensor::store_pack(p + N,
                         __builtin_shuffle(even, odd, Indices{(L / 2 + N / 2 + (L % 2) * N)...}));
#endif
    }
    (std::make_integer_sequence<int, N>{});
  }
}

// Elements from one position's [rows][ld] matrix to the next: one 64-byte line more than the
// matrix, so that the 16 positions of a tile, written or read together, fall in different L1 sets
// (with a stride that is a multiple of 4 KiB they share one set and evict each other: 2.5x slower).
constexpr std::int64_t winograd_position_stride(std::int64_t rows, std::int64_t ld) {
  return rows * ld + 16;
}

// Images per group of products: up to 256 columns of tiles, fewer where a transformed group (16
// positions x channels x columns, float) would pass 256 KiB; ResNet-20's step measured 3% faster
// with that bound than with twice or half of it. `channels` is the larger of the two sides.
constexpr std::int64_t winograd_group_images(std::int64_t channels, std::int64_t tiles_per_image) {
  const std::int64_t columns = std::min<std::int64_t>(256, 4096 / channels);
  return std::max<std::int64_t>(1, columns / tiles_per_image);
}

template <std::int64_t Channels, std::int64_t Height, std::int64_t Width, std::int64_t Padding>
struct WinogradConvolution {
  static constexpr std::int64_t kOutHeight = Height + 2 * Padding - 2;
  static constexpr std::int64_t kOutWidth = Width + 2 * Padding - 2;
  static constexpr bool kApplicable = kOutHeight > 0 && kOutWidth > 0 && kOutHeight % 2 == 0 &&
                                      kOutWidth % 2 == 0 && Width % 2 == 0;
  static constexpr std::int64_t kTileRows = kOutHeight / 2, kTileCols = kOutWidth / 2;
  static constexpr std::int64_t kTiles = kTileRows * kTileCols;  // per image
  static constexpr std::int64_t kPaddedHeight = kOutHeight + 2, kPaddedWidth = kOutWidth + 2;
  static constexpr std::int64_t kHalfWidth = kPaddedWidth / 2;
  // Elements of a split padded image.
  static constexpr std::int64_t kSplitSize = Channels * kPaddedHeight * kPaddedWidth;

  // split[c][row][0][i] = padded[c][row][2i], split[c][row][1][i] = padded[c][row][2i + 1], where
  // padded is the image with a zero border of `Padding`. The border is never written: the owner
  // zeroes the buffer once.
  template <class S>
  static void split_image(const S* COLTRAIN_RESTRICT image, S* COLTRAIN_RESTRICT split) {
    constexpr int N = tensor::pack_lanes<S>(Width / 2);
    using P = tensor::pack_t<S, N>;
    // Image column 2i lands on padded column 2i + Padding: in the even half when Padding is even.
    constexpr std::int64_t kFirst = Padding % 2 == 0 ? 0 : 1, kSecond = 1 - kFirst;
    constexpr std::int64_t kFirstShift = Padding / 2, kSecondShift = (Padding + 1) / 2;
    for (std::int64_t c = 0; c < Channels; ++c)
      for (std::int64_t h = 0; h < Height; ++h) {
        const S* src = image + (c * Height + h) * Width;
        S* row = split + (c * kPaddedHeight + h + Padding) * kPaddedWidth;
        S* first = row + kFirst * kHalfWidth + kFirstShift;
        S* second = row + kSecond * kHalfWidth + kSecondShift;
        for (std::int64_t i = 0; i < Width / 2; i += N) {
          P even, odd;
          load_deinterleaved<S, N>(src + 2 * i, even, odd);
          tensor::store_pack(first + i, even);
          tensor::store_pack(second + i, odd);
        }
      }
  }

  // v[pos][c][first + tile] = (B^T d B)[pos] for every tile d of the split image.
  template <class S>
  static void transform_input(const S* COLTRAIN_RESTRICT split, S* COLTRAIN_RESTRICT v,
                              std::int64_t ld, std::int64_t first) {
    constexpr int N = tensor::pack_lanes<S>(kTileCols);
    using P = tensor::pack_t<S, N>;
    const std::int64_t position_stride = winograd_position_stride(Channels, ld);
    for (std::int64_t c = 0; c < Channels; ++c)
      for (std::int64_t ty = 0; ty < kTileRows; ++ty) {
        const S* rows = split + (c * kPaddedHeight + 2 * ty) * kPaddedWidth;
        S* out = v + c * ld + first + ty * kTileCols;
        for (std::int64_t tx = 0; tx < kTileCols; tx += N) {
          // t = d B, row by row: B^T's rows are (1 0 -1 0), (0 1 1 0), (0 -1 1 0), (0 1 0 -1).
          P t[4][4];
          for (int r = 0; r < 4; ++r) {
            const S* even = rows + r * kPaddedWidth + tx;
            const S* odd = even + kHalfWidth;
            const P d0 = tensor::load_pack<P>(even), d1 = tensor::load_pack<P>(odd);
            const P d2 = tensor::load_pack<P>(even + 1), d3 = tensor::load_pack<P>(odd + 1);
            t[r][0] = d0 - d2;
            t[r][1] = d1 + d2;
            t[r][2] = d2 - d1;
            t[r][3] = d1 - d3;
          }
          for (int j = 0; j < 4; ++j) {
            tensor::store_pack(out + (0 * 4 + j) * position_stride + tx, t[0][j] - t[2][j]);
            tensor::store_pack(out + (1 * 4 + j) * position_stride + tx, t[1][j] + t[2][j]);
            tensor::store_pack(out + (2 * 4 + j) * position_stride + tx, t[2][j] - t[1][j]);
            tensor::store_pack(out + (3 * 4 + j) * position_stride + tx, t[1][j] - t[3][j]);
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
    constexpr int N = tensor::pack_lanes<S>(kTileCols);
    using P = tensor::pack_t<S, N>;
    const std::int64_t position_stride = winograd_position_stride(out_channels, ld);
    for (std::int64_t k = 0; k < out_channels; ++k) {
      const P shift = P{} + (bias ? bias[k] : S(0));
      for (std::int64_t ty = 0; ty < kTileRows; ++ty) {
        const S* in = m + k * ld + first + ty * kTileCols;
        S* top = out + (k * kOutHeight + 2 * ty) * kOutWidth;
        S* bottom = top + kOutWidth;
        for (std::int64_t tx = 0; tx < kTileCols; tx += N) {
          // s = m A, row by row: A^T's rows are (1 1 1 0) and (0 1 -1 -1).
          P s[4][2];
          for (int r = 0; r < 4; ++r) {
            const P m0 = tensor::load_pack<P>(in + (r * 4 + 0) * position_stride + tx);
            const P m1 = tensor::load_pack<P>(in + (r * 4 + 1) * position_stride + tx);
            const P m2 = tensor::load_pack<P>(in + (r * 4 + 2) * position_stride + tx);
            const P m3 = tensor::load_pack<P>(in + (r * 4 + 3) * position_stride + tx);
            s[r][0] = m0 + m1 + m2;
            s[r][1] = m1 - m2 - m3;
          }
          P y[2][2];
          for (int j = 0; j < 2; ++j) {
            y[0][j] = s[0][j] + s[1][j] + s[2][j] + shift;
            y[1][j] = s[1][j] - s[2][j] - s[3][j] + shift;
            if constexpr (Relu) {
              y[0][j] = tensor::relu_pack(y[0][j]);
              y[1][j] = tensor::relu_pack(y[1][j]);
            }
          }
          store_interleaved<S, N>(top + 2 * tx, y[0][0], y[0][1]);
          store_interleaved<S, N>(bottom + 2 * tx, y[1][0], y[1][1]);
        }
      }
    }
  }

  // d[pos][k][first + tile] = (A dy A^T)[pos] for every 2x2 tile dy of the output gradient
  // [out_channels][kOutHeight][kOutWidth]: the adjoint of transform_output.
  template <class S>
  static void transform_output_gradient(std::int64_t out_channels, const S* COLTRAIN_RESTRICT dy,
                                        S* COLTRAIN_RESTRICT d, std::int64_t ld,
                                        std::int64_t first) {
    constexpr int N = tensor::pack_lanes<S>(kTileCols);
    using P = tensor::pack_t<S, N>;
    const std::int64_t position_stride = winograd_position_stride(out_channels, ld);
    for (std::int64_t k = 0; k < out_channels; ++k)
      for (std::int64_t ty = 0; ty < kTileRows; ++ty) {
        const S* top = dy + (k * kOutHeight + 2 * ty) * kOutWidth;
        const S* bottom = top + kOutWidth;
        S* out = d + k * ld + first + ty * kTileCols;
        for (std::int64_t tx = 0; tx < kTileCols; tx += N) {
          // e = A g, column by column, then e A^T: A's rows are (1 0), (1 1), (1 -1), (0 -1).
          P g00, g01, g10, g11;
          load_deinterleaved<S, N>(top + 2 * tx, g00, g01);
          load_deinterleaved<S, N>(bottom + 2 * tx, g10, g11);
          const P e[4][2] = {
              {g00, g01}, {g00 + g10, g01 + g11}, {g00 - g10, g01 - g11}, {-g10, -g11}};
          for (int r = 0; r < 4; ++r) {
            tensor::store_pack(out + (r * 4 + 0) * position_stride + tx, e[r][0]);
            tensor::store_pack(out + (r * 4 + 1) * position_stride + tx, e[r][0] + e[r][1]);
            tensor::store_pack(out + (r * 4 + 2) * position_stride + tx, e[r][0] - e[r][1]);
            tensor::store_pack(out + (r * 4 + 3) * position_stride + tx, -e[r][1]);
          }
        }
      }
  }
};

// Rows [row_begin, row_end) of u[pos][k][c] = (G g G^T)[pos], u being rows x columns per position,
// for the 3x3 kernels g = weights[k][c] ([rows][columns][3][3]) or, when Flipped, the kernels of
// the input-gradient convolution: weights[c][k] ([columns][rows][3][3]) turned by 180 degrees.
// G's rows are (1 0 0), (1/2 1/2 1/2), (1/2 -1/2 1/2), (0 0 1).
template <bool Flipped = false, class S>
void winograd_transform_weights(std::int64_t rows, std::int64_t columns, std::int64_t row_begin,
                                std::int64_t row_end, const S* COLTRAIN_RESTRICT weights,
                                S* COLTRAIN_RESTRICT u) {
  const std::int64_t position_stride = rows * columns;
  for (std::int64_t k = row_begin; k < row_end; ++k)
    for (std::int64_t c = 0; c < columns; ++c) {
      const S* kernel = weights + (Flipped ? c * rows + k : k * columns + c) * 9;
      S g[9];
      for (int l = 0; l < 9; ++l) g[l] = kernel[Flipped ? 8 - l : l];
      S t[4][3];  // G g
      for (int l = 0; l < 3; ++l) {
        t[0][l] = g[l];
        t[1][l] = S(0.5) * (g[l] + g[3 + l] + g[6 + l]);
        t[2][l] = S(0.5) * (g[l] - g[3 + l] + g[6 + l]);
        t[3][l] = g[6 + l];
      }
      S* out = u + k * columns + c;
      for (int i = 0; i < 4; ++i) {
        out[(i * 4 + 0) * position_stride] = t[i][0];
        out[(i * 4 + 1) * position_stride] = S(0.5) * (t[i][0] + t[i][1] + t[i][2]);
        out[(i * 4 + 2) * position_stride] = S(0.5) * (t[i][0] - t[i][1] + t[i][2]);
        out[(i * 4 + 3) * position_stride] = t[i][2];
      }
    }
}

// The 16 products of a transformed batch of tiles: m[pos] [out_channels x columns] =
// u[pos] [out_channels x in_channels] * v[pos] [in_channels x columns]; v and m as above, ld apart.
template <class S>
void winograd_multiply(std::int64_t out_channels, std::int64_t in_channels, std::int64_t columns,
                       const S* u, const S* v, S* m, std::int64_t ld) {
  for (std::int64_t pos = 0; pos < 16; ++pos)
    tensor::gemm_nn_small_m(out_channels, columns, in_channels,
                            u + pos * out_channels * in_channels, in_channels,
                            v + pos * winograd_position_stride(in_channels, ld), ld,
                            m + pos * winograd_position_stride(out_channels, ld), ld, false);
}

// The transformed weight gradient of a batch of tiles, added to du: du[pos] [out_channels x
// in_channels] += d[pos] [out_channels x columns] * v[pos]^T, with d from transform_output_gradient
// and v from transform_input.
template <class S>
void winograd_add_weight_gradient(std::int64_t out_channels, std::int64_t in_channels,
                                  std::int64_t columns, const S* d, const S* v, std::int64_t ld,
                                  S* du) {
  for (std::int64_t pos = 0; pos < 16; ++pos)
    tensor::gemm_nt_long_k(out_channels, in_channels, columns,
                           d + pos * winograd_position_stride(out_channels, ld), ld,
                           v + pos * winograd_position_stride(in_channels, ld), ld,
                           du + pos * out_channels * in_channels, in_channels, true);
}

// grad[k][c] += G^T du[pos][k][c] G for every kernel (out_channels x in_channels x 3 x 3): the
// adjoint of winograd_transform_weights.
template <class S>
void winograd_fold_weight_gradient(std::int64_t out_channels, std::int64_t in_channels,
                                   const S* COLTRAIN_RESTRICT du, S* COLTRAIN_RESTRICT grad) {
  const std::int64_t position_stride = out_channels * in_channels;
  for (std::int64_t kc = 0; kc < position_stride; ++kc) {
    S x[4][4];
    for (int p = 0; p < 16; ++p) x[p / 4][p % 4] = du[p * position_stride + kc];
    S t[3][4];  // G^T x: G^T's rows are (1 1/2 1/2 0), (0 1/2 -1/2 0), (0 1/2 1/2 1).
    for (int j = 0; j < 4; ++j) {
      t[0][j] = x[0][j] + S(0.5) * (x[1][j] + x[2][j]);
      t[1][j] = S(0.5) * (x[1][j] - x[2][j]);
      t[2][j] = S(0.5) * (x[1][j] + x[2][j]) + x[3][j];
    }
    S* g = grad + kc * 9;
    for (int a = 0; a < 3; ++a) {
      g[a * 3 + 0] += t[a][0] + S(0.5) * (t[a][1] + t[a][2]);
      g[a * 3 + 1] += S(0.5) * (t[a][1] - t[a][2]);
      g[a * 3 + 2] += S(0.5) * (t[a][1] + t[a][2]) + t[a][3];
    }
  }
}

}  // namespace coltrain::nn::detail
