#pragma once
// Register-blocked float GEMM kernels for the convolution products, which are small in one
// dimension (16..128 output channels). Eigen packs both operands on every call, and at these shapes
// packing the large one (the im2col matrix) costs about a quarter of the product; these kernels
// read both in place (but for the NT kernel's transposed panel of B, where that pays: below).
//
//   gemm_nn_small_m   C[m x n] (=|+=) A[m x k] * B[k x n]     conv forward and input gradient
//   gemm_nn_indirect  the same, B's rows at given offsets    implicit im2col (stride 1)
//   gemm_tn_small_k   C[m x n] (=|+=) A[k x m]^T * B[k x n]   input gradient through col2im
//   gemm_nt_long_k    C[m x n] (=|+=) A[m x k] * B[n x k]^T   conv weight gradient (B transposed
//                     into a panel for the NN kernel, or dot products along k)
//   gemm_nn_windowed  the same as NN, A's rows at a constant window of offsets per group of rows
//                     (the im2col matrix as A, read from the zero-padded image)   weight gradient
//
// Row-major with leading dimensions (as tensor::gemm); C must not overlap A or B. Rows that start
// on 64-byte boundaries (the Tensor allocator's, with leading dimensions a multiple of 16) are much
// faster: the NT kernel loads every operand as whole vectors, and split loads cost it a third.
//
// Written with GCC/Clang vector extensions at the widest width the target enables (AVX-512, AVX,
// else 16 bytes), so one source serves g++ with or without -march=native, clang, and nvcc's host
// pass. nvcc's device pass, other compilers, and scalar types other than float call tensor::gemm.

#include <coltrain/core/config.hpp>
#include <coltrain/tensor/cpu_gemm.hpp>
#include <coltrain/tensor/cpu_vector_width.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if !defined(__CUDA_ARCH__) && (defined(__GNUC__) || defined(__clang__))
#define COLTRAIN_MICROKERNELS 1
#else
#define COLTRAIN_MICROKERNELS 0
#endif

namespace coltrain::tensor {

#if COLTRAIN_MICROKERNELS
namespace detail::microkernel {

// The widest vector the target has registers for: wider ones would be split (and warned about by
// -Wpsabi). Tiles are sized to the register file: 32 vector registers with AVX-512, else 16.
inline constexpr int kVectorBytes = COLTRAIN_CPU_VECTOR_BYTES;
#if COLTRAIN_CPU_VECTOR_BYTES == 64
inline constexpr int kNnRows = 8, kNnVectors = 3;  // 24 accumulators, 3 loads + 8 broadcasts
inline constexpr int kNtRows = 4, kNtCols = 4;     // 16 accumulators, 8 loads
#else
inline constexpr int kNnRows = 4, kNnVectors = 3;  // 12 accumulators, 3 loads + 1 broadcast
inline constexpr int kNtRows = 3, kNtCols = 3;     // 9 accumulators, 6 loads
#endif
typedef float Vector __attribute__((vector_size(kVectorBytes)));
inline constexpr int kLanes = kVectorBytes / static_cast<int>(sizeof(float));

// f(std::integral_constant<int, 0>{}) ... f(<N - 1>): a tile's accumulators stay in registers
// only if the loops over them are unrolled, which g++ -O2 does not do by itself (and nvcc rejects
// `#pragma GCC unroll`), hence a fold over always-inlined lambdas.
#define COLTRAIN_MICROKERNEL_INLINE __attribute__((always_inline))
template <int N, class F>
COLTRAIN_FORCE_INLINE void unroll(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) COLTRAIN_MICROKERNEL_INLINE {
    (f(std::integral_constant<int, I>{}), ...);
  }
  (std::make_integer_sequence<int, N>{});
}
template <int Rows, int Cols, class F>
COLTRAIN_FORCE_INLINE void unroll2(F&& f) {
  unroll<Rows>([&](auto i) COLTRAIN_MICROKERNEL_INLINE {
    unroll<Cols>([&](auto j) COLTRAIN_MICROKERNEL_INLINE { f(i, j); });
  });
}

// Unaligned loads and stores: a memcpy of a vector compiles to one move.
COLTRAIN_FORCE_INLINE Vector load(const float* p) {
  Vector v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
COLTRAIN_FORCE_INLINE void store(float* p, Vector v) { std::memcpy(p, &v, sizeof v); }
// The first `count` (< kLanes) floats at p, zeros after them.
COLTRAIN_FORCE_INLINE Vector load_partial(const float* p, std::int64_t count) {
  Vector v = {};
  std::memcpy(&v, p, static_cast<std::size_t>(count) * sizeof(float));
  return v;
}

// Splits `total` into ceil(total / max) near-equal parts (m = 10 as 5 + 5, not 8 + 2), so that no
// tile is left with a row or two that cannot hide the FMA latency.
struct EvenSplit {
  std::int64_t parts, base, extra;
  EvenSplit(std::int64_t total, std::int64_t max)
      : parts((total + max - 1) / max), base(total / parts), extra(total % parts) {}
  std::int64_t begin(std::int64_t part) const { return part * base + std::min(part, extra); }
  std::int64_t size(std::int64_t part) const { return base + (part < extra ? 1 : 0); }
};

// Calls f.template operator()<N>() for the N in [1, Max] equal to `n`.
template <int Max, int N = 1, class F>
COLTRAIN_FORCE_INLINE void dispatch(int n, F&& f) {
  if constexpr (N < Max) {
    if (n != N) {
      dispatch<Max, N + 1>(n, f);
      return;
    }
  }
  f.template operator()<N>();
}

// --- NN and TN: C = op(A) * B, B read row by row -------------------------------------------------
// A Rows x Vectors*kLanes tile of C stays in registers for the whole k loop. Each step loads one
// row segment of B (contiguous) and broadcasts a column of Rows values of op(A): Rows*Vectors FMAs
// for Vectors + Rows loads.
//
// Where B's rows are is a policy. StridedRows: `ldb` apart, often 4 KiB (a new page each step,
// which the hardware prefetchers do not follow), so the rows a few steps ahead are prefetched.
// IndirectRows: row p starts at b + offsets[p], the implicit im2col of a stride-1 convolution,
// whose rows are shifted windows of one zero-padded image (near each other; no prefetch needed).
inline constexpr int kPrefetchRows = 4;

struct StridedRows {
  const float* b;
  std::int64_t ldb;
  using Cursor = const float*;  // the row itself: one register for the loop
  Cursor begin() const { return b; }
  Cursor end(std::int64_t k) const { return b + k * ldb; }
  void advance(Cursor& cursor) const { cursor += ldb; }
  const float* row(Cursor cursor) const { return cursor; }
  const float* row_at(std::int64_t p) const { return b + p * ldb; }
  StridedRows shifted(std::int64_t columns) const { return {b + columns, ldb}; }
  COLTRAIN_FORCE_INLINE void prefetch(Cursor cursor, std::int64_t offset) const {
    __builtin_prefetch(cursor + kPrefetchRows * ldb + offset);
  }
};

struct IndirectRows {
  const float* b;
  const std::int64_t* offsets;
  using Cursor = const std::int64_t*;
  Cursor begin() const { return offsets; }
  Cursor end(std::int64_t k) const { return offsets + k; }
  void advance(Cursor& cursor) const { ++cursor; }
  const float* row(Cursor cursor) const { return b + *cursor; }
  const float* row_at(std::int64_t p) const { return b + offsets[p]; }
  IndirectRows shifted(std::int64_t columns) const { return {b + columns, offsets}; }
  COLTRAIN_FORCE_INLINE void prefetch(Cursor, std::int64_t) const {}
};

template <int Rows, int Vectors, bool TransA, bool Prefetch, class BRows>
COLTRAIN_FORCE_INLINE void nn_tile(std::int64_t k, const float* COLTRAIN_RESTRICT a,
                                   std::int64_t lda, BRows b, float* COLTRAIN_RESTRICT c,
                                   std::int64_t ldc, bool accumulate) {
  // op(A)(i, p): row i of A, or column i of the stored A when transposed.
  const std::int64_t row_stride = TransA ? 1 : lda, depth_stride = TransA ? lda : 1;
  Vector acc[Rows][Vectors];
  unroll2<Rows, Vectors>([&](auto i, auto v) COLTRAIN_MICROKERNEL_INLINE { acc[i][v] = Vector{}; });
  const float* a_column = a;
  // Counted by the cursor: a separate step counter is one general register too many.
  const typename BRows::Cursor b_end = b.end(k);
  for (typename BRows::Cursor cursor = b.begin(); cursor != b_end;
       b.advance(cursor), a_column += depth_stride) {
    const float* COLTRAIN_RESTRICT b_row = b.row(cursor);
    Vector row[Vectors];
    unroll<Vectors>([&](auto v) COLTRAIN_MICROKERNEL_INLINE { row[v] = load(b_row + v * kLanes); });
    if constexpr (Prefetch)
      unroll<Vectors>([&](auto v) COLTRAIN_MICROKERNEL_INLINE { b.prefetch(cursor, v * kLanes); });
    // Rows addressed from two bases, rows 0..3 and 4..7, so that the offsets are row_stride times
    // 0..3 (x86 scales 1 and 2, and one register): eight separate offsets do not fit in the general
    // registers next to the outer loops' and spilled to the stack, 10-15% slower.
    unroll2<Rows, Vectors>([&](auto i, auto v) COLTRAIN_MICROKERNEL_INLINE {
      const float* base = i < 4 ? a_column : a_column + 4 * row_stride;
      acc[i][v] += row[v] * base[(i % 4) * row_stride];
    });
  }
  unroll2<Rows, Vectors>([&](auto i, auto v) COLTRAIN_MICROKERNEL_INLINE {
    float* out = c + i * ldc + v * kLanes;
    store(out, accumulate ? acc[i][v] + load(out) : acc[i][v]);
  });
}

// A tile's rows of op(A) start here.
template <bool TransA>
COLTRAIN_FORCE_INLINE const float* a_block(const float* a, std::int64_t lda, std::int64_t row,
                                           std::int64_t depth) {
  return TransA ? a + depth * lda + row : a + row * lda + depth;
}

template <bool TransA, class BRows>
void gemm_nn(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
             BRows b, float* c, std::int64_t ldc, bool accumulate) {
  constexpr std::int64_t kPanel = kNnVectors * kLanes;
  const EvenSplit row_tiles(m, kNnRows);
  const std::int64_t whole = n / kLanes * kLanes;  // columns in whole vectors
  // Row tiles outside, so that a tile's rows of A stay in L1 while B streams from L2. Copying
  // panels of B to a contiguous buffer, or blocking k, measured no faster at these shapes (within
  // 15% of the FMA peak already, B in place). A B larger than L2 (a Linear layer's 128 x 9216)
  // would be streamed from L3 once per row tile, so its columns are taken in blocks of at most
  // 256 KiB. One thread of an Intel Xeon (2 MiB L2), GFLOP/s: 64 x 9216 x 128 (fc1's input
  // gradient) 67 -> 115-123, 64 x 2304 x 288 (an im2col convolution) 76-81 -> 137; B within L2
  // (Winograd's products) takes one block, as before.
  constexpr std::int64_t kBlockFloats = 64 * 1024;
  const std::int64_t block =
      std::max<std::int64_t>(kPanel, kBlockFloats / std::max<std::int64_t>(k, 1) / kPanel * kPanel);
  for (std::int64_t jb = 0; jb < whole; jb += block) {
    const std::int64_t block_end = std::min(whole, jb + block);
    for (std::int64_t t = 0; t < row_tiles.parts; ++t) {
      const std::int64_t i0 = row_tiles.begin(t);
      const int rows = static_cast<int>(row_tiles.size(t));
      const float* a_rows = a_block<TransA>(a, lda, i0, 0);
      for (std::int64_t j0 = jb; j0 < block_end; j0 += kPanel) {
        const int vectors = static_cast<int>(std::min(kPanel, block_end - j0) / kLanes);
        dispatch<kNnRows>(rows, [&]<int Rows>() COLTRAIN_MICROKERNEL_INLINE {
          dispatch<kNnVectors>(vectors, [&]<int Vectors>() COLTRAIN_MICROKERNEL_INLINE {
            nn_tile<Rows, Vectors, TransA, true>(k, a_rows, lda, b.shifted(j0), c + i0 * ldc + j0,
                                                 ldc, accumulate);
          });
        });
      }
    }
  }
  if (whole == n) return;
  // The last n % kLanes columns: copied, a depth block at a time, to a zero-padded panel one vector
  // wide, multiplied into a scratch tile, and the valid columns copied out.
  constexpr std::int64_t kTailDepth = 256;
  alignas(64) float panel[kTailDepth * kLanes];
  alignas(64) float scratch[kNnRows * kLanes];
  const std::int64_t width = n - whole;
  for (std::int64_t p0 = 0; p0 < k; p0 += kTailDepth) {
    const std::int64_t depth = std::min(kTailDepth, k - p0);
    for (std::int64_t p = 0; p < depth; ++p) {
      std::fill_n(panel + p * kLanes, kLanes, 0.0f);
      std::copy_n(b.row_at(p0 + p) + whole, width, panel + p * kLanes);
    }
    const bool add = accumulate || p0 > 0;
    for (std::int64_t t = 0; t < row_tiles.parts; ++t) {
      const std::int64_t i0 = row_tiles.begin(t);
      const int rows = static_cast<int>(row_tiles.size(t));
      dispatch<kNnRows>(rows, [&]<int Rows>() COLTRAIN_MICROKERNEL_INLINE {
        nn_tile<Rows, 1, TransA, false>(depth, a_block<TransA>(a, lda, i0, p0), lda,
                                        StridedRows{panel, kLanes}, scratch, kLanes, false);
      });
      for (int i = 0; i < rows; ++i) {
        float* out = c + (i0 + i) * ldc + whole;
        for (std::int64_t j = 0; j < width; ++j)
          out[j] = add ? out[j] + scratch[i * kLanes + j] : scratch[i * kLanes + j];
      }
    }
  }
}

// --- NT: C = A * B^T -----------------------------------------------------------------------------
// Two ways. Dot products along k: a tile of C as vector accumulators, each summed across its lanes
// at the end. Or B transposed into a packed panel, then the NN kernel's outer products. The lane
// sums cost a few shuffles per element of C, against its k/kLanes FMAs; the transposes a fraction
// of a shuffle per element of B, against its m/kLanes FMAs. So the panel pays where k is short and
// m is not, as in the convolutions' weight gradients (Winograd's: k = 64 columns of tiles a
// group). AVX-512, one thread, dot products against the panel, GFLOP/s: 32 x 32 x 64 115 and 174,
// 64 x 288 x 256 (an im2col weight gradient) 156 and 204; but 16 x 144 x 256 151 and 138, and
// 16 x 144 x 1024 137 and 103. Where B has fewer than two vectors' worth of rows (16 x 16 x 64;
// n = 27, which the NN kernel would take partly through its slow path for the last n % kLanes
// columns) the dot products win too.

// out[r] = the sum of the lanes of v[r], for Count vectors. With two-source shuffles the sums are
// formed as a tree that merges pairs of vectors into one holding both partial sums: 3 instructions
// per result, against 2*log2(kLanes) when each vector is reduced on its own. Per result the tile
// spends k/kLanes FMAs, so at k = 256 this is the difference between 15% and 50% overhead.
//
// Lane `o` of the merge of x (lanes 0..L-1) and y (L..2L-1), each holding L/Group partial sums of
// Group lanes: the merge holds x's sums, then y's, at Group/2 lanes each.
template <int Group, bool Upper>
constexpr int merge_lane(int o) {
  const int half = Group / 2, q = o / half, t = o % half, groups = kLanes / Group;
  return (q < groups ? q * Group : kLanes + (q - groups) * Group) + (Upper ? half : 0) + t;
}
#if defined(__clang__)
template <int Group, int... O>
COLTRAIN_FORCE_INLINE Vector merge(Vector x, Vector y, std::integer_sequence<int, O...>) {
  return __builtin_shufflevector(x, y, merge_lane<Group, false>(O)...) +
         __builtin_shufflevector(x, y, merge_lane<Group, true>(O)...);
}
#else
// g++'s spelling, which nvcc's front end also passes through (it garbles __builtin_shufflevector).
typedef std::int32_t LaneIndices __attribute__((vector_size(kVectorBytes)));
template <int Group, int... O>
COLTRAIN_FORCE_INLINE Vector merge(Vector x, Vector y, std::integer_sequence<int, O...>) {
  constexpr LaneIndices kLower = {merge_lane<Group, false>(O)...};
  constexpr LaneIndices kUpper = {merge_lane<Group, true>(O)...};
  return __builtin_shuffle(x, y, kLower) + __builtin_shuffle(x, y, kUpper);
}
#endif
// Count vectors of partial sums Group lanes wide -> one vector whose lane r is v[r]'s total.
template <int Count, int Group>
COLTRAIN_FORCE_INLINE Vector reduce_tree(const Vector* v) {
  constexpr auto kAll = std::make_integer_sequence<int, kLanes>{};
  if constexpr (Group == 1) {
    return v[0];
  } else if constexpr (Count == 1) {
    const Vector halved = merge<Group>(v[0], v[0], kAll);  // fewer results than lanes
    return reduce_tree<1, Group / 2>(&halved);
  } else {
    Vector merged[Count / 2];
    unroll<Count / 2>([&](auto r) COLTRAIN_MICROKERNEL_INLINE {
      merged[r] = merge<Group>(v[2 * r], v[2 * r + 1], kAll);
    });
    return reduce_tree<Count / 2, Group / 2>(merged);
  }
}

template <int Count>
COLTRAIN_FORCE_INLINE void lane_sums(const Vector* v, float* out) {
  // The largest power of two <= min(Count, kLanes) first, then the rest.
  constexpr int kChunk = [] {
    int chunk = 1;
    while (chunk * 2 <= Count && chunk * 2 <= kLanes) chunk *= 2;
    return chunk;
  }();
  const Vector sums = reduce_tree<kChunk, kLanes>(v);
  unroll<kChunk>([&](auto r) COLTRAIN_MICROKERNEL_INLINE { out[r] = sums[r()]; });
  if constexpr (Count > kChunk) lane_sums<Count - kChunk>(v + kChunk, out + kChunk);
}

// A Rows x Cols tile of C as Rows*Cols vector accumulators along k: Rows + Cols loads per step.
template <int Rows, int Cols>
COLTRAIN_FORCE_INLINE void nt_tile(std::int64_t k, const float* COLTRAIN_RESTRICT a,
                                   std::int64_t lda, const float* COLTRAIN_RESTRICT b,
                                   std::int64_t ldb, float* COLTRAIN_RESTRICT c, std::int64_t ldc,
                                   bool accumulate) {
  Vector acc[Rows * Cols];
  unroll<Rows * Cols>([&](auto t) COLTRAIN_MICROKERNEL_INLINE { acc[t] = Vector{}; });
  // One step of kLanes along k at a_p and b_p (the k offset into row 0 of each); rows are reached
  // as multiples of the leading dimensions, which x86 addresses with scales instead of a register
  // per row (8 row pointers next to the loop's own would spill).
  auto step = [&](const float* a_p, const float* b_p, auto read) COLTRAIN_MICROKERNEL_INLINE {
    Vector av[Rows], bv[Cols];
    unroll<Rows>([&](auto i) COLTRAIN_MICROKERNEL_INLINE { av[i] = read(a_p + i * lda); });
    unroll<Cols>([&](auto j) COLTRAIN_MICROKERNEL_INLINE { bv[j] = read(b_p + j * ldb); });
    unroll2<Rows, Cols>([&](auto i, auto j)
                            COLTRAIN_MICROKERNEL_INLINE { acc[i * Cols + j] += av[i] * bv[j]; });
  };
  const float* a_p = a;
  const float* b_p = b;
  for (const float* const a_end = a + k / kLanes * kLanes; a_p != a_end;
       a_p += kLanes, b_p += kLanes)
    step(a_p, b_p, [](const float* x) COLTRAIN_MICROKERNEL_INLINE { return load(x); });
  if (const std::int64_t rest = k % kLanes; rest > 0)
    step(a_p, b_p,
         [rest](const float* x) COLTRAIN_MICROKERNEL_INLINE { return load_partial(x, rest); });
  if constexpr (Rows * Cols == kLanes && Cols % 4 == 0) {
    // A full tile's sums fill one vector, row after row: each row of C is updated as one short
    // vector instead of Cols extracted lanes (at k = 64 the scalar updates cost as much as the
    // FMAs).
    typedef float RowVector __attribute__((vector_size(Cols * sizeof(float))));
    alignas(kVectorBytes) float sums[kLanes];
    store(sums, reduce_tree<kLanes, kLanes>(acc));
    unroll<Rows>([&](auto i) COLTRAIN_MICROKERNEL_INLINE {
      RowVector row, sum;
      std::memcpy(&sum, sums + i * Cols, sizeof sum);
      if (accumulate) {
        std::memcpy(&row, c + i * ldc, sizeof row);
        sum += row;
      }
      std::memcpy(c + i * ldc, &sum, sizeof sum);
    });
  } else {
    float sums[Rows * Cols];
    lane_sums<Rows * Cols>(acc, sums);
    unroll2<Rows, Cols>([&](auto i, auto j) COLTRAIN_MICROKERNEL_INLINE {
      float& out = c[i * ldc + j];
      out = accumulate ? out + sums[i * Cols + j] : sums[i * Cols + j];
    });
  }
}

inline void gemm_nt_dot(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                        std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                        std::int64_t ldc, bool accumulate) {
  // Blocks of B's rows that fill about half of L1 are kept there while every row tile of A passes
  // over them; each row tile of A is reused from L1 across the block's column tiles.
  constexpr std::int64_t kL1Budget = 24 * 1024;
  const std::int64_t block_rows = std::max<std::int64_t>(
      kNtCols, kL1Budget / (k * static_cast<std::int64_t>(sizeof(float))) / kNtCols * kNtCols);
  for (std::int64_t jb = 0; jb < n; jb += block_rows) {
    const std::int64_t block_end = std::min(n, jb + block_rows);
    for (std::int64_t i0 = 0; i0 < m; i0 += kNtRows) {
      const int rows = static_cast<int>(std::min<std::int64_t>(kNtRows, m - i0));
      for (std::int64_t j0 = jb; j0 < block_end; j0 += kNtCols) {
        const int cols = static_cast<int>(std::min<std::int64_t>(kNtCols, block_end - j0));
        dispatch<kNtRows>(rows, [&]<int Rows>() COLTRAIN_MICROKERNEL_INLINE {
          dispatch<kNtCols>(cols, [&]<int Cols>() COLTRAIN_MICROKERNEL_INLINE {
            nt_tile<Rows, Cols>(k, a + i0 * lda, lda, b + j0 * ldb, ldb, c + i0 * ldc + j0, ldc,
                                accumulate);
          });
        });
      }
    }
  }
}

// A square of kLanes x kLanes floats, one row a vector, transposed in registers: log2(kLanes)
// rounds that interleave the two halves of the rows, row i with row i + kLanes/2 (after the last
// round, row i holds column i). Two-source shuffles of one pattern serve every vector width.
template <bool Upper>
constexpr int interleave_lane(int o) {
  return (o % 2 == 0 ? 0 : kLanes) + (Upper ? kLanes / 2 : 0) + o / 2;
}
#if defined(__clang__)
template <bool Upper, int... O>
COLTRAIN_FORCE_INLINE Vector interleave_halves(Vector x, Vector y,
                                               std::integer_sequence<int, O...>) {
  return __builtin_shufflevector(x, y, interleave_lane<Upper>(O)...);
}
#else
template <bool Upper, int... O>
COLTRAIN_FORCE_INLINE Vector interleave_halves(Vector x, Vector y,
                                               std::integer_sequence<int, O...>) {
  constexpr LaneIndices kLanesOf = {interleave_lane<Upper>(O)...};
  return __builtin_shuffle(x, y, kLanesOf);
}
#endif
COLTRAIN_FORCE_INLINE void transpose_square(Vector (&rows)[kLanes]) {
  constexpr auto kAll = std::make_integer_sequence<int, kLanes>{};
  for (int round = 1; round < kLanes; round *= 2) {
    Vector next[kLanes];
    unroll<kLanes / 2>([&](auto i) COLTRAIN_MICROKERNEL_INLINE {
      next[2 * i] = interleave_halves<false>(rows[i], rows[i + kLanes / 2], kAll);
      next[2 * i + 1] = interleave_halves<true>(rows[i], rows[i + kLanes / 2], kAll);
    });
    unroll<kLanes>([&](auto i) COLTRAIN_MICROKERNEL_INLINE { rows[i] = next[i]; });
  }
}

// panel[p][j] = B(j, p) for p < depth, j < width (B's rows ldb apart), with the row of the panel
// padded with zeros to whole vectors: ld_panel = width rounded up to kLanes.
inline void pack_transposed(std::int64_t depth, std::int64_t width, const float* b,
                            std::int64_t ldb, float* COLTRAIN_RESTRICT panel,
                            std::int64_t ld_panel) {
  for (std::int64_t p = 0; p < depth; p += kLanes) {
    const std::int64_t span = std::min<std::int64_t>(kLanes, depth - p);
    for (std::int64_t j = 0; j < width; j += kLanes) {
      Vector rows[kLanes];
      unroll<kLanes>([&](auto i) COLTRAIN_MICROKERNEL_INLINE {
        const float* row = b + (j + i) * ldb + p;
        rows[i] = j + i >= width ? Vector{} : span == kLanes ? load(row) : load_partial(row, span);
      });
      transpose_square(rows);
      for (std::int64_t q = 0; q < span; ++q) store(panel + (p + q) * ld_panel + j, rows[q]);
    }
  }
}

// C = A * B^T through panels of B^T of up to 128 x 128 (64 KiB on the stack): a Winograd group's
// whole B^T, and for longer products a block the NN kernel streams from L2 while its rows of A
// stay in L1.
inline void gemm_nt_panel(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                          std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                          std::int64_t ldc, bool accumulate) {
  constexpr std::int64_t kPanelDepth = 128, kPanelWidth = 128;
  alignas(64) float panel[kPanelDepth * kPanelWidth];
  for (std::int64_t j0 = 0; j0 < n; j0 += kPanelWidth) {
    const std::int64_t width = std::min(kPanelWidth, n - j0);
    const std::int64_t ld_panel = (width + kLanes - 1) / kLanes * kLanes;
    for (std::int64_t p0 = 0; p0 < k; p0 += kPanelDepth) {
      const std::int64_t depth = std::min(kPanelDepth, k - p0);
      pack_transposed(depth, width, b + j0 * ldb + p0, ldb, panel, ld_panel);
      gemm_nn<false>(m, width, depth, a + p0, lda, StridedRows{panel, ld_panel}, c + j0, ldc,
                     accumulate || p0 > 0);
    }
  }
}

inline void gemm_nt(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                    std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc,
                    bool accumulate) {
  // The panel with AVX-512 only: with 8 or 4 lanes a transpose moves fewer floats per shuffle and
  // the NN kernel's tiles are narrower, and the panel lost at most shapes (x86-64-v3: 16 x 144 x
  // 1024 81 -> 47 GFLOP/s, 32 x 32 x 64 82 -> 67; baseline x86-64: 64 x 288 x 256 47 -> 37).
  if (kLanes < 16 || n < 2 * kLanes || (m < 2 * kLanes && k > 8 * kLanes))
    return gemm_nt_dot(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  gemm_nt_panel(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

// --- Windowed NN: A's rows are shifted windows of one image --------------------------------------
// Row (g, r) of A starts at a + g * group_stride + Offsets[r]. For a stride-1 convolution's weight
// gradient, dW^T = col * dY^T, row (c, kh, kw) of the im2col matrix `col` is the zero-padded
// channel c read from offset kh*PW + kw, the same window for every channel. With the window a
// template argument each broadcast of A is one instruction with a constant displacement, and the
// loop needs no row pointers; B's rows (dY^T) are contiguous.
template <auto Offsets, int Vectors>
COLTRAIN_FORCE_INLINE void windowed_tile(std::int64_t depth, const float* COLTRAIN_RESTRICT a,
                                         const float* COLTRAIN_RESTRICT b, std::int64_t ldb,
                                         float* COLTRAIN_RESTRICT c, std::int64_t ldc,
                                         bool accumulate) {
  constexpr int kRows = static_cast<int>(Offsets.size());
  Vector acc[kRows][Vectors];
  unroll2<kRows, Vectors>([&](auto i, auto v)
                              COLTRAIN_MICROKERNEL_INLINE { acc[i][v] = Vector{}; });
  for (const float* const a_end = a + depth; a != a_end; ++a, b += ldb) {
    Vector row[Vectors];
    unroll<Vectors>([&](auto v) COLTRAIN_MICROKERNEL_INLINE { row[v] = load(b + v * kLanes); });
    unroll2<kRows, Vectors>(
        [&](auto i, auto v) COLTRAIN_MICROKERNEL_INLINE { acc[i][v] += row[v] * a[Offsets[i]]; });
  }
  unroll2<kRows, Vectors>([&](auto i, auto v) COLTRAIN_MICROKERNEL_INLINE {
    float* out = c + i * ldc + v * kLanes;
    store(out, accumulate ? acc[i][v] + load(out) : acc[i][v]);
  });
}

template <auto Offsets>
void gemm_nn_windowed(std::int64_t groups, std::int64_t group_stride, std::int64_t n,
                      std::int64_t depth, const float* a, const float* b, std::int64_t ldb,
                      float* c, std::int64_t ldc, bool accumulate) {
  constexpr int kRows = static_cast<int>(Offsets.size());
  // About 20 accumulators: enough independent chains to hide the FMA latency, with registers left
  // for B's row and the broadcast.
  constexpr int kMaxVectors = std::clamp(20 / kRows, 1, kNnVectors);
  const EvenSplit column_tiles(n / kLanes, kMaxVectors);
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t t = 0; t < column_tiles.parts; ++t) {
      const std::int64_t j0 = column_tiles.begin(t) * kLanes;
      dispatch<kMaxVectors>(
          static_cast<int>(column_tiles.size(t)), [&]<int Vectors>() COLTRAIN_MICROKERNEL_INLINE {
            windowed_tile<Offsets, Vectors>(depth, a + g * group_stride, b + j0, ldb,
                                            c + g * kRows * ldc + j0, ldc, accumulate);
          });
    }
}

}  // namespace detail::microkernel
#endif  // COLTRAIN_MICROKERNELS

namespace detail {
// C = 0 (unless accumulating) for an empty product.
template <class S>
void zero_unless_accumulating(std::int64_t m, std::int64_t n, S* c, std::int64_t ldc,
                              bool accumulate) {
  if (!accumulate)
    for (std::int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, S(0));
}
}  // namespace detail

// The generic versions, for any S: tensor::gemm. The float overloads below take precedence.
template <class S>
void gemm_nn_small_m(std::int64_t m, std::int64_t n, std::int64_t k, const S* a, std::int64_t lda,
                     const S* b, std::int64_t ldb, S* c, std::int64_t ldc, bool accumulate) {
  gemm(Transpose::kNo, Transpose::kNo, m, n, k, S(1), a, lda, b, ldb, accumulate ? S(1) : S(0), c,
       ldc);
}
template <class S>
void gemm_tn_small_k(std::int64_t m, std::int64_t n, std::int64_t k, const S* a, std::int64_t lda,
                     const S* b, std::int64_t ldb, S* c, std::int64_t ldc, bool accumulate) {
  gemm(Transpose::kYes, Transpose::kNo, m, n, k, S(1), a, lda, b, ldb, accumulate ? S(1) : S(0), c,
       ldc);
}
template <class S>
void gemm_nt_long_k(std::int64_t m, std::int64_t n, std::int64_t k, const S* a, std::int64_t lda,
                    const S* b, std::int64_t ldb, S* c, std::int64_t ldc, bool accumulate) {
  gemm(Transpose::kNo, Transpose::kYes, m, n, k, S(1), a, lda, b, ldb, accumulate ? S(1) : S(0), c,
       ldc);
}

// C[m x n] (=|+=) A[m x k] * B[k x n] where row p of B starts at b + b_rows[p], that is
// B(p, j) = b[b_rows[p] + j]: an indirect GEMM. A stride-1 convolution reads its im2col matrix this
// way straight from the zero-padded image, without building it (see nn/conv2d.hpp).
template <class S>
void gemm_nn_indirect(std::int64_t m, std::int64_t n, std::int64_t k, const S* a, std::int64_t lda,
                      const S* b, const std::int64_t* b_rows, S* c, std::int64_t ldc,
                      bool accumulate) {
  if (m <= 0 || n <= 0) return;
  std::vector<S> gathered(static_cast<std::size_t>(k * n));
  for (std::int64_t p = 0; p < k; ++p) std::copy_n(b + b_rows[p], n, gathered.data() + p * n);
  gemm_nn_small_m<S>(m, n, k, a, lda, gathered.data(), n, c, ldc, accumulate);
}

// The float versions: the register-blocked kernels. Under COLTRAIN_SEPARATE_COMPILATION they are
// compiled once, by <coltrain/tensor/src.hpp> (impl/cpu_microkernels.ipp).
inline namespace COLTRAIN_CPU_VECTOR_ABI {
// C[m x n] (=|+=) A[m x k] * B[k x n].
COLTRAIN_DECL void gemm_nn_small_m(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                   std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                                   std::int64_t ldc, bool accumulate);
// C[m x n] (=|+=) A[m x k] * B[k x n], row p of B at b + b_rows[p].
COLTRAIN_DECL void gemm_nn_indirect(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                    std::int64_t lda, const float* b, const std::int64_t* b_rows,
                                    float* c, std::int64_t ldc, bool accumulate);
// C[m x n] (=|+=) A[k x m]^T * B[k x n]: A is stored k x m, as W [Cout, K] is for W^T * dY.
COLTRAIN_DECL void gemm_tn_small_k(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                   std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                                   std::int64_t ldc, bool accumulate);
// C[m x n] (=|+=) A[m x k] * B[n x k]^T.
COLTRAIN_DECL void gemm_nt_long_k(std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                                  std::int64_t lda, const float* b, std::int64_t ldb, float* c,
                                  std::int64_t ldc, bool accumulate);
}  // namespace COLTRAIN_CPU_VECTOR_ABI

// C[groups * R x n] (=|+=) A * B[depth x n], where A has R = Offsets.size() rows per group and
// A((g, r), p) = a[g * group_stride + Offsets[r] + p]: the im2col matrix of a stride-1 convolution
// read from the zero-padded image (groups = channels, Offsets = the kernel window's kh*PW + kw).
// The generic version, for any S; the float one below takes precedence.
template <auto Offsets, class S>
void gemm_nn_windowed(std::int64_t groups, std::int64_t group_stride, std::int64_t n,
                      std::int64_t depth, const S* a, const S* b, std::int64_t ldb, S* c,
                      std::int64_t ldc, bool accumulate) {
  constexpr std::int64_t kRows = static_cast<std::int64_t>(Offsets.size());
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t r = 0; r < kRows; ++r) {
      const S* row = a + g * group_stride + Offsets[static_cast<std::size_t>(r)];
      S* out = c + (g * kRows + r) * ldc;
      if (!accumulate) std::fill_n(out, n, S(0));
      for (std::int64_t p = 0; p < depth; ++p)
        for (std::int64_t j = 0; j < n; ++j) out[j] += row[p] * b[p * ldb + j];
    }
}

// n must be a multiple of 16: callers pad B's and C's rows with zero columns.
template <auto Offsets>
void gemm_nn_windowed(std::int64_t groups, std::int64_t group_stride, std::int64_t n,
                      std::int64_t depth, const float* a, const float* b, std::int64_t ldb,
                      float* c, std::int64_t ldc, bool accumulate) {
#if COLTRAIN_MICROKERNELS
  if (groups <= 0 || n <= 0) return;
  detail::microkernel::gemm_nn_windowed<Offsets>(groups, group_stride, n, depth, a, b, ldb, c, ldc,
                                                 accumulate);
#else
  gemm_nn_windowed<Offsets, float>(groups, group_stride, n, depth, a, b, ldb, c, ldc, accumulate);
#endif
}

}  // namespace coltrain::tensor

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/tensor/impl/cpu_microkernels.ipp>
#endif
