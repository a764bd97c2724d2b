#pragma once
// DropoutLayer on the GPU: nn::Dropout<P> bound to tensor::Cuda. The mask of element i is the CPU
// layer's, nn::hash_uniform(seed, step, salt, i) >= P, computed by that same host-and-device
// function, so a GPU and a CPU network with the same seed drop the same elements and
// produce the same bits (the scaling is one float multiply, rounded as on the host).
//
// The step is read on the device, from a counter the layer sets just before its mask kernel: to
// the context's step in an eager step, and, in a step being captured into a CUDA graph, to one more
// than it holds. Each replay of a captured training step therefore draws the masks of the step
// after the last one, as eager steps would (the context's host-side step() does not see replays:
// set_step() before the next eager step, e.g. after restoring a checkpoint).

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn/dropout.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/dropout.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace coltrain::cuda {
namespace detail {

// One rounding, never fused into an FMA: the host computes the same product.
__device__ __forceinline__ float multiply_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double multiply_rn(double a, double b) { return __dmul_rn(a, b); }

// The layer's step counter before its mask kernel: `value` in an eager step, one more than it
// holds in a captured one (see the top of this header). A template, like every kernel in these
// headers, so that each translation unit may define it.
template <class Step>
__global__ void set_dropout_step(Step* step, Step value, bool advance) {
  *step = advance ? *step + 1 : value;
}

template <class T>
struct DropoutForward {
  const T* x;
  T* y;
  std::uint8_t* keep;
  double p;
  accum_t<T> scale;
  std::uint64_t seed;
  const std::uint64_t* step;
  std::uint64_t salt;
  template <int V>
  __device__ void apply(std::int64_t i) const {
    const Pack<T, V> in = load<V>(x + i);
    Pack<T, V> out;
    Pack<std::uint8_t, V> mask;
    const std::uint64_t step_now = *step;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const auto element = static_cast<std::uint64_t>(i + k);
      mask.v[k] = nn::hash_uniform(seed, step_now, salt, element) >= p ? 1 : 0;
      out.v[k] = narrow<T>(mask.v[k] ? multiply_rn(widen(in.v[k]), scale) : accum_t<T>(0));
    }
    store<V>(y + i, out);
    store<V>(keep + i, mask);
  }
};

template <class T>
struct DropoutBackward {
  const T* dy;
  T* dx;
  const std::uint8_t* keep;
  accum_t<T> scale;
  template <int V>
  __device__ void apply(std::int64_t i) const {
    const Pack<T, V> grad = load<V>(dy + i);
    const Pack<std::uint8_t, V> mask = load<V>(keep + i);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      out.v[k] = narrow<T>(mask.v[k] ? multiply_rn(widen(grad.v[k]), scale) : accum_t<T>(0));
    }
    store<V>(dx + i, out);
  }
};

}  // namespace detail
}  // namespace coltrain::cuda

namespace coltrain::nn {

template <double P, class In, class T>
class DropoutLayer<P, In, T, tensor::Cuda> : public ParameterFreeLayer<In, In> {
  static_assert(P >= 0.0 && P < 1.0,
                "coltrain::nn::Dropout: the drop probability must lie in [0, 1)");
  using S = cuda::accum_t<T>;

 public:
  // Draws the layer's identity from the initialisation stream, as the CPU layer.
  void initialize(Rng& rng) { salt_ = rng.next(); }

  void forward(tensor::TensorView<const T, tensor::Cuda> in,
               tensor::TensorView<T, tensor::Cuda> out, Context<tensor::Cuda>& ctx) {
    active_ = ctx.training() && P > 0.0;
    if (!active_) {
      copy(in.data(), out.data(), in.numel(), ctx.stream());
      return;
    }
    mask_.resize(in.shape());  // allocates on the first call at the largest batch only
    step_.resize({1});
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    COLTRAIN_CHECK_CUDA(cudaStreamIsCapturing(ctx.stream(), &capture));
    cuda::detail::set_dropout_step<std::uint64_t><<<1, 1, 0, ctx.stream()>>>(
        step_.data(), ctx.step(), capture == cudaStreamCaptureStatusActive);
    COLTRAIN_CHECK_CUDA_LAUNCH();
    const cuda::detail::DropoutForward<T> op{in.data(), out.data(), mask_.data(), P,
                                             kScale,    ctx.seed(), step_.data(), salt_};
    cuda::detail::launch_elementwise<cuda::detail::kVectorWidth<T>>(
        op, in.numel(), ctx.stream(), "dropout forward", op.x, op.y, op.keep);
  }

  void backward(tensor::TensorView<const T, tensor::Cuda>,
                tensor::TensorView<const T, tensor::Cuda>,
                tensor::TensorView<const T, tensor::Cuda> grad_out,
                tensor::TensorView<T, tensor::Cuda> grad_in, Context<tensor::Cuda>& ctx) {
    if (grad_in.empty()) return;
    if (!active_) {
      copy(grad_out.data(), grad_in.data(), grad_out.numel(), ctx.stream());
      return;
    }
    const cuda::detail::DropoutBackward<T> op{grad_out.data(), grad_in.data(), mask_.data(),
                                              kScale};
    cuda::detail::launch_elementwise<cuda::detail::kVectorWidth<T>>(
        op, grad_out.numel(), ctx.stream(), "dropout backward", op.dy, op.dx, op.keep);
  }

 private:
  static constexpr S kScale = static_cast<S>(1.0 / (1.0 - P));

  static void copy(const T* from, T* to, std::int64_t n, cudaStream_t stream) {
    if (n == 0 || from == to) return;
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(to, from, static_cast<std::size_t>(n) * sizeof(T),
                                        cudaMemcpyDeviceToDevice, stream));
  }

  std::uint64_t salt_ = 0;
  bool active_ = false;
  tensor::Tensor<std::uint8_t, tensor::Cuda> mask_;
  tensor::Tensor<std::uint64_t, tensor::Cuda> step_;  // the step the mask kernel reads
};

}  // namespace coltrain::nn
