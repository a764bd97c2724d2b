// The float GEMM kernels of coltrain/tensor/cpu_microkernels.hpp against tensor::gemm (Eigen), on
// uniform [-1, 1) data: every m, n and k from 1 to 70 (each remainder of the register tiles and of
// the vector width), random shapes up to 70, the convolution shapes they are written for, leading
// dimensions wider than the matrices, misaligned starting addresses, and C overwritten or added to.
//
// Tolerance: |ours - eigen| <= 1e-5 * |eigen| + 1e-6 * k per element. Both sum k products in
// different orders; each product is at most 1 in magnitude, so the rounding differences grow with k
// (below 1e-4 at k = 1024 where the floor allows 1e-3). Columns between n and ldc must be left
// untouched.

#include <catch2/catch.hpp>

#include <coltrain/tensor/cpu_gemm.hpp>
#include <coltrain/tensor/cpu_microkernels.hpp>
#include <coltrain/tensor/cpu_product.hpp>
#include <coltrain/tensor/vector_pack.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

using coltrain::tensor::Transpose;

// Which kernel, and so how A and B are stored. kNtPanel: the NT product through its transposed
// panel, called directly, since gemm_nt_long_k takes that path only on AVX-512 and at some shapes.
enum class Kind { kNn, kTn, kNt, kNtPanel };

std::string name(Kind kind) {
  switch (kind) {
    case Kind::kNn:
      return "gemm_nn_small_m";
    case Kind::kTn:
      return "gemm_tn_small_k";
    case Kind::kNt:
      return "gemm_nt_long_k";
    case Kind::kNtPanel:
      return "gemm_nt_panel";
  }
  return "?";
}

struct Case {
  Kind kind;
  std::int64_t m, n, k;
  std::int64_t pad = 0;     // leading dimension = stored width + pad, for A, B and C
  std::int64_t offset = 0;  // floats between the buffers' 64-byte aligned starts and the matrices
  bool accumulate = false;
};

std::string describe(const Case& c) {
  std::ostringstream out;
  out << name(c.kind) << " m=" << c.m << " n=" << c.n << " k=" << c.k << " pad=" << c.pad
      << " offset=" << c.offset << " accumulate=" << c.accumulate;
  return out.str();
}

// A buffer whose data starts on a 64-byte boundary (the Tensor allocator's), plus `offset` floats.
struct Buffer {
  std::vector<float> storage;
  float* data;
  Buffer(std::int64_t size, std::int64_t offset)
      : storage(static_cast<std::size_t>(size + offset + 16)) {
    auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    const auto skip = static_cast<std::int64_t>(((64 - address % 64) % 64) / sizeof(float));
    data = storage.data() + skip + offset;
  }
};

void fill(float* data, std::int64_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < count; ++i) data[i] = uniform(rng);
}

// Elements of C out of tolerance against Eigen's `expected` (columns past n, the padding, must keep
// their bits); reports the first, prefixed with `what`, so that a loop over thousands of cases
// stays readable.
int count_wrong(const float* ours, const float* expected, std::int64_t m, std::int64_t n,
                std::int64_t k, std::int64_t ldc, const std::string& what) {
  int wrong = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < ldc; ++j) {
      const float e = expected[i * ldc + j], o = ours[i * ldc + j];
      const bool ok =
          j < n ? std::abs(o - e) <= 1e-5f * std::abs(e) + 1e-6f * static_cast<float>(k) : o == e;
      if (!ok && wrong++ == 0)
        UNSCOPED_INFO(what << ": C(" << i << ", " << j << ") = " << o << ", Eigen gives " << e);
    }
  return wrong;
}

// Runs one case through the kernel and through tensor::gemm; returns the number of elements out of
// tolerance.
int check(const Case& c, std::mt19937& rng) {
  const bool ta = c.kind == Kind::kTn, tb = c.kind == Kind::kNt || c.kind == Kind::kNtPanel;
  const std::int64_t a_rows = ta ? c.k : c.m, a_cols = ta ? c.m : c.k;
  const std::int64_t b_rows = tb ? c.n : c.k, b_cols = tb ? c.k : c.n;
  const std::int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
  Buffer a(a_rows * lda, c.offset), b(b_rows * ldb, c.offset);
  Buffer ours(c.m * ldc, c.offset), expected(c.m * ldc, c.offset);
  fill(a.data, a_rows * lda, rng);
  fill(b.data, b_rows * ldb, rng);
  fill(ours.data, c.m * ldc, rng);
  std::copy_n(ours.data, c.m * ldc, expected.data);

  switch (c.kind) {
    case Kind::kNn:
      coltrain::tensor::gemm_nn_small_m(c.m, c.n, c.k, a.data, lda, b.data, ldb, ours.data, ldc,
                                        c.accumulate);
      break;
    case Kind::kTn:
      coltrain::tensor::gemm_tn_small_k(c.m, c.n, c.k, a.data, lda, b.data, ldb, ours.data, ldc,
                                        c.accumulate);
      break;
    case Kind::kNt:
      coltrain::tensor::gemm_nt_long_k(c.m, c.n, c.k, a.data, lda, b.data, ldb, ours.data, ldc,
                                       c.accumulate);
      break;
    case Kind::kNtPanel:
#if COLTRAIN_MICROKERNELS
      coltrain::tensor::detail::microkernel::gemm_nt_panel(c.m, c.n, c.k, a.data, lda, b.data, ldb,
                                                           ours.data, ldc, c.accumulate);
#else
      coltrain::tensor::gemm_nt_long_k(c.m, c.n, c.k, a.data, lda, b.data, ldb, ours.data, ldc,
                                       c.accumulate);
#endif
      break;
  }
  coltrain::tensor::gemm(ta ? Transpose::kYes : Transpose::kNo,
                         tb ? Transpose::kYes : Transpose::kNo, c.m, c.n, c.k, 1.0f, a.data, lda,
                         b.data, ldb, c.accumulate ? 1.0f : 0.0f, expected.data, ldc);

  return count_wrong(ours.data, expected.data, c.m, c.n, c.k, ldc, describe(c));
}

constexpr Kind kKinds[] = {Kind::kNn, Kind::kTn, Kind::kNt, Kind::kNtPanel};

}  // namespace

TEST_CASE("every m, n and k from 1 to 70 matches tensor::gemm", "[microkernels]") {
  std::mt19937 rng(20240611);
  int wrong = 0, cases = 0;
  for (Kind kind : kKinds)
    for (std::int64_t size = 1; size <= 70; ++size)
      for (bool accumulate : {false, true}) {
        // One dimension swept, the others at sizes that leave remainders of their own.
        for (const Case& c : {Case{kind, size, 37, 29, 0, 0, accumulate},
                              Case{kind, 21, size, 29, 0, 0, accumulate},
                              Case{kind, 21, 37, size, 0, 0, accumulate}}) {
          wrong += check(c, rng);
          ++cases;
        }
      }
  INFO(cases << " cases");
  CHECK(wrong == 0);
}

TEST_CASE("random shapes up to 70 with padded and misaligned operands match tensor::gemm",
          "[microkernels]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int64_t> size(1, 70), pad(0, 19), offset(0, 15);
  int wrong = 0;
  for (Kind kind : kKinds)
    for (int trial = 0; trial < 400; ++trial) {
      const Case c{kind, size(rng), size(rng), size(rng), pad(rng), offset(rng), trial % 2 == 1};
      wrong += check(c, rng);
    }
  CHECK(wrong == 0);
}

TEST_CASE("the convolution shapes match tensor::gemm", "[microkernels]") {
  std::mt19937 rng(3);
  int wrong = 0;
  // Forward and input gradient: A = weights [Cout, K], B = im2col [K, HW*G].
  for (auto [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{16, 1024, 144},
                         {16, 4096, 27},
                         {32, 256, 288},
                         {32, 1024, 288},
                         {64, 256, 576},
                         {64, 576, 288},
                         {10, 576, 288},
                         {128, 256, 1152},
                         {64, 100, 576},
                         {11, 1000, 200}})  // several column blocks, a partial last one, a tail
    for (bool accumulate : {false, true}) {
      wrong += check({Kind::kNn, m, n, k, 0, 0, accumulate}, rng);
      wrong += check({Kind::kNn, m, n, k, 5, 3, accumulate}, rng);
    }
  // Input gradient through col2im: W^T [K, Cout] * dY [Cout, HW*G].
  for (auto [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{144, 256, 32},
                         {288, 256, 64},
                         {16, 256, 32},
                         {147, 1000, 10},
                         {37, 1000, 100}})  // a Linear weight gradient: several column blocks
    for (bool accumulate : {false, true})
      wrong += check({Kind::kTn, m, n, k, 0, 0, accumulate}, rng);
  // Weight gradient: dY [Cout, HW*G] * im2col [K, HW*G]^T, or Winograd's dY' [Cout, tiles] *
  // V [Cin, tiles]^T per position (64 columns of tiles); and a shape that leaves a remainder in
  // every block of the transposed panel (128 x 128) and of its 16 x 16 transposes.
  for (auto [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{16, 144, 1024},
                         {32, 32, 64},
                         {64, 64, 64},
                         {128, 64, 64},
                         {16, 32, 64},
                         {37, 293, 301},
                         {32, 288, 256},
                         {64, 576, 256},
                         {64, 288, 576},
                         {128, 1152, 256},
                         {16, 27, 4096},
                         {10, 9, 1000}})
    for (bool accumulate : {false, true}) {
      wrong += check({Kind::kNt, m, n, k, 0, 0, accumulate}, rng);
      wrong += check({Kind::kNt, m, n, k, 7, 1, accumulate}, rng);
      wrong += check({Kind::kNtPanel, m, n, k, 7, 1, accumulate}, rng);
    }
  CHECK(wrong == 0);
}

// gemm_nn_indirect against gemm_nn_small_m on the gathered matrix: B's rows are read at arbitrary
// offsets (overlapping, unaligned, in any order), and at the offsets of a stride-1 convolution.
int check_indirect(std::int64_t m, std::int64_t n, const std::vector<std::int64_t>& rows,
                   std::int64_t source_size, bool accumulate, std::mt19937& rng) {
  const auto k = static_cast<std::int64_t>(rows.size());
  Buffer a(m * k, 0), source(source_size, 0), gathered(k * n, 0), ours(m * n, 0),
      expected(m * n, 0);
  fill(a.data, m * k, rng);
  fill(source.data, source_size, rng);
  fill(ours.data, m * n, rng);
  std::copy_n(ours.data, m * n, expected.data);
  for (std::int64_t p = 0; p < k; ++p) std::copy_n(source.data + rows[p], n, gathered.data + p * n);
  coltrain::tensor::gemm_nn_indirect(m, n, k, a.data, k, source.data, rows.data(), ours.data, n,
                                     accumulate);
  coltrain::tensor::gemm(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data, k, gathered.data, n,
                         accumulate ? 1.0f : 0.0f, expected.data, n);
  int wrong = 0;
  for (std::int64_t i = 0; i < m * n; ++i) {
    const float e = expected.data[i], o = ours.data[i];
    if (!(std::abs(o - e) <= 1e-5f * std::abs(e) + 1e-6f * static_cast<float>(k)) && wrong++ == 0)
      UNSCOPED_INFO("gemm_nn_indirect m=" << m << " n=" << n << " k=" << k << ": C[" << i
                                          << "] = " << o << ", expected " << e);
  }
  return wrong;
}

TEST_CASE("gemm_nn_indirect reads B's rows at the given offsets", "[microkernels]") {
  std::mt19937 rng(11);
  int wrong = 0;
  // Random offsets into a source of 4000 floats: every tail width, depths around the tiles'.
  std::uniform_int_distribution<std::int64_t> size(1, 70);
  for (int trial = 0; trial < 300; ++trial) {
    const std::int64_t m = size(rng), n = size(rng), k = size(rng);
    std::uniform_int_distribution<std::int64_t> offset(0, 4000 - n);
    std::vector<std::int64_t> rows(static_cast<std::size_t>(k));
    for (auto& r : rows) r = offset(rng);
    wrong += check_indirect(m, n, rows, 4000, trial % 2 == 1, rng);
  }
  // The convolution layout: C channels of a padded P x P image, 3x3 windows, columns up to the last
  // output (rows P wide, of which P - 2 are outputs).
  for (auto [channels, padded, m] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t>{16, 34, 16},
        {32, 18, 32},
        {3, 34, 16},
        {1, 30, 32}}) {
    std::vector<std::int64_t> rows;
    for (std::int64_t c = 0; c < channels; ++c)
      for (std::int64_t kh = 0; kh < 3; ++kh)
        for (std::int64_t kw = 0; kw < 3; ++kw) rows.push_back((c * padded + kh) * padded + kw);
    const std::int64_t out = padded - 2, columns = (out - 1) * padded + out;
    wrong += check_indirect(m, columns, rows, channels * padded * padded, false, rng);
  }
  CHECK(wrong == 0);
}

// gemm_nn_windowed (float microkernel) against the generic version in double, on the weight
// gradient's layout: A's rows are the k x k windows of each channel of a padded P x P image, B is
// [columns x n] with n a multiple of 16 (1 to 4 vectors with AVX-512, more with narrower ones).
template <std::int64_t Kernel, std::int64_t Padded>
int check_windowed(std::int64_t channels, std::int64_t n, bool accumulate, std::mt19937& rng) {
  constexpr auto kOffsets = [] {
    std::array<std::int64_t, Kernel * Kernel> offsets{};
    for (std::int64_t kh = 0; kh < Kernel; ++kh)
      for (std::int64_t kw = 0; kw < Kernel; ++kw)
        offsets[static_cast<std::size_t>(kh * Kernel + kw)] = kh * Padded + kw;
    return offsets;
  }();
  const std::int64_t out = Padded - Kernel + 1, depth = (out - 1) * Padded + out;
  const std::int64_t source_size = channels * Padded * Padded, m = channels * Kernel * Kernel;
  Buffer source(source_size, 0), b(depth * n, 0), ours(m * n, 0);
  fill(source.data, source_size, rng);
  fill(b.data, depth * n, rng);
  fill(ours.data, m * n, rng);
  std::vector<double> source_d(source.data, source.data + source_size),
      b_d(b.data, b.data + depth * n), expected(ours.data, ours.data + m * n);
  coltrain::tensor::gemm_nn_windowed<kOffsets>(channels, Padded * Padded, n, depth, source.data,
                                               b.data, n, ours.data, n, accumulate);
  coltrain::tensor::gemm_nn_windowed<kOffsets>(channels, Padded * Padded, n, depth, source_d.data(),
                                               b_d.data(), n, expected.data(), n, accumulate);
  int wrong = 0;
  for (std::int64_t i = 0; i < m * n; ++i) {
    const double e = expected[static_cast<std::size_t>(i)], o = ours.data[i];
    if (!(std::abs(o - e) <= 1e-5 * std::abs(e) + 1e-6 * static_cast<double>(depth)) &&
        wrong++ == 0)
      UNSCOPED_INFO("gemm_nn_windowed " << Kernel << "x" << Kernel << " P=" << Padded << " n=" << n
                                        << ": C[" << i << "] = " << o << ", expected " << e);
  }
  return wrong;
}

TEST_CASE("gemm_nn_windowed reads A's rows as windows of each channel", "[microkernels]") {
  std::mt19937 rng(13);
  int wrong = 0;
  for (bool accumulate : {false, true}) {
    for (std::int64_t n : {16, 32, 48, 64, 128}) {
      wrong += check_windowed<3, 34>(3, n, accumulate, rng);
      wrong += check_windowed<3, 18>(5, n, accumulate, rng);
    }
    wrong += check_windowed<2, 9>(2, 16, accumulate, rng);
    wrong += check_windowed<5, 20>(2, 32, accumulate, rng);
  }
  CHECK(wrong == 0);
}

TEST_CASE("an empty product writes zeros or leaves C alone", "[microkernels]") {
  for (Kind kind : {Kind::kNn, Kind::kTn, Kind::kNt}) {  // the public entry points
    std::vector<float> c(6, 2.0f);
    const float unused = 0;
    for (bool accumulate : {true, false}) {
      if (kind == Kind::kNn)
        coltrain::tensor::gemm_nn_small_m(2, 3, 0, &unused, 1, &unused, 3, c.data(), 3, accumulate);
      if (kind == Kind::kTn)
        coltrain::tensor::gemm_tn_small_k(2, 3, 0, &unused, 2, &unused, 3, c.data(), 3, accumulate);
      if (kind == Kind::kNt)
        coltrain::tensor::gemm_nt_long_k(2, 3, 0, &unused, 1, &unused, 1, c.data(), 3, accumulate);
      CHECK(c == std::vector<float>(6, accumulate ? 2.0f : 0.0f));
    }
  }
  // m or n zero: nothing is read or written, not even C.
  const float unused = 0;
  coltrain::tensor::gemm_nn_small_m(0, 3, 4, &unused, 4, &unused, 3, static_cast<float*>(nullptr),
                                    3, false);
  coltrain::tensor::gemm_tn_small_k(2, 0, 4, &unused, 2, &unused, 1, static_cast<float*>(nullptr),
                                    1, false);
  coltrain::tensor::gemm_nt_long_k(2, 0, 4, &unused, 4, &unused, 4, static_cast<float*>(nullptr), 1,
                                   false);
}

TEST_CASE("the generic versions serve double through tensor::gemm", "[microkernels]") {
  // A templated caller gets Eigen for S = double and the kernels for S = float from the same call.
  const std::vector<double> a = {1, 2, 3, 4, 5, 6};  // 2 x 3
  const std::vector<double> b = {1, 0, 0, 1, 1, 1};  // 3 x 2, and as 2 x 3 for NT
  std::vector<double> c(4, 10.0);
  coltrain::tensor::gemm_nn_small_m(2, 2, 3, a.data(), 3, b.data(), 2, c.data(), 2, false);
  CHECK(c == std::vector<double>{4, 5, 10, 11});
  coltrain::tensor::gemm_nt_long_k(2, 2, 3, a.data(), 3, b.data(), 3, c.data(), 2, true);
  CHECK(c == std::vector<double>{5, 11, 14, 26});
  // A^T stored 3 x 2 is the same A.
  const std::vector<double> at = {1, 4, 2, 5, 3, 6};
  coltrain::tensor::gemm_tn_small_k(2, 2, 3, at.data(), 2, b.data(), 2, c.data(), 2, false);
  CHECK(c == std::vector<double>{4, 5, 10, 11});
}

TEST_CASE("parallel_cpu_product splits rows or columns across the pool and matches tensor::gemm",
          "[microkernels]") {
  using coltrain::tensor::Transpose;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  int wrong = 0;
  // A linear layer's three products at batch 37 (rows split: m >= n; columns split: m < n, with a
  // last share that is not whole vectors), on 1, 2 and 3 threads, and both operands transposed.
  struct Product {
    Transpose ta, tb;
    std::int64_t m, n, k;
  };
  for (const Product& p : {Product{Transpose::kNo, Transpose::kYes, 37, 300, 130},
                           Product{Transpose::kYes, Transpose::kNo, 300, 130, 37},
                           Product{Transpose::kNo, Transpose::kNo, 37, 130, 300},
                           Product{Transpose::kNo, Transpose::kYes, 130, 37, 300},
                           Product{Transpose::kYes, Transpose::kYes, 40, 70, 90}})
    for (int threads : {1, 2, 3})
      for (bool accumulate : {false, true}) {
        coltrain::ThreadPool pool(threads);
        const bool ta = p.ta == Transpose::kYes, tb = p.tb == Transpose::kYes;
        const std::int64_t lda = (ta ? p.m : p.k) + 3, ldb = (tb ? p.k : p.n) + 5, ldc = p.n + 2;
        std::vector<float> a(static_cast<std::size_t>((ta ? p.k : p.m) * lda)),
            b(static_cast<std::size_t>((tb ? p.n : p.k) * ldb)),
            ours(static_cast<std::size_t>(p.m * ldc));
        for (float& x : a) x = uniform(rng);
        for (float& x : b) x = uniform(rng);
        for (float& x : ours) x = uniform(rng);
        std::vector<float> expected = ours;
        coltrain::tensor::parallel_cpu_product(pool, p.ta, p.tb, p.m, p.n, p.k, a.data(), lda,
                                               b.data(), ldb, ours.data(), ldc, accumulate);
        coltrain::tensor::gemm(p.ta, p.tb, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(), ldb,
                               accumulate ? 1.0f : 0.0f, expected.data(), ldc);
        std::ostringstream what;
        what << "m=" << p.m << " n=" << p.n << " k=" << p.k << " ta=" << ta << " tb=" << tb
             << " threads=" << threads << " accumulate=" << accumulate;
        wrong += count_wrong(ours.data(), expected.data(), p.m, p.n, p.k, ldc, what.str());
      }
  CHECK(wrong == 0);
}

TEST_CASE("vector packs: the widest lanes that divide a count, loads, stores and lane sums",
          "[microkernels]") {
  using coltrain::tensor::pack_lanes;
  constexpr int kWidest = pack_lanes<float>(1024);
  CHECK(kWidest >= 1);
  CHECK(1024 % kWidest == 0);
  CHECK(pack_lanes<float>(49) == 1);  // odd: no pack divides it
  CHECK(pack_lanes<float>(6) == std::min(kWidest, 2));
  CHECK(pack_lanes<double>(1024) == 1);  // only float has packs

  using P = coltrain::tensor::pack_t<float, kWidest>;
  std::vector<float> in(2 * kWidest), out(2 * kWidest, -1.0f);
  for (int i = 0; i < 2 * kWidest; ++i)
    in[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i);
  // From an odd offset too: the loads and stores need no alignment.
  const P v = coltrain::tensor::load_pack<P>(in.data() + 1);
  coltrain::tensor::store_pack(out.data() + 1, v + v);
  for (int i = 1; i <= kWidest; ++i)
    CHECK(out[static_cast<std::size_t>(i)] == 2 * in[static_cast<std::size_t>(i)]);
  CHECK(out[0] == -1.0f);
  CHECK(out[static_cast<std::size_t>(kWidest) + 1] == -1.0f);

  std::vector<double> sums(kWidest, 1.0);
  coltrain::tensor::add_lanes<kWidest>(sums.data(), v);
  for (int l = 0; l < kWidest; ++l)
    CHECK(sums[static_cast<std::size_t>(l)] == 1.0 + in[static_cast<std::size_t>(l) + 1]);
}
