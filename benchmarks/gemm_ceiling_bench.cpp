// The GEMM ceiling of this machine for the training comparison: single-precision GFLOP/s of Eigen's
// matrix product at 1024^3 on the given threads, split across coltrain's pool as the layers split
// theirs. Prints "<GFLOP/s> GFLOP/s".

#include <coltrain/core/thread_pool.hpp>
#include <coltrain/core/timer.hpp>
#include <coltrain/tensor/cpu_gemm.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  CLI::App app("Eigen float GEMM throughput through coltrain's parallel_gemm");
  int threads = 2;
  int size = 1024;
  double seconds = 1.0;
  app.add_option("--threads", threads)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--size", size, "M = N = K")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seconds", seconds)->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const std::int64_t n = size;
  std::vector<float> a(static_cast<std::size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
  coltrain::ThreadPool pool(threads);
  auto multiply = [&] {
    coltrain::tensor::parallel_gemm(pool, coltrain::tensor::Transpose::kNo, coltrain::tensor::Transpose::kNo, n,
                                    n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  multiply();  // warm-up
  double best = 0;
  coltrain::Stopwatch total;
  while (total.seconds() < seconds) {
    coltrain::Stopwatch one;
    multiply();
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) / one.seconds() / 1e9);
  }
  std::printf("%.1f GFLOP/s\n", best);
  return c[0] == 0.5f * 0.25f * static_cast<float>(n) ? 0 : 1;
}
