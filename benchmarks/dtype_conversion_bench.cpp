// Throughput of coltrain's fp16 and bf16 conversions on the CPU, next to the compiler's own
// _Float16 in the same run. Reduced-precision allreduce converts every element twice (widen,
// accumulate in f32, narrow once), so these loops bound what an f16/bf16 reduction can reach.
//
//   build/benchmarks/dtype_conversion_bench [--count N] [--repeats R] [--csv FILE]
//
// Bandwidth counts bytes read plus bytes written, in GB/s (1e9); each figure is the median of R
// runs.
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/timer.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

struct Result {
  std::string conversion;
  std::string implementation;
  double median_gbs;
};

// Runs `convert` `repeats` times and returns the median bandwidth for `bytes` moved per run.
double median_bandwidth(const std::function<void()>& convert, double bytes, int repeats) {
  convert();  // warm-up: page in the buffers
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    coltrain::Stopwatch watch;
    convert();
    rates.push_back(bytes / watch.seconds() / 1e9);
  }
  std::nth_element(rates.begin(), rates.begin() + repeats / 2, rates.end());
  return rates[repeats / 2];
}

// Keeps the compiler from dropping a conversion whose result is never read.
template <class T>
void consume(const std::vector<T>& values) {
  volatile auto sink = values[values.size() / 2];
  (void)sink;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fp16/bf16 conversion throughput: coltrain vs the compiler's _Float16"};
  std::size_t count = std::size_t{1} << 24;
  int repeats = 15;
  std::string csv_path;
  app.add_option("--count", count, "elements per conversion")->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "timed runs; the median is reported")
      ->check(CLI::Range(1, 1000));
  app.add_option("--csv", csv_path, "also write the results to this CSV file");
  CLI11_PARSE(app, argc, argv);

  std::vector<float> floats(count), widened(count);
  std::mt19937 generator(42);
  std::uniform_real_distribution<float> distribution(-60000.0f, 60000.0f);
  for (float& value : floats) value = distribution(generator);
  std::vector<coltrain::half> halves(count);
  std::vector<coltrain::bfloat16> bf16s(count);
  std::vector<_Float16> compiler_halves(count);

  const double narrow_bytes = static_cast<double>(count) * (sizeof(float) + 2);
  std::vector<Result> results;
  auto measure = [&](std::string conversion, std::string implementation,
                     const std::function<void()>& convert) {
    results.push_back({std::move(conversion), std::move(implementation),
                       median_bandwidth(convert, narrow_bytes, repeats)});
  };

  measure("f32->f16", "coltrain::half", [&] {
    for (std::size_t i = 0; i < count; ++i) halves[i] = coltrain::half(floats[i]);
    consume(halves);
  });
  measure("f32->f16", "_Float16", [&] {
    for (std::size_t i = 0; i < count; ++i) compiler_halves[i] = static_cast<_Float16>(floats[i]);
    consume(compiler_halves);
  });
  measure("f16->f32", "coltrain::half", [&] {
    for (std::size_t i = 0; i < count; ++i) widened[i] = static_cast<float>(halves[i]);
    consume(widened);
  });
  measure("f16->f32", "_Float16", [&] {
    for (std::size_t i = 0; i < count; ++i) widened[i] = static_cast<float>(compiler_halves[i]);
    consume(widened);
  });
  measure("f32->bf16", "coltrain::bfloat16", [&] {
    for (std::size_t i = 0; i < count; ++i) bf16s[i] = coltrain::bfloat16(floats[i]);
    consume(bf16s);
  });
  measure("bf16->f32", "coltrain::bfloat16", [&] {
    for (std::size_t i = 0; i < count; ++i) widened[i] = static_cast<float>(bf16s[i]);
    consume(widened);
  });

  std::printf("%-10s %-20s %12s   (%zu elements, median of %d)\n", "conversion", "implementation",
              "GB/s", count, repeats);
  for (const Result& r : results) {
    std::printf("%-10s %-20s %12.2f\n", r.conversion.c_str(), r.implementation.c_str(),
                r.median_gbs);
  }
  if (!csv_path.empty()) {
    std::ofstream csv(csv_path);
    csv << "conversion,implementation,count,repeats,median_gbs\n";
    for (const Result& r : results) {
      csv << r.conversion << ',' << r.implementation << ',' << count << ',' << repeats << ','
          << r.median_gbs << '\n';
    }
    if (!csv) {
      std::fprintf(stderr, "cannot write %s\n", csv_path.c_str());
      return 1;
    }
  }
  return 0;
}
