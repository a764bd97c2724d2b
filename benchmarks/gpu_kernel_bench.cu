// Per-kernel rates on the GPU against two ceilings measured in the same run: a large
// device-to-device copy (bytes read + written per second) and a large cuBLAS bf16 GEMM (FLOP/s).
// Each kernel is timed with CUDA events over repeated launches after a warm-up, on random data
// larger than the 50 MB L2, and reported as the median of the repeats, as GB/s of the fewest bytes
// it must move (each input read once, each output written once) and as a share of the copy ceiling.
//
//   build-gpu/benchmarks/gpu_kernel_bench [--csv FILE]

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/bias.cuh>
#include <coltrain/cuda/cast.cuh>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/cuda/nn.cuh>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace coltrain;

// Median milliseconds of `repeats` timed runs of `launch`, after `warmup` untimed ones.
double median_ms(cudaStream_t stream, const std::function<void()>& launch, int repeats = 20,
                 int warmup = 3) {
  for (int i = 0; i < warmup; ++i) launch();
  cudaEvent_t start, stop;
  COLTRAIN_CHECK_CUDA(cudaEventCreate(&start));
  COLTRAIN_CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    COLTRAIN_CHECK_CUDA(cudaEventRecord(start, stream));
    launch();
    COLTRAIN_CHECK_CUDA(cudaEventRecord(stop, stream));
    COLTRAIN_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    COLTRAIN_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  COLTRAIN_CHECK_CUDA(cudaEventDestroy(start));
  COLTRAIN_CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <class T>
T* device_random(std::int64_t n, std::uint32_t seed, float low = -1.f, float high = 1.f) {
  std::vector<T> host(static_cast<std::size_t>(n));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(low, high);
  for (auto& v : host) v = T(dist(gen));
  T* data = nullptr;
  COLTRAIN_CHECK_CUDA(cudaMalloc(&data, n * sizeof(T)));
  COLTRAIN_CHECK_CUDA(cudaMemcpy(data, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return data;
}

struct Row {
  std::string kernel, dtype;
  std::int64_t elements;
  double ms, rate;
  std::string unit;
  double share;
};

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--csv") csv_path = argv[i + 1];
  // Every kernel, the layers' too, runs on the context's stream, where the events are recorded.
  nn::Context<tensor::Cuda> ctx(1, 0);
  const cudaStream_t stream = ctx.stream();
  std::vector<Row> rows;

  // Ceiling 1: device-to-device copy of 1 GiB.
  const std::int64_t copy_bytes = std::int64_t{1} << 30;
  auto* copy_from = device_random<std::uint8_t>(copy_bytes, 1, 0, 255);
  std::uint8_t* copy_to = nullptr;
  COLTRAIN_CHECK_CUDA(cudaMalloc(&copy_to, copy_bytes));
  const double copy_ms = median_ms(stream, [&] {
    COLTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(copy_to, copy_from, copy_bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e6);
  rows.push_back(
      {"ceiling: device-to-device copy", "u8", copy_bytes, copy_ms, copy_gbs, "GB/s", 1});
  COLTRAIN_CHECK_CUDA(cudaFree(copy_from));
  COLTRAIN_CHECK_CUDA(cudaFree(copy_to));

  // Ceiling 2: cuBLAS bf16 GEMM 8192^3, fp32 accumulation.
  const int n = 8192;
  auto* a = device_random<bfloat16>(std::int64_t{n} * n, 2);
  auto* b = device_random<bfloat16>(std::int64_t{n} * n, 3);
  bfloat16* c = nullptr;
  COLTRAIN_CHECK_CUDA(cudaMalloc(&c, std::int64_t{n} * n * sizeof(bfloat16)));
  cublasHandle_t blas;
  COLTRAIN_CHECK_CUBLAS(cublasCreate(&blas));
  COLTRAIN_CHECK_CUBLAS(cublasSetStream(blas, stream));
  const float one = 1, zero = 0;
  const double gemm_ms = median_ms(stream, [&] {
    COLTRAIN_CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a,
                                       CUDA_R_16BF, n, b, CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  const double gemm_tflops = 2.0 * n * double(n) * n / (gemm_ms * 1e9);
  rows.push_back({"ceiling: cuBLAS GEMM 8192^3", "bf16", std::int64_t{n} * n, gemm_ms, gemm_tflops,
                  "TFLOP/s", 1});
  COLTRAIN_CHECK_CUBLAS(cublasDestroy(blas));
  COLTRAIN_CHECK_CUDA(cudaFree(a));
  COLTRAIN_CHECK_CUDA(cudaFree(b));
  COLTRAIN_CHECK_CUDA(cudaFree(c));

  // Memory-bound kernels: GB/s of their minimum traffic, against the copy.
  auto bandwidth = [&](const std::string& kernel, const std::string& dtype, std::int64_t elements,
                       double bytes, const std::function<void()>& launch) {
    const double ms = median_ms(stream, launch);
    const double gbs = bytes / (ms * 1e6);
    rows.push_back({kernel, dtype, elements, ms, gbs, "GB/s", gbs / copy_gbs});
  };
  // 64 Mi elements: 128 MiB in fp16, beyond the L2 whatever the kernel.
  const std::int64_t count = std::int64_t{1} << 26;
  auto* x = device_random<coltrain::half>(count, 4);
  auto* y = device_random<coltrain::half>(count, 5);
  auto* z = device_random<coltrain::half>(count, 6);
  auto* f = device_random<float>(count, 7);
  const double h = sizeof(coltrain::half);
  bandwidth("relu forward", "f16", count, 2 * h * count,
            [&] { cuda::relu_forward(x, z, count, stream); });
  bandwidth("relu backward", "f16", count, 3 * h * count,
            [&] { cuda::relu_backward(x, y, z, count, stream); });
  bandwidth("residual add + relu", "f16", count, 3 * h * count,
            [&] { cuda::add_relu_forward(x, y, z, count, stream); });
  bandwidth("cast f32 -> f16", "f32", count, (4 + h) * count,
            [&] { cuda::cast<coltrain::half>(f, z, count, stream); });
  bandwidth("cast f16 -> f32", "f16", count, (4 + h) * count,
            [&] { cuda::cast<float>(x, f, count, stream); });

  // Layers at ResNet-20's first stage, batch 512: [512, 16, 32, 32] fp16 (16 MiB).
  {
    using In = tensor::StaticShape<16, 32, 32>;
    const std::int64_t batch = 512, n = batch * 16 * 32 * 32;
    tensor::Tensor<coltrain::half, tensor::Cuda> in(In::batch(batch)), out(In::batch(batch)),
        grad(In::batch(batch)), grad_in(In::batch(batch));
    COLTRAIN_CHECK_CUDA(cudaMemcpy(in.data(), x, n * h, cudaMemcpyDeviceToDevice));
    COLTRAIN_CHECK_CUDA(cudaMemcpy(grad.data(), y, n * h, cudaMemcpyDeviceToDevice));
    nn::BatchNormReLU2d<>::Bind<In, coltrain::half, tensor::Cuda> bn;
    nn::Rng rng(1);
    bn.initialize(rng);
    // Minimum traffic: statistics read x once, normalising reads x and writes y.
    bandwidth("BatchNorm+ReLU forward (train) 512x16x32x32", "f16", n, 3 * h * n,
              [&] { bn.forward(in.view(), out.view(), ctx); });
    bandwidth("BatchNorm+ReLU backward 512x16x32x32", "f16", n, 5 * h * n,
              [&] { bn.backward(in.view(), out.view(), grad.view(), grad_in.view(), ctx); });
    nn::MaxPool2d<2>::Bind<In, coltrain::half, tensor::Cuda> pool;
    tensor::Tensor<coltrain::half, tensor::Cuda> pooled(decltype(pool)::Output::batch(batch));
    bandwidth("MaxPool 2x2 forward 512x16x32x32", "f16", n, 1.25 * h * n,
              [&] { pool.forward(in.view(), pooled.view(), ctx); });
    // Reads the pooled gradient and the winners (1 byte each), writes the input gradient.
    tensor::Tensor<coltrain::half, tensor::Cuda> pooled_grad(pooled.shape());
    bandwidth("MaxPool 2x2 backward 512x16x32x32", "f16", n, h * n + 0.25 * (h + 1) * n, [&] {
      pool.backward(in.view(), pooled.view(), pooled_grad.view(), grad_in.view(), ctx);
    });
  }

  // A convolution's bias + ReLU pass and its backward (mask + bias gradient), at MnistConvNet's
  // conv2 output [512, 64, 24, 24].
  {
    const cuda::ChannelShape shape{512, 64, 24 * 24};
    const std::int64_t n = shape.numel();
    auto* bias = device_random<coltrain::half>(64, 8);
    auto* grad_bias = device_random<coltrain::half>(64, 9);
    float* partials = nullptr;
    COLTRAIN_CHECK_CUDA(cudaMalloc(&partials, cuda::bias_grad_scratch_floats(64) * sizeof(float)));
    bandwidth("bias + ReLU 512x64x24x24", "f16", n, 2 * h * n,
              [&] { cuda::add_bias(x, bias, shape, true, stream); });
    bandwidth("ReLU mask + bias gradient 512x64x24x24", "f16", n, 3 * h * n, [&] {
      cuda::relu_backward_add_bias_grad(x, y, shape, z, grad_bias, partials, stream);
    });
    COLTRAIN_CHECK_CUDA(cudaFree(bias));
    COLTRAIN_CHECK_CUDA(cudaFree(grad_bias));
    COLTRAIN_CHECK_CUDA(cudaFree(partials));
  }
  COLTRAIN_CHECK_CUDA(cudaFree(x));
  COLTRAIN_CHECK_CUDA(cudaFree(y));
  COLTRAIN_CHECK_CUDA(cudaFree(z));
  COLTRAIN_CHECK_CUDA(cudaFree(f));

  std::printf("%-44s %-5s %12s %10s %10s %-8s %7s\n", "kernel", "type", "elements", "ms", "rate",
              "unit", "ceiling");
  for (const auto& r : rows)
    std::printf("%-44s %-5s %12lld %10.4f %10.1f %-8s %6.1f%%\n", r.kernel.c_str(), r.dtype.c_str(),
                static_cast<long long>(r.elements), r.ms, r.rate, r.unit.c_str(), 100 * r.share);
  if (!csv_path.empty()) {
    std::ofstream csv(csv_path);
    csv << "kernel,dtype,elements,ms,rate,unit,share_of_ceiling\n";
    for (const auto& r : rows)
      csv << '"' << r.kernel << "\"," << r.dtype << ',' << r.elements << ',' << r.ms << ','
          << r.rate << ',' << r.unit << ',' << r.share << '\n';
  }
  return 0;
}
