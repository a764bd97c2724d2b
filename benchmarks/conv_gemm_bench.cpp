// GFLOP/s of the convolution products, single thread: Eigen through tensor::gemm (which packs both
// operands on every call) against the register-blocked kernels of tensor/cpu_microkernels.hpp, at
// the shapes Conv2d runs for CIFAR ResNet-20 (batch 64) and the MNIST ConvNet, and at 1024^3 for
// reference.
//
// The two are timed alternately, each sample a batch of calls of about `sample_ms`, and the medians
// over the samples are reported, so that a neighbour on a shared machine slows both alike. Operands
// are 64-byte aligned with leading dimension = width, as the layers' Tensors are.
//
// The kernels' results are compared with Eigen's first: a difference over 1e-4 of the largest
// output (a wrong element, not rounding) makes it exit 1, after every shape's row.
//
// Usage: conv_gemm_bench [samples (15)] [sample_ms (4)]

#include <coltrain/core/timer.hpp>
#include <coltrain/tensor/cpu_gemm.hpp>
#include <coltrain/tensor/cpu_microkernels.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace {

using coltrain::tensor::Transpose;

enum class Kind { kNn, kTn, kNt };

struct Shape {
  const char* layer;
  Kind kind;
  std::int64_t m, n, k;
};

struct AlignedDelete {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
using Buffer = std::unique_ptr<float[], AlignedDelete>;

Buffer random_buffer(std::int64_t count, std::mt19937& rng) {
  Buffer buffer(new (std::align_val_t(64)) float[static_cast<std::size_t>(count)]);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < count; ++i) buffer[i] = uniform(rng);
  return buffer;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

const char* kind_name(Kind kind) {
  return kind == Kind::kNn ? "NN" : kind == Kind::kTn ? "TN" : "NT";
}

}  // namespace

int main(int argc, char** argv) {
  const int samples = argc > 1 ? std::max(1, std::atoi(argv[1])) : 15;
  const double sample_ms = argc > 2 ? std::max(0.1, std::atof(argv[2])) : 4.0;

  // m, n, k of C[m x n] = op(A)[m x k] op(B)[k x n]. Forward: A = W [Cout, K = Cin*9], B = im2col
  // [K, HW*G] (G images per product, about 256 columns); the stride-1 input gradient is the same
  // product with Cin and Cout swapped. Weight gradient (NT): dY [Cout, HW*G] * im2col^T. Input
  // gradient of the stride-2 convolutions (TN): W^T [K, Cout] * dY [Cout, HW*G].
  const std::vector<Shape> shapes = {
      {"resnet20 stage1 fwd", Kind::kNn, 16, 1024, 144},
      {"resnet20 stage2 fwd", Kind::kNn, 32, 256, 288},
      {"resnet20 stage2 x2", Kind::kNn, 32, 512, 288},
      {"resnet20 stage2 x3", Kind::kNn, 32, 768, 288},
      {"resnet20 stage2 x4", Kind::kNn, 32, 1024, 288},
      {"resnet20 stage3 fwd", Kind::kNn, 64, 256, 576},
      {"resnet20 conv1 fwd", Kind::kNn, 16, 1024, 27},
      {"resnet20 s2 stride2", Kind::kNn, 32, 256, 144},
      {"resnet20 s3 stride2", Kind::kNn, 64, 256, 288},
      {"resnet20 s2 shortcut", Kind::kNn, 32, 256, 16},
      {"resnet20 s3 shortcut", Kind::kNn, 64, 256, 32},
      {"mnist conv2 fwd", Kind::kNn, 64, 576, 288},
      {"mnist conv1 fwd", Kind::kNn, 32, 676, 9},
      {"resnet20 stage1 dW", Kind::kNt, 16, 144, 1024},
      {"resnet20 stage2 dW", Kind::kNt, 32, 288, 256},
      {"resnet20 stage2 dWx4", Kind::kNt, 32, 288, 1024},
      {"resnet20 stage3 dW", Kind::kNt, 64, 576, 256},
      {"resnet20 s2 stride2 dW", Kind::kNt, 32, 144, 256},
      {"resnet20 s3 stride2 dW", Kind::kNt, 64, 288, 256},
      {"mnist conv2 dW", Kind::kNt, 64, 288, 576},
      {"mnist conv1 dW", Kind::kNt, 32, 9, 676},
      {"resnet20 s2 stride2 dX", Kind::kTn, 144, 256, 32},
      {"resnet20 s3 stride2 dX", Kind::kTn, 288, 256, 64},
      {"resnet20 s2 shortcut dX", Kind::kTn, 16, 256, 32},
      {"resnet20 s3 shortcut dX", Kind::kTn, 32, 256, 64},
      {"square 1024 (ref)", Kind::kNn, 1024, 1024, 1024},
      {"square 1024 (ref)", Kind::kNt, 1024, 1024, 1024},
  };

  std::printf("single thread, %d samples of ~%.1f ms each, medians; GFLOP/s = 2mnk / time\n",
              samples, sample_ms);
  std::printf("%-24s %-2s %5s %5s %5s %9s %9s %7s %9s\n", "shape", "op", "m", "n", "k", "eigen",
              "kernel", "ratio", "max|diff|");
  std::mt19937 rng(1);
  constexpr float kTolerance = 1e-4f;
  bool wrong = false;
  for (const Shape& s : shapes) {
    const bool ta = s.kind == Kind::kTn, tb = s.kind == Kind::kNt;
    const std::int64_t lda = ta ? s.m : s.k, ldb = tb ? s.k : s.n, ldc = s.n;
    const Buffer a = random_buffer(s.m * s.k, rng), b = random_buffer(s.k * s.n, rng);
    Buffer c_eigen = random_buffer(s.m * s.n, rng), c_kernel = random_buffer(s.m * s.n, rng);
    auto eigen = [&] {
      coltrain::tensor::gemm(ta ? Transpose::kYes : Transpose::kNo,
                             tb ? Transpose::kYes : Transpose::kNo, s.m, s.n, s.k, 1.0f, a.get(),
                             lda, b.get(), ldb, 0.0f, c_eigen.get(), ldc);
    };
    auto kernel = [&] {
      if (s.kind == Kind::kNn)
        coltrain::tensor::gemm_nn_small_m(s.m, s.n, s.k, a.get(), lda, b.get(), ldb, c_kernel.get(),
                                          ldc, false);
      else if (s.kind == Kind::kTn)
        coltrain::tensor::gemm_tn_small_k(s.m, s.n, s.k, a.get(), lda, b.get(), ldb, c_kernel.get(),
                                          ldc, false);
      else
        coltrain::tensor::gemm_nt_long_k(s.m, s.n, s.k, a.get(), lda, b.get(), ldb, c_kernel.get(),
                                         ldc, false);
    };
    eigen();
    kernel();
    float max_diff = 0, largest = 0;
    for (std::int64_t i = 0; i < s.m * s.n; ++i) {
      max_diff = std::max(max_diff, std::abs(c_eigen[i] - c_kernel[i]));
      largest = std::max(largest, std::abs(c_eigen[i]));
    }
    // Float sums in another order differ by about sqrt(k) units in the last place of the largest
    // term; a wrong element is off by the order of the result itself.
    if (max_diff > kTolerance * largest) {
      std::fprintf(stderr,
                   "conv_gemm_bench: %s %s %lldx%lldx%lld: the kernel's result differs from "
                   "Eigen's by %.3e, over %.0e of the largest |C| (%.3e)\n",
                   s.layer, kind_name(s.kind), static_cast<long long>(s.m),
                   static_cast<long long>(s.n), static_cast<long long>(s.k),
                   static_cast<double>(max_diff), static_cast<double>(kTolerance),
                   static_cast<double>(largest));
      wrong = true;
    }

    // Calls per sample, from one timed call of Eigen's.
    coltrain::Stopwatch probe;
    eigen();
    const int calls =
        std::max(1, static_cast<int>(sample_ms * 1e-3 / std::max(probe.seconds(), 1e-7)));
    auto sample = [&](auto&& f) {
      coltrain::Stopwatch watch;
      for (int r = 0; r < calls; ++r) f();
      return watch.seconds() / calls;
    };
    std::vector<double> eigen_s, kernel_s;
    for (int r = 0; r < samples; ++r) {
      // Alternate which goes first, so neither always follows the other's cache state.
      if (r % 2 == 0) {
        eigen_s.push_back(sample(eigen));
        kernel_s.push_back(sample(kernel));
      } else {
        kernel_s.push_back(sample(kernel));
        eigen_s.push_back(sample(eigen));
      }
    }
    const double flop =
        2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const double eigen_gflops = flop / median(eigen_s) / 1e9,
                 kernel_gflops = flop / median(kernel_s) / 1e9;
    std::printf("%-24s %-2s %5lld %5lld %5lld %9.1f %9.1f %6.2fx %9.2e\n", s.layer,
                kind_name(s.kind), static_cast<long long>(s.m), static_cast<long long>(s.n),
                static_cast<long long>(s.k), eigen_gflops, kernel_gflops,
                kernel_gflops / eigen_gflops, static_cast<double>(max_diff));
  }
  return wrong ? 1 : 0;
}
