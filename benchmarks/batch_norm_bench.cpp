// BatchNorm2d's passes over memory, training mode, at the shapes of CIFAR ResNet-20's three stages
// (batch 64): forward (statistics, then normalisation) and backward (two sums, then the input
// gradient), on `threads` threads, against a plain read-and-write pass over the same activation
// (y = a x + b, the bandwidth such a pass can reach from the same caches).
//
// Each is run `samples` times back to back with warm caches; the best time is reported, with the
// rate counting the bytes each pass must move: forward 3 activations (read x twice, write y),
// backward 5 (read x and dy twice each, write dx), the reference 2.
//
// Usage: batch_norm_bench [samples (30)] [threads (2)]

#include <coltrain/core/timer.hpp>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>

namespace {

namespace nn = coltrain::nn;
namespace tensor = coltrain::tensor;

template <class F>
double best_seconds(int samples, F&& run) {
  double best = std::numeric_limits<double>::infinity();
  for (int s = 0; s < samples; ++s) {
    const coltrain::Stopwatch watch;
    run();
    best = std::min(best, watch.seconds());
  }
  return best;
}

template <std::int64_t C, std::int64_t H>
void measure(const char* stage, int samples, nn::Context<tensor::Cpu>& ctx) {
  constexpr std::int64_t kBatch = 64;
  using Shape = tensor::StaticShape<C, H, H>;
  nn::BatchNorm2dLayer<0.1, 1e-5, true, Shape, float, tensor::Cpu> layer;
  nn::Rng rng(1);
  layer.initialize(rng);
  tensor::Tensor<float> x({kBatch, C, H, H}), y(x.shape()), dy(x.shape()), dx(x.shape());
  std::mt19937 random(3);
  std::normal_distribution<float> normal(0.5f, 2.0f);
  for (float& v : x.span()) v = normal(random);
  for (float& v : dy.span()) v = normal(random);

  const double forward = best_seconds(samples, [&] { layer.forward(x.view(), y.view(), ctx); });
  const double backward =
      best_seconds(samples, [&] { layer.backward(x.view(), y.view(), dy.view(), dx.view(), ctx); });
  float* out = dx.data();
  const float* in = x.data();
  const double copy = best_seconds(samples, [&] {
    ctx.pool().parallel_for(x.numel(), [&](std::int64_t begin, std::int64_t end, int) {
      for (std::int64_t i = begin; i < end; ++i) out[i] = 1.5f * in[i] + 0.5f;
    });
  });
  const double gigabytes = static_cast<double>(x.numel()) * sizeof(float) / 1e9;
  std::printf(
      "%-8s %3lld x %2lld x %2lld   %7.3f ms %6.1f GB/s   %7.3f ms %6.1f GB/s   "
      "%7.3f ms %6.1f GB/s\n",
      stage, static_cast<long long>(C), static_cast<long long>(H), static_cast<long long>(H),
      forward * 1e3, 3 * gigabytes / forward, backward * 1e3, 5 * gigabytes / backward, copy * 1e3,
      2 * gigabytes / copy);
}

}  // namespace

int main(int argc, char** argv) {
  const int samples = argc > 1 ? std::max(1, std::atoi(argv[1])) : 30;
  const int threads = argc > 2 ? std::max(1, std::atoi(argv[2])) : 2;
  nn::Context<tensor::Cpu> ctx(threads);
  std::printf("BatchNormReLU2d, training, batch 64, %d thread(s), best of %d\n", threads, samples);
  std::printf(
      "stage    channels x map      forward              backward             "
      "a x + b pass\n");
  measure<16, 32>("stage 1", samples, ctx);
  measure<32, 16>("stage 2", samples, ctx);
  measure<64, 8>("stage 3", samples, ctx);
}
