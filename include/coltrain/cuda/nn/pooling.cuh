#pragma once
// MaxPool2d, AvgPool2d and GlobalAvgPool on the GPU: the CPU layers' specialisations for
// tensor::Cuda, with their semantics (the first maximum of a window wins and NaN propagates;
// average pooling counts the zero padding; GlobalAvgPool yields a flat [C] sample). The kernels
// are in cuda/pooling_kernels.cuh; all work goes on the context's stream, and nothing allocates
// after a first call at the largest batch (max pooling's window-position buffer).

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn/pooling.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/cuda/pooling_kernels.cuh>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/pooling.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace coltrain::nn {

namespace detail {

template <class T>
inline constexpr bool kCudaPoolingType =
    std::is_same_v<T, float> || coltrain::detail::Float16Storage<T>;

// The CPU layers' shape checks and output shape, and the kernels' geometry.
template <class In, std::size_t Kernel, std::size_t Stride, std::size_t Padding>
struct CudaPoolGeometry {
  using Checked = PoolGeometry<In, Kernel, Stride, Padding>;
  using Kernels = cuda::pooling::Geometry<Checked::kH, Checked::kW, Kernel, Stride, Padding>;
  static constexpr std::int64_t kC = Checked::kC;
};

}  // namespace detail

template <std::size_t Kernel, std::size_t Stride, std::size_t Padding, class In, class T>
class MaxPool2dLayer<Kernel, Stride, Padding, In, T, tensor::Cuda>
    : public detail::PoolingBase<In, Kernel, Stride, Padding> {
  static_assert(detail::kCudaPoolingType<T>,
                "coltrain::nn::MaxPool2d on CUDA: T must be float, half or bfloat16");
  using Device = tensor::Cuda;
  using Geometry = detail::CudaPoolGeometry<In, Kernel, Stride, Padding>;
  using G = typename Geometry::Kernels;
  using WindowIndex = cuda::pooling::WindowIndex<G::kKernelSize>;

 public:
  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const std::int64_t planes = in.extent(0) * Geometry::kC;
    argmax_.resize({planes * G::kOutPlane});
    cuda::pooling::max_pool_forward<T, G>(in.data(), out.data(), argmax_.data(), planes,
                                          ctx.stream());
  }

  // Reads the window positions of the last forward pass.
  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    if (grad_in.empty()) return;
    const std::int64_t planes = in.extent(0) * Geometry::kC;
    cuda::pooling::max_pool_backward<T, G>(grad_out.data(), argmax_.data(), grad_in.data(), planes,
                                           ctx.stream());
  }

 private:
  tensor::Tensor<WindowIndex, Device> argmax_;  // per output: the maximum's place in its window
};

template <std::size_t Kernel, std::size_t Stride, std::size_t Padding, class In, class T>
class AvgPool2dLayer<Kernel, Stride, Padding, In, T, tensor::Cuda>
    : public detail::PoolingBase<In, Kernel, Stride, Padding> {
  static_assert(detail::kCudaPoolingType<T>,
                "coltrain::nn::AvgPool2d on CUDA: T must be float, half or bfloat16");
  using Device = tensor::Cuda;
  using Geometry = detail::CudaPoolGeometry<In, Kernel, Stride, Padding>;
  using G = typename Geometry::Kernels;

 public:
  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    cuda::pooling::avg_pool_forward<T, G>(in.data(), out.data(), in.extent(0) * Geometry::kC,
                                          ctx.stream());
  }

  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    if (grad_in.empty()) return;
    cuda::pooling::avg_pool_backward<T, G>(grad_out.data(), grad_in.data(),
                                           in.extent(0) * Geometry::kC, ctx.stream());
  }
};

template <class In, class T>
class GlobalAvgPoolLayer<In, T, tensor::Cuda> : public ParameterFreeLayer<In, Flat<In::kDims[0]>> {
  static_assert(In::kRank == 3,
                "coltrain::nn::GlobalAvgPool: the input must be an image, StaticShape<C, H, W>");
  static_assert(detail::kCudaPoolingType<T>,
                "coltrain::nn::GlobalAvgPool on CUDA: T must be float, half or bfloat16");
  using Device = tensor::Cuda;
  static constexpr std::int64_t kC = In::kDims[0];
  static constexpr std::int64_t kPlane = In::kDims[1] * In::kDims[2];

 public:
  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    cuda::pooling::global_avg_pool_forward<T, kPlane>(in.data(), out.data(), in.extent(0) * kC,
                                                      ctx.stream());
  }

  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    if (grad_in.empty()) return;
    cuda::pooling::global_avg_pool_backward<T, kPlane>(grad_out.data(), grad_in.data(),
                                                       in.extent(0) * kC, ctx.stream());
  }
};

}  // namespace coltrain::nn
