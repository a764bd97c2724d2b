// A convolution's forward pass over a batch, single thread: Winograd F(2x2, 3x3)
// (nn/winograd_convolution.hpp: split, input transform, 16 GEMMs, output transform) against the
// direct product that Conv2d otherwise runs for stride-1 3x3 convolutions (IndirectConvolution:
// pad, GEMM reading the padded image in place, copy out), at the shapes of CIFAR ResNet-20's three
// stages and the MNIST ConvNet's second convolution. Both sides include their copies and
// transforms, and the weights' transform is counted on Winograd's side.
//
// The two are timed alternately, `samples` times each, and the medians are reported with the
// largest difference between their outputs relative to the largest output.
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
#include <random>
#include <vector>

namespace {

namespace nn = coltrain::nn;
using coltrain::tensor::Tensor;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <std::int64_t Cin, std::int64_t Cout, std::int64_t H, std::int64_t Padding>
void compare(const char* layer, int samples, std::int64_t batch) {
  constexpr std::int64_t kOut = H + 2 * Padding - 2;
  constexpr nn::detail::Window kWindow{Cin, H, H, 3, 1, Padding, kOut, kOut};
  using Direct = nn::detail::IndirectConvolution<kWindow>;
  using Winograd = nn::detail::WinogradConvolution<Cin, H, H, Padding>;
  // The layer's own grouping.
  constexpr std::int64_t kGroup =
      nn::detail::winograd_group_images(std::max(Cin, Cout), Winograd::kTiles);
  constexpr std::int64_t kLd = (kGroup * Winograd::kTiles + 15) / 16 * 16;

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Tensor<float> x({batch, Cin, H, H}), w({Cout, Cin, 3, 3});
  for (float& v : x.span()) v = uniform(rng);
  for (float& v : w.span()) v = uniform(rng) / std::sqrt(float(Cin * 9));
  Tensor<float> y_direct({batch, Cout, kOut, kOut}), y_winograd({batch, Cout, kOut, kOut});
  Tensor<float> padded({nn::detail::padded_size(kWindow)}), product({Cout, Direct::kProductLd});
  Tensor<float> split({Winograd::kSplitSize}), u({16 * Cout * Cin});
  Tensor<float> v({16 * nn::detail::winograd_position_stride(Cin, kLd)});
  Tensor<float> m({16 * nn::detail::winograd_position_stride(Cout, kLd)});

  auto direct = [&] {
    for (std::int64_t b = 0; b < batch; ++b)
      Direct::run(Cout, w.data(), x.data() + b * Cin * H * H, padded.data(), product.data(),
                  y_direct.data() + b * Cout * kOut * kOut, static_cast<const float*>(nullptr));
  };
  auto winograd = [&] {
    nn::detail::winograd_transform_weights(Cout, Cin, 0, Cout, w.data(), u.data());
    for (std::int64_t first = 0; first < batch; first += kGroup) {
      const std::int64_t count = std::min(kGroup, batch - first);
      for (std::int64_t g = 0; g < count; ++g) {
        Winograd::split_image(x.data() + (first + g) * Cin * H * H, split.data());
        Winograd::transform_input(split.data(), v.data(), kLd, g * Winograd::kTiles);
      }
      nn::detail::winograd_multiply(Cout, Cin, count * Winograd::kTiles, u.data(), v.data(),
                                    m.data(), kLd);
      for (std::int64_t g = 0; g < count; ++g)
        Winograd::template transform_output<false>(
            Cout, m.data(), kLd, g * Winograd::kTiles,
            y_winograd.data() + (first + g) * Cout * kOut * kOut,
            static_cast<const float*>(nullptr));
    }
  };

  std::vector<double> direct_s, winograd_s;
  direct();
  winograd();
  for (int s = 0; s < samples; ++s) {
    coltrain::Stopwatch watch;
    direct();
    direct_s.push_back(watch.seconds());
    watch.restart();
    winograd();
    winograd_s.push_back(watch.seconds());
  }
  double largest = 0, difference = 0;
  for (std::int64_t i = 0; i < y_direct.numel(); ++i) {
    largest = std::max(largest, double(std::abs(y_direct.data()[i])));
    difference = std::max(difference, double(std::abs(y_direct.data()[i] - y_winograd.data()[i])));
  }
  const double direct_ms = median(direct_s) * 1e3, winograd_ms = median(winograd_s) * 1e3;
  std::printf("| %s | %lld x %lld, %lldx%lld | %.2f | %.2f | %.2fx | %.1e |\n", layer,
              static_cast<long long>(Cin), static_cast<long long>(Cout), static_cast<long long>(H),
              static_cast<long long>(H), direct_ms, winograd_ms, direct_ms / winograd_ms,
              difference / largest);
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
      "| layer | channels in x out, input | direct ms | Winograd ms | speedup | max diff / max "
      "|\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
  compare<16, 16, 32, 1>("ResNet-20 stage 1", samples, batch);
  compare<32, 32, 16, 1>("ResNet-20 stage 2", samples, batch);
  compare<64, 64, 8, 1>("ResNet-20 stage 3", samples, batch);
  compare<32, 64, 26, 0>("MnistConvNet conv2", samples, batch);
  return 0;
}
