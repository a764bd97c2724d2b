// A convolution's forward pass over a batch, single thread: Winograd F(2x2, 3x3) and F(4x4, 3x3)
// (nn/winograd_convolution.hpp: split, input transform, 16 or 36 GEMMs, output transform) against
// the direct product that Conv2d otherwise runs for stride-1 3x3 convolutions (IndirectConvolution:
// pad, GEMM reading the padded image in place, copy out), at the shapes of CIFAR ResNet-20's three
// stages and the MNIST ConvNet's second convolution. Both sides include their copies and
// transforms, and the weights' transform is counted on Winograd's side.
//
// The three are timed alternately, `samples` times each, and the medians are reported with the
// largest difference from the direct product's output relative to its largest output; a difference
// over 1e-4 (a wrong transform, not rounding) makes it exit 1.
//
// Usage: winograd_bench [samples (9)] [batch (64)]

#include <coltrain/core/timer.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/winograd_convolution.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <random>
#include <vector>

namespace {

namespace nn = coltrain::nn;
using coltrain::tensor::Tensor;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The forward pass through F(Tile x Tile, 3x3), grouped as the layer groups it; one call per
// timing.
template <int Tile, std::int64_t Cin, std::int64_t Cout, std::int64_t H, std::int64_t Padding>
class WinogradForward {
  using Winograd = nn::detail::WinogradConvolution<Tile, Cin, H, H, Padding>;
  static constexpr std::int64_t kOut = H + 2 * Padding - 2;
  static constexpr std::int64_t kGroup = nn::detail::winograd_group_images(
      std::max(Cin, Cout), Winograd::kTiles, Winograd::kPositions);
  static constexpr std::int64_t kLd = (kGroup * Winograd::kTiles + 15) / 16 * 16;

 public:
  static constexpr bool kApplicable = Winograd::kApplicable;

  void run(const Tensor<float>& x, const Tensor<float>& w, Tensor<float>& y) {
    const std::int64_t batch = x.shape()[0];
    nn::detail::winograd_transform_weights<Tile>(Cout, Cin, 0, Cout, w.data(), u_.data());
    for (std::int64_t first = 0; first < batch; first += kGroup) {
      const std::int64_t count = std::min(kGroup, batch - first);
      for (std::int64_t g = 0; g < count; ++g) {
        Winograd::split_image(x.data() + (first + g) * Cin * H * H, split_.data());
        Winograd::transform_input(split_.data(), v_.data(), kLd, g * Winograd::kTiles);
      }
      nn::detail::winograd_multiply(Winograd::kPositions, Cout, Cin, count * Winograd::kTiles,
                                    u_.data(), v_.data(), m_.data(), kLd);
      for (std::int64_t g = 0; g < count; ++g)
        Winograd::template transform_output<false>(Cout, m_.data(), kLd, g * Winograd::kTiles,
                                                   y.data() + (first + g) * Cout * kOut * kOut,
                                                   static_cast<const float*>(nullptr));
    }
  }

 private:
  Tensor<float> split_{{Winograd::kSplitSize}}, u_{{Winograd::kPositions * Cout * Cin}};
  Tensor<float> v_{{Winograd::kPositions * nn::detail::winograd_position_stride(Cin, kLd)}};
  Tensor<float> m_{{Winograd::kPositions * nn::detail::winograd_position_stride(Cout, kLd)}};
};

double relative_difference(const Tensor<float>& reference, const Tensor<float>& y) {
  double largest = 0, difference = 0;
  for (std::int64_t i = 0; i < reference.numel(); ++i) {
    largest = std::max(largest, double(std::abs(reference.data()[i])));
    difference = std::max(difference, double(std::abs(reference.data()[i] - y.data()[i])));
  }
  return difference / largest;
}

// The largest difference from the direct product, relative to its largest output, that a correct
// transform shows: F(4x4, 3x3)'s rounding stays near 1e-6 at these shapes; a wrong tile is off by
// the order of the output itself.
constexpr double kTolerance = 1e-4;

// Prints the layer's row; false if either transform's output is wrong.
template <std::int64_t Cin, std::int64_t Cout, std::int64_t H, std::int64_t Padding>
bool compare(const char* layer, int samples, std::int64_t batch) {
  constexpr std::int64_t kOut = H + 2 * Padding - 2;
  constexpr nn::detail::Window kWindow{Cin, H, H, 3, 1, Padding, kOut, kOut};
  using Direct = nn::detail::IndirectConvolution<kWindow>;
  WinogradForward<2, Cin, Cout, H, Padding> f2;
  WinogradForward<4, Cin, Cout, H, Padding> f4;
  constexpr bool kF4 = decltype(f4)::kApplicable;

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Tensor<float> x({batch, Cin, H, H}), w({Cout, Cin, 3, 3});
  for (float& v : x.span()) v = uniform(rng);
  for (float& v : w.span()) v = uniform(rng) / std::sqrt(float(Cin * 9));
  Tensor<float> y_direct({batch, Cout, kOut, kOut}), y2({batch, Cout, kOut, kOut}),
      y4({batch, Cout, kOut, kOut});
  Tensor<float> padded({nn::detail::padded_size(kWindow)}), product({Cout, Direct::kProductLd});

  auto direct = [&] {
    for (std::int64_t b = 0; b < batch; ++b)
      Direct::run(Cout, w.data(), x.data() + b * Cin * H * H, padded.data(), product.data(),
                  y_direct.data() + b * Cout * kOut * kOut, static_cast<const float*>(nullptr));
  };
  auto f4_run = [&] {
    if constexpr (kF4) f4.run(x, w, y4);
  };

  std::vector<double> direct_s, f2_s, f4_s;
  direct();
  f2.run(x, w, y2);
  f4_run();
  for (int s = 0; s < samples; ++s) {
    coltrain::Stopwatch watch;
    direct();
    direct_s.push_back(watch.seconds());
    watch.restart();
    f2.run(x, w, y2);
    f2_s.push_back(watch.seconds());
    watch.restart();
    f4_run();
    f4_s.push_back(watch.seconds());
  }
  const double direct_ms = median(direct_s) * 1e3, f2_ms = median(f2_s) * 1e3;
  const double f2_difference = relative_difference(y_direct, y2);
  std::printf("| %s | %lld x %lld, %lldx%lld | %.2f | %.2f (%.2fx, %.1e) |", layer,
              static_cast<long long>(Cin), static_cast<long long>(Cout), static_cast<long long>(H),
              static_cast<long long>(H), direct_ms, f2_ms, direct_ms / f2_ms, f2_difference);
  double f4_difference = 0;
  if constexpr (kF4) {
    const double f4_ms = median(f4_s) * 1e3;
    f4_difference = relative_difference(y_direct, y4);
    std::printf(" %.2f (%.2fx, %.1e) |\n", f4_ms, direct_ms / f4_ms, f4_difference);
  } else {
    std::printf(" not applicable |\n");
  }
  const bool right = f2_difference <= kTolerance && f4_difference <= kTolerance;
  if (!right)
    std::fprintf(stderr,
                 "winograd_bench: %s: Winograd's output differs from the direct product's by "
                 "%.1e (F(2x2)) and %.1e (F(4x4)) of its largest value, over %.0e\n",
                 layer, f2_difference, f4_difference, kTolerance);
  return right;
}

}  // namespace

int main(int argc, char** argv) {
  const int samples = argc > 1 ? std::atoi(argv[1]) : 9;
  const std::int64_t batch = argc > 2 ? std::atoll(argv[2]) : 64;
  if (samples < 1 || batch < 1) {
    std::fprintf(stderr, "usage: winograd_bench [samples >= 1] [batch >= 1]\n");
    return 2;
  }
  std::printf("forward pass of %lld images, single thread, medians of %d alternating samples\n\n",
              static_cast<long long>(batch), samples);
  std::printf(
      "| layer | channels in x out, input | direct ms | F(2x2, 3x3) ms (speedup, max diff / max) "
      "| F(4x4, 3x3) ms (speedup, max diff / max) |\n");
  std::printf("| --- | --- | ---: | ---: | ---: |\n");
  // Every layer runs and prints its row even after a wrong one.
  const bool right[] = {compare<16, 16, 32, 1>("ResNet-20 stage 1", samples, batch),
                        compare<32, 32, 16, 1>("ResNet-20 stage 2", samples, batch),
                        compare<64, 64, 8, 1>("ResNet-20 stage 3", samples, batch),
                        compare<32, 64, 26, 0>("MnistConvNet conv2", samples, batch)};
  return std::all_of(std::begin(right), std::end(right), [](bool r) { return r; }) ? 0 : 1;
}
