// The elementwise kernels, casts and reductions of coltrain/cuda against references computed on
// the host in double (random sizes including 0, 1, odd and non-multiples of the vector width;
// aligned and misaligned views; outputs poisoned with NaN before each call), and the ReLU, Flatten
// and Dropout layers on the GPU against the CPU layers (bit for bit: no layer here rounds
// differently on the device), also when a dropout step is replayed as a CUDA graph.

#include <coltrain/core/dtype.hpp>
#include <coltrain/cuda/cast.cuh>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/cuda/nn/activation.cuh>
#include <coltrain/cuda/nn/dropout.cuh>
#include <coltrain/cuda/nn/flatten.cuh>
#include <coltrain/cuda/reduce.cuh>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/tensor/device_copy.hpp>
#include <coltrain/tensor/tensor.hpp>
#include <coltrain/train/cuda_graph.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using coltrain::bfloat16;
using coltrain::half;
namespace cuda = coltrain::cuda;
namespace nn = coltrain::nn;
namespace tensor = coltrain::tensor;
namespace train = coltrain::train;

const std::vector<std::int64_t> kSizes = {0, 1, 3, 7, 8, 9, 31, 1023, 4097, 100003};

template <class T>
double to_double(T value) {
  return static_cast<double>(static_cast<float>(value));
}
template <>
double to_double<double>(double value) {
  return value;
}

template <class T>
T from_double(double value) {
  if constexpr (std::is_same_v<T, double>) {
    return value;
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(value);
  } else {
    return T(static_cast<float>(value));
  }
}

template <class T>
std::vector<T> random_values(std::int64_t n, std::uint64_t seed, double low = -2.0,
                             double high = 2.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(low, high);
  std::vector<T> values(static_cast<std::size_t>(n));
  for (T& v : values) {
    double x = dist(rng);
    if (x == 0.0) x = 0.5;
    v = from_double<T>(x);
  }
  return values;
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Device memory for n elements at `offset` elements past a 256-byte boundary (offset 1 breaks the
// 16-byte alignment of the vector path).
template <class T>
class DeviceArray {
 public:
  DeviceArray(std::int64_t n, std::int64_t offset)
      : storage_(tensor::Shape{n + offset + 1}), n_(n), offset_(offset) {
    poison();
  }
  T* get() { return storage_.data() + offset_; }
  const T* get() const { return storage_.data() + offset_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(static_cast<std::int64_t>(host.size()) == n_);
    if (n_ > 0)
      COLTRAIN_CHECK_CUDA(cudaMemcpy(get(), host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    COLTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<T> host(static_cast<std::size_t>(n_));
    if (n_ > 0)
      COLTRAIN_CHECK_CUDA(cudaMemcpy(host.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // All-ones bytes: NaN in every floating type, so an element the kernel skips shows.
  void poison() {
    COLTRAIN_CHECK_CUDA(cudaMemset(storage_.data(), 0xff, storage_.numel() * sizeof(T)));
  }
  // The element past the end must stay poisoned.
  bool guard_intact() const {
    T guard;
    COLTRAIN_CHECK_CUDA(cudaMemcpy(&guard, get() + n_, sizeof(T), cudaMemcpyDeviceToHost));
    const std::vector<unsigned char> ones(sizeof(T), 0xff);
    return std::memcmp(&guard, ones.data(), sizeof(T)) == 0;
  }

 private:
  tensor::Tensor<T, tensor::Cuda> storage_;
  std::int64_t n_;
  std::int64_t offset_;
};

template <class T>
double tolerance() {
  return std::is_same_v<T, half> || std::is_same_v<T, bfloat16> ? 1e-2 : 1e-6;
}

// ||out - ref|| / ||ref||, NaN never passing.
template <class T>
double relative_error(const std::vector<T>& out, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double o = to_double(out[i]);
    if (!std::isfinite(o)) return INFINITY;
    diff += (o - ref[i]) * (o - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

template <class T>
void check_close(const std::vector<T>& out, const std::vector<double>& ref,
                 const std::string& what) {
  INFO(what);
  CHECK(relative_error(out, ref) <= tolerance<T>());
}

template <class T>
void check_same_bits(const std::vector<T>& out, const std::vector<T>& ref,
                     const std::string& what) {
  INFO(what);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < out.size(); ++i) mismatches += same_bits(out[i], ref[i]) ? 0 : 1;
  CHECK(mismatches == 0);
}

template <class T>
void run_elementwise(std::int64_t n, std::int64_t offset) {
  const std::string where = "n " + std::to_string(n) + ", offset " + std::to_string(offset);
  const cudaStream_t stream = nullptr;
  const auto a = random_values<T>(n, 1 + n);
  const auto b = random_values<T>(n, 2 + n);
  DeviceArray<T> da(n, offset), db(n, offset), out(n, offset), out2(n, offset);
  da.upload(a);
  db.upload(b);

  // relu: bit for bit with the CPU layer's rule.
  cuda::relu_forward(da.get(), out.get(), n, stream);
  std::vector<T> relu_ref(a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    relu_ref[i] = to_double(a[i]) < 0 ? from_double<T>(0.0) : a[i];
  check_same_bits(out.download(), relu_ref, "relu_forward " + where);
  CHECK(out.guard_intact());

  out2.poison();
  cuda::relu_backward(out.get(), db.get(), out2.get(), n, stream);
  std::vector<T> relu_grad_ref(a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    relu_grad_ref[i] = to_double(relu_ref[i]) > 0 ? b[i] : from_double<T>(0.0);
  check_same_bits(out2.download(), relu_grad_ref, "relu_backward " + where);

  out.poison();
  cuda::add(da.get(), db.get(), out.get(), n, stream);
  std::vector<double> sum_ref(a.size()), add_relu_ref(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    sum_ref[i] = to_double(a[i]) + to_double(b[i]);
    add_relu_ref[i] = std::max(sum_ref[i], 0.0);
  }
  check_close(out.download(), sum_ref, "add " + where);
  CHECK(out.guard_intact());

  out.poison();
  cuda::add_relu_forward(da.get(), db.get(), out.get(), n, stream);
  const std::vector<T> add_relu = out.download();
  check_close(add_relu, add_relu_ref, "add_relu_forward " + where);

  // Its backward: both gradients, and one of them alone.
  out2.poison();
  DeviceArray<T> grad_b(n, offset);
  cuda::add_relu_backward(out.get(), da.get(), out2.get(), grad_b.get(), n, stream);
  std::vector<T> add_relu_grad_ref(a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    add_relu_grad_ref[i] = to_double(add_relu[i]) > 0 ? a[i] : from_double<T>(0.0);
  check_same_bits(out2.download(), add_relu_grad_ref, "add_relu_backward grad_a " + where);
  check_same_bits(grad_b.download(), add_relu_grad_ref, "add_relu_backward grad_b " + where);
  grad_b.poison();
  T* no_gradient = nullptr;
  cuda::add_relu_backward(out.get(), da.get(), no_gradient, grad_b.get(), n, stream);
  check_same_bits(grad_b.download(), add_relu_grad_ref, "add_relu_backward grad_b alone " + where);

  // axpy in place on a copy of b, scale out of place and in place.
  out.upload(b);
  cuda::axpy(cuda::accum_t<T>(0.75), da.get(), out.get(), n, stream);
  std::vector<double> axpy_ref(a.size()), scale_ref(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    axpy_ref[i] = 0.75 * to_double(a[i]) + to_double(b[i]);
    scale_ref[i] = -1.5 * to_double(a[i]);
  }
  check_close(out.download(), axpy_ref, "axpy " + where);
  out.poison();
  cuda::scale(cuda::accum_t<T>(-1.5), da.get(), out.get(), n, stream);
  check_close(out.download(), scale_ref, "scale " + where);
  out.upload(a);
  cuda::scale(cuda::accum_t<T>(-1.5), out.get(), out.get(), n, stream);
  check_close(out.download(), scale_ref, "scale in place " + where);

  out.poison();
  cuda::fill(out.get(), from_double<T>(3.25), n, stream);
  check_same_bits(out.download(), std::vector<T>(a.size(), from_double<T>(3.25)), "fill " + where);
  CHECK(out.guard_intact());
}

TEMPLATE_TEST_CASE("elementwise kernels match a double reference", "[gpu][elementwise]", float,
                   double, half, bfloat16) {
  for (std::int64_t n : kSizes) {
    for (std::int64_t offset : {0, 1}) run_elementwise<TestType>(n, offset);
  }
}

TEST_CASE("relu keeps NaN and -0 as the CPU layer does", "[gpu][elementwise]") {
  const std::vector<float> x = {-0.0f,     std::numeric_limits<float>::quiet_NaN(),
                                -INFINITY, INFINITY,
                                -1e-38f,   1e-38f,
                                -3.0f,     2.0f,
                                0.0f};
  const std::int64_t n = static_cast<std::int64_t>(x.size());
  DeviceArray<float> dx(n, 0), dy(n, 0);
  dx.upload(x);
  cuda::relu_forward(dx.get(), dy.get(), n, nullptr);
  std::vector<float> ref(x.size());
  nn::detail::relu_forward(x.data(), ref.data(), n);
  check_same_bits(dy.download(), ref, "special values");
}

// Every cast against the host conversion, including values that round to Inf, subnormals, ties.
template <class From, class To>
void run_cast(std::int64_t n, std::int64_t offset) {
  std::vector<From> in = random_values<From>(n, 7 + n, -70000.0, 70000.0);
  const float specials[] = {65504.0f,        65520.0f,       -65536.0f, 1e-7f, -3e-8f,
                            1.0f + 0x1p-11f, 1.0f + 0x1p-8f, 0.0f,      -0.0f, INFINITY,
                            -INFINITY,       1e-40f,         3.0e38f};
  for (std::size_t i = 0; i < in.size() && i < std::size(specials); ++i) {
    in[i] = from_double<From>(specials[i]);
  }
  DeviceArray<From> d_in(n, offset);
  DeviceArray<To> d_out(n, offset);
  d_in.upload(in);
  cuda::cast(d_in.get(), d_out.get(), n, nullptr);
  std::vector<To> ref(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if constexpr (std::is_same_v<From, double> || std::is_same_v<To, double>) {
      ref[i] = static_cast<To>(in[i]);
    } else if constexpr (std::is_same_v<To, float>) {
      ref[i] = static_cast<float>(in[i]);
    } else {
      ref[i] = To(static_cast<float>(in[i]));
    }
  }
  check_same_bits(d_out.download(), ref,
                  "cast n " + std::to_string(n) + " offset " + std::to_string(offset));
  CHECK(d_out.guard_intact());
}

TEST_CASE("casts give the host's bits", "[gpu][cast]") {
  for (std::int64_t n : kSizes) {
    for (std::int64_t offset : {0, 1}) {
      run_cast<float, half>(n, offset);
      run_cast<half, float>(n, offset);
      run_cast<float, bfloat16>(n, offset);
      run_cast<bfloat16, float>(n, offset);
      run_cast<half, bfloat16>(n, offset);
      run_cast<bfloat16, half>(n, offset);
      run_cast<float, double>(n, offset);
      run_cast<double, float>(n, offset);
    }
  }
}

template <class T>
void run_reductions(std::int64_t n, std::int64_t offset) {
  const std::string where = "n " + std::to_string(n) + ", offset " + std::to_string(offset);
  using A = cuda::accum_t<T>;
  std::vector<T> x = random_values<T>(n, 11 + n);
  DeviceArray<T> dx(n, offset);
  dx.upload(x);
  tensor::Tensor<double, tensor::Cuda> workspace(
      tensor::Shape{static_cast<std::int64_t>(cuda::kReductionWorkspaceBytes / sizeof(double))});
  tensor::Tensor<A, tensor::Cuda> results(tensor::Shape{3});
  tensor::Tensor<std::int32_t, tensor::Cuda> finite(tensor::Shape{1});
  COLTRAIN_CHECK_CUDA(cudaMemset(results.data(), 0xff, 3 * sizeof(A)));
  cuda::sum(dx.get(), n, results.data(), workspace.data(), nullptr);
  cuda::sum_of_squares(dx.get(), n, results.data() + 1, workspace.data(), nullptr);
  cuda::max_abs(dx.get(), n, results.data() + 2, workspace.data(), nullptr);
  cuda::all_finite(dx.get(), n, finite.data(), workspace.data(), nullptr);
  const auto got = tensor::to_host<A>(results.view());
  double sum = 0.0, squares = 0.0, max = 0.0;
  for (T v : x) {
    sum += to_double(v);
    squares += to_double(v) * to_double(v);
    max = std::max(max, std::fabs(to_double(v)));
  }
  INFO(where);
  // Accumulated in double on the device too: only the final rounding to A differs.
  const double eps = std::is_same_v<A, double> ? 1e-12 : 1e-6;
  CHECK(std::fabs(static_cast<double>(got.data()[0]) - sum) <= eps * std::max(1.0, squares));
  CHECK(std::fabs(static_cast<double>(got.data()[1]) - squares) <= eps * std::max(1.0, squares));
  CHECK(static_cast<double>(got.data()[2]) == max);
  CHECK(tensor::to_host<std::int32_t>(finite.view()).data()[0] == 1);

  if (n == 0) return;
  // One Inf or NaN anywhere makes all_finite 0; a NaN makes max_abs NaN.
  const double inf = std::numeric_limits<double>::infinity();
  for (const double special : {inf, -inf, std::nan("")}) {
    std::vector<T> bad = x;
    bad[static_cast<std::size_t>(n * 2 / 3)] = from_double<T>(special);
    dx.upload(bad);
    cuda::all_finite(dx.get(), n, finite.data(), workspace.data(), nullptr);
    cuda::max_abs(dx.get(), n, results.data() + 2, workspace.data(), nullptr);
    CHECK(tensor::to_host<std::int32_t>(finite.view()).data()[0] == 0);
    const double max_bad = static_cast<double>(tensor::to_host<A>(results.view()).data()[2]);
    if (std::isnan(special)) {
      CHECK(std::isnan(max_bad));
    } else {
      CHECK(max_bad == INFINITY);
    }
  }
}

TEMPLATE_TEST_CASE("reductions match a double reference and are deterministic", "[gpu][reduce]",
                   float, double, half, bfloat16) {
  for (std::int64_t n : kSizes) {
    for (std::int64_t offset : {0, 1}) run_reductions<TestType>(n, offset);
  }
  // The same input gives the same bits, run after run.
  const std::int64_t n = 1 << 22;
  DeviceArray<TestType> dx(n, 0);
  dx.upload(random_values<TestType>(n, 99));
  tensor::Tensor<double, tensor::Cuda> workspace(
      tensor::Shape{static_cast<std::int64_t>(cuda::kReductionWorkspaceBytes / sizeof(double))});
  tensor::Tensor<cuda::accum_t<TestType>, tensor::Cuda> result(tensor::Shape{1});
  cuda::sum(dx.get(), n, result.data(), workspace.data(), nullptr);
  const auto first = tensor::to_host<cuda::accum_t<TestType>>(result.view()).data()[0];
  for (int run = 0; run < 5; ++run) {
    cuda::sum(dx.get(), n, result.data(), workspace.data(), nullptr);
    CHECK(same_bits(tensor::to_host<cuda::accum_t<TestType>>(result.view()).data()[0], first));
  }
}

// ---- layers: the GPU specialisations against the CPU layers, same spec and seed ----

template <class T, class In>
tensor::Tensor<T, tensor::Cpu> random_batch(std::int64_t batch, std::uint64_t seed) {
  tensor::Tensor<T, tensor::Cpu> t(In::batch(batch));
  const auto values = random_values<T>(t.numel(), seed);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

template <class T>
std::vector<T> host_values(tensor::TensorView<const T, tensor::Cuda> view) {
  const auto host = tensor::to_host<T>(view);
  return {host.data(), host.data() + host.numel()};
}

template <class T>
std::vector<T> host_values(const tensor::Tensor<T, tensor::Cpu>& t) {
  return {t.data(), t.data() + t.numel()};
}

template <class T>
void poison(tensor::Tensor<T, tensor::Cuda>& t) {
  COLTRAIN_CHECK_CUDA(cudaMemset(t.data(), 0xff, t.numel() * sizeof(T)));
}

// Runs a layer spec on both devices, forward and backward, and compares bits.
template <class Spec, class In, class T>
void compare_layer(std::int64_t batch, nn::Mode mode, std::uint64_t seed, std::uint64_t step) {
  using CpuLayer = typename Spec::template Bind<In, T, tensor::Cpu>;
  using GpuLayer = typename Spec::template Bind<In, T, tensor::Cuda>;
  using Out = typename CpuLayer::Output;
  CpuLayer cpu;
  GpuLayer gpu;
  nn::Rng rng_cpu(seed), rng_gpu(seed);
  cpu.initialize(rng_cpu);
  gpu.initialize(rng_gpu);
  nn::Context<tensor::Cpu> cpu_ctx(1, seed);
  nn::Context<tensor::Cuda> gpu_ctx(1, seed);
  cpu_ctx.set_mode(mode);
  gpu_ctx.set_mode(mode);
  cpu_ctx.set_step(step);
  gpu_ctx.set_step(step);

  const auto x = random_batch<T, In>(batch, seed + 1);
  const auto dy = random_batch<T, Out>(batch, seed + 2);
  tensor::Tensor<T, tensor::Cpu> y_cpu(Out::batch(batch)), dx_cpu(In::batch(batch));
  cpu.forward(x.view(), y_cpu.view(), cpu_ctx);
  cpu.backward(x.view(), y_cpu.view(), dy.view(), dx_cpu.view(), cpu_ctx);

  const auto x_gpu = tensor::to_device(x);
  const auto dy_gpu = tensor::to_device(dy);
  tensor::Tensor<T, tensor::Cuda> y_gpu(Out::batch(batch)), dx_gpu(In::batch(batch));
  poison(y_gpu);
  poison(dx_gpu);
  gpu.forward(x_gpu.view(), y_gpu.view(), gpu_ctx);
  gpu.backward(x_gpu.view(), y_gpu.view(), dy_gpu.view(), dx_gpu.view(), gpu_ctx);
  gpu_ctx.synchronize();
  INFO("batch " << batch << ", step " << step);
  check_same_bits(host_values<T>(y_gpu.view()), host_values(y_cpu), "forward");
  check_same_bits(host_values<T>(dx_gpu.view()), host_values(dx_cpu), "backward");
  // An empty grad_in is not written (the first layer of a network).
  gpu.backward(x_gpu.view(), y_gpu.view(), dy_gpu.view(), {}, gpu_ctx);
  gpu_ctx.synchronize();
}

using Image = tensor::StaticShape<3, 5, 7>;

TEMPLATE_TEST_CASE("ReLU, Flatten and Dropout on the GPU equal the CPU layers bit for bit",
                   "[gpu][layers]", float, double, half, bfloat16) {
  for (std::int64_t batch : {1, 4, 7}) {
    for (nn::Mode mode : {nn::Mode::kTrain, nn::Mode::kEval}) {
      compare_layer<nn::ReLU, Image, TestType>(batch, mode, 5, 1);
      compare_layer<nn::Flatten, Image, TestType>(batch, mode, 5, 1);
      compare_layer<nn::Dropout<0.3>, Image, TestType>(batch, mode, 5, 1);
      compare_layer<nn::Dropout<0.3>, Image, TestType>(batch, mode, 5, 2);
      compare_layer<nn::Dropout<0.0>, Image, TestType>(batch, mode, 5, 3);
      compare_layer<nn::Dropout<0.9>, Image, TestType>(batch, mode, 123, 4);
    }
  }
}

TEST_CASE("a dropout mask differs between steps and layers", "[gpu][layers]") {
  using Layer = nn::DropoutLayer<0.5, Image, float, tensor::Cuda>;
  Layer first, second;
  nn::Rng rng(1);
  first.initialize(rng);
  second.initialize(rng);
  nn::Context<tensor::Cuda> ctx(1, 9);
  ctx.set_step(1);
  const auto x = tensor::to_device(random_batch<float, Image>(8, 3));
  tensor::Tensor<float, tensor::Cuda> y1(Image::batch(8)), y2(Image::batch(8)), y3(Image::batch(8));
  first.forward(x.view(), y1.view(), ctx);
  second.forward(x.view(), y2.view(), ctx);
  ctx.set_step(2);
  first.forward(x.view(), y3.view(), ctx);
  ctx.synchronize();
  const auto a = host_values<float>(y1.view()), b = host_values<float>(y2.view()),
             c = host_values<float>(y3.view());
  std::size_t zeros = 0;
  for (float v : a) zeros += v == 0.0f ? 1 : 0;
  CHECK(zeros > a.size() / 4);
  CHECK(zeros < a.size() * 3 / 4);
  CHECK(a != b);
  CHECK(a != c);
}

TEST_CASE("replays of a captured dropout step draw the masks of the steps after it",
          "[gpu][layers][graph]") {
  using Gpu = nn::DropoutLayer<0.5, Image, float, tensor::Cuda>;
  using Cpu = nn::DropoutLayer<0.5, Image, float, tensor::Cpu>;
  Gpu gpu;
  Cpu cpu;
  nn::Rng rng_gpu(4), rng_cpu(4);
  gpu.initialize(rng_gpu);
  cpu.initialize(rng_cpu);
  nn::Context<tensor::Cuda> ctx(1, 9);
  nn::Context<tensor::Cpu> cpu_ctx(1, 9);
  const auto x = random_batch<float, Image>(8, 3);
  const auto x_gpu = tensor::to_device(x);
  tensor::Tensor<float, tensor::Cuda> y(Image::batch(8));
  tensor::Tensor<float, tensor::Cpu> expected(Image::batch(8));
  const auto check_step = [&](std::uint64_t step) {
    ctx.synchronize();
    cpu_ctx.set_step(step);
    cpu.forward(x.view(), expected.view(), cpu_ctx);
    INFO("step " << step);
    check_same_bits(host_values<float>(y.view()), host_values(expected), "forward");
  };

  ctx.set_step(1);
  gpu.forward(x_gpu.view(), y.view(), ctx);  // eager: allocates, draws step 1's mask
  check_step(1);
  ctx.set_step(2);
  const auto graph =
      train::CudaGraph::capture(ctx.stream(), [&] { gpu.forward(x_gpu.view(), y.view(), ctx); });
  for (std::uint64_t step = 2; step <= 4; ++step) {
    poison(y);
    graph.replay(ctx.stream());
    check_step(step);
  }
  // An eager step draws the context's step again.
  ctx.set_step(9);
  gpu.forward(x_gpu.view(), y.view(), ctx);
  check_step(9);
}

}  // namespace
