#pragma once
// Conv2dLayer on the GPU: nn::Conv2d and nn::Conv2dReLU bound to tensor::Cuda, NCHW activations and
// the weight [out, in, kh, kw] as the CPU layer keeps them.
//
// Two engines compute the three products (output, weight gradient, input gradient):
// - cuDNN (the default where COLTRAIN_WITH_CUDNN): the legacy convolution API on NCHW tensor
//   descriptors, built once per batch size with the fastest algorithm of a timed cudnnFind*Ex
//   (the first call at each batch size runs them all; later calls only launch; with
//   COLTRAIN_CUDNN_BENCHMARK=0, cuDNN's heuristic choice instead). 16-bit data run on
//   tensor cores with fp32 accumulation; fp32 uses CUDNN_FMA_MATH (no TF32) and skips the FFT and
//   large-tile Winograd algorithms, whose rounding error is well above the direct products', so
//   fp32 results stay within about 1e-6 of the CPU layer's.
// - im2col + cuBLAS GEMM (ConvolutionBackend::kIm2colGemm; the default without cuDNN, or with
//   COLTRAIN_CUDA_CONV_IM2COL=1): a group of images' receptive fields as columns (cuda/im2col.cuh),
//   one GEMM per group and product; the image-major output is reordered to NCHW by one pass.
// The bias and the fused ReLU are one pass over the output after the convolution (cuDNN's fused
// bias-activation call supports only some algorithms and no identity activation with the fast
// ones), and their backward pass is one pass that masks the output gradient and sums it per channel
// (cuda/bias.cuh). Weight and bias gradients are added to, as on the CPU; the forward and backward
// passes allocate nothing after the first call at a batch size (scratch from ctx.workspace()), so
// they can be captured into a CUDA graph.

#if !defined(__CUDACC__)
#error "coltrain/cuda/nn/conv2d.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/device_memory.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/bias.cuh>
#include <coltrain/cuda/gemm.cuh>
#include <coltrain/cuda/im2col.cuh>
#include <coltrain/cuda/nn/initialize.cuh>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/tensor/device_copy.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cuda_runtime.h>
#if COLTRAIN_WITH_CUDNN
#include <cudnn.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef COLTRAIN_CUDA_CONV_IM2COL
#define COLTRAIN_CUDA_CONV_IM2COL 0
#endif

namespace coltrain::nn {

// How a Conv2d layer on the GPU computes its products.
enum class ConvolutionBackend {
  kCudnn,       // cuDNN's fastest algorithm per shape, timed once (needs COLTRAIN_WITH_CUDNN)
  kIm2colGemm,  // im2col + cuBLAS: no cuDNN needed; slower (the columns are k*k times the input)
};

inline constexpr ConvolutionBackend kDefaultConvolutionBackend =
    COLTRAIN_WITH_CUDNN && !COLTRAIN_CUDA_CONV_IM2COL ? ConvolutionBackend::kCudnn
                                                      : ConvolutionBackend::kIm2colGemm;

namespace detail {

inline std::size_t round_up_bytes(std::size_t bytes) {
  constexpr std::size_t kAlignment = 256;  // what cuBLAS and cuDNN like their buffers aligned to
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

inline std::string describe_convolution(const cuda::ConvGeometry& g, std::int64_t out_channels,
                                        std::int64_t batch) {
  return "Conv2d(" + std::to_string(g.channels) + " -> " + std::to_string(out_channels) +
         ", kernel " + std::to_string(g.kernel) + ", stride " + std::to_string(g.stride) +
         ", padding " + std::to_string(g.padding) + ") on " + std::to_string(batch) + " x " +
         std::to_string(g.channels) + " x " + std::to_string(g.height) + " x " +
         std::to_string(g.width);
}

// im2col + GEMM, a group of images at a time so that the columns fit kWorkspaceBudget.
template <class T>
class Im2colConvolution {
 public:
  Im2colConvolution(const cuda::ConvGeometry& geometry, std::int64_t out_channels)
      : geometry_(geometry), out_channels_(out_channels) {}

  std::size_t prepare_forward(std::int64_t batch, const T*, const T*, T*, Context<tensor::Cuda>&) {
    return workspace_bytes(batch);
  }
  std::size_t prepare_backward(std::int64_t batch, const T*, const T*, const T*, T*,
                               Context<tensor::Cuda>&) {
    return workspace_bytes(batch);
  }

  // y = conv(x, w): per group, col = im2col(x), P [Cout, group * OH*OW] = w [Cout, C*k*k] * col,
  // y = P with its two leading axes swapped.
  void forward(std::int64_t batch, const T* x, const T* w, T* y, void* workspace,
               Context<tensor::Cuda>& ctx) {
    const cuda::ConvGeometry& g = geometry_;
    const std::int64_t rows = g.column_rows(), plane = g.out_plane(), step = group(batch);
    const auto [col, product] = split(workspace, batch);
    for (std::int64_t first = 0; first < batch; first += step) {
      const std::int64_t count = std::min(step, batch - first);
      const std::int64_t columns = count * plane;
      cuda::im2col(x + first * g.image_size(), count, g, col, ctx.stream());
      cuda::gemm(ctx.cublas(), cuda::Transpose::kNo, cuda::Transpose::kNo, out_channels_, columns,
                 rows, 1.0f, w, rows, col, columns, 0.0f, product, columns);
      cuda::swap_leading_axes(product, out_channels_, count, plane,
                              y + first * out_channels_ * plane, ctx.stream());
    }
  }

  // Per group: D [Cout, group * OH*OW] = dy reordered, dw += D * im2col(x)^T, and unless dx is
  // null, dx = col2im(w^T * D).
  void backward(std::int64_t batch, const T* x, const T* w, const T* dy, T* dw, T* dx,
                void* workspace, Context<tensor::Cuda>& ctx) {
    const cuda::ConvGeometry& g = geometry_;
    const std::int64_t rows = g.column_rows(), plane = g.out_plane(), step = group(batch);
    const auto [col, grad] = split(workspace, batch);
    for (std::int64_t first = 0; first < batch; first += step) {
      const std::int64_t count = std::min(step, batch - first);
      const std::int64_t columns = count * plane;
      cuda::swap_leading_axes(dy + first * out_channels_ * plane, count, out_channels_, plane,
                              grad, ctx.stream());
      cuda::im2col(x + first * g.image_size(), count, g, col, ctx.stream());
      cuda::gemm(ctx.cublas(), cuda::Transpose::kNo, cuda::Transpose::kYes, out_channels_, rows,
                 columns, 1.0f, grad, columns, col, columns, 1.0f, dw, rows);
      if (dx == nullptr) continue;
      cuda::gemm(ctx.cublas(), cuda::Transpose::kYes, cuda::Transpose::kNo, rows, columns,
                 out_channels_, 1.0f, w, rows, grad, columns, 0.0f, col, columns);
      cuda::col2im(col, count, g, dx + first * g.image_size(), ctx.stream());
    }
  }

 private:
  static constexpr std::size_t kWorkspaceBudget = std::size_t{64} << 20;

  std::size_t bytes_per_image() const {
    return static_cast<std::size_t>((geometry_.column_rows() + out_channels_) *
                                    geometry_.out_plane()) *
           sizeof(T);
  }
  std::int64_t group(std::int64_t batch) const {
    const auto fits = static_cast<std::int64_t>(kWorkspaceBudget / bytes_per_image());
    return std::clamp<std::int64_t>(fits, 1, std::max<std::int64_t>(batch, 1));
  }
  std::size_t column_bytes(std::int64_t batch) const {
    return round_up_bytes(
        static_cast<std::size_t>(group(batch) * geometry_.column_rows() * geometry_.out_plane()) *
        sizeof(T));
  }
  std::size_t workspace_bytes(std::int64_t batch) const {
    return column_bytes(batch) +
           static_cast<std::size_t>(group(batch) * out_channels_ * geometry_.out_plane()) *
               sizeof(T);
  }
  // The columns, then the [Cout, group * OH*OW] product or gradient.
  std::pair<T*, T*> split(void* workspace, std::int64_t batch) const {
    auto* bytes = static_cast<unsigned char*>(workspace);
    return {reinterpret_cast<T*>(bytes), reinterpret_cast<T*>(bytes + column_bytes(batch))};
  }

  cuda::ConvGeometry geometry_;
  std::int64_t out_channels_;
};

#if COLTRAIN_WITH_CUDNN

template <auto Destroy>
struct CudnnDestroy {
  template <class Descriptor>
  void operator()(Descriptor descriptor) const {
    Destroy(descriptor);
  }
};
using CudnnTensor = std::unique_ptr<std::remove_pointer_t<cudnnTensorDescriptor_t>,
                                    CudnnDestroy<&cudnnDestroyTensorDescriptor>>;
using CudnnFilter = std::unique_ptr<std::remove_pointer_t<cudnnFilterDescriptor_t>,
                                    CudnnDestroy<&cudnnDestroyFilterDescriptor>>;
using CudnnConvolutionDescriptor =
    std::unique_ptr<std::remove_pointer_t<cudnnConvolutionDescriptor_t>,
                    CudnnDestroy<&cudnnDestroyConvolutionDescriptor>>;

template <class T>
constexpr cudnnDataType_t cudnn_data_type() {
  if constexpr (std::is_same_v<T, float>)
    return CUDNN_DATA_FLOAT;
  else if constexpr (std::is_same_v<T, half>)
    return CUDNN_DATA_HALF;
  else
    return CUDNN_DATA_BFLOAT16;
}

// Algorithms whose rounding error is well above a direct product's: not used for fp32.
inline bool coarse_algorithm(cudnnConvolutionFwdAlgo_t algo) {
  return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT || algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
inline bool coarse_algorithm(cudnnConvolutionBwdDataAlgo_t algo) {
  return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
         algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
inline bool coarse_algorithm(cudnnConvolutionBwdFilterAlgo_t algo) {
  return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
         algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// COLTRAIN_CUDNN_BENCHMARK=0 takes cuDNN's heuristic choice instead of timing every algorithm at
// each new batch size (as torch.backends.cudnn.benchmark = False): a faster start, and the way to
// run the convolution suites under compute-sanitizer, whose instrumentation makes the timing
// search take many minutes. Unset or 1: the search.
inline bool cudnn_search_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("COLTRAIN_CUDNN_BENCHMARK");
    if (value == nullptr || std::string_view(value) == "1") return true;
    if (std::string_view(value) == "0") return false;
    ErrorContext context;
    context.operation = "cuDNN algorithm choice";
    throw ConfigError("COLTRAIN_CUDNN_BENCHMARK is \"" + std::string(value) +
                          "\", expected 0 (heuristics) or 1 (time the algorithms)",
                      context);
  }();
  return enabled;
}

template <class Algo>
struct CudnnChoice {
  Algo algo;
  std::size_t workspace_bytes;
};

// The descriptors of one batch size, and the algorithms chosen for it. Each product has its own
// convolution descriptor because each carries the math type of its algorithm.
struct CudnnPlan {
  std::int64_t batch = 0;
  CudnnTensor x, y;
  CudnnConvolutionDescriptor forward_convolution, data_convolution, filter_convolution;
  std::optional<CudnnChoice<cudnnConvolutionFwdAlgo_t>> forward;
  std::optional<CudnnChoice<cudnnConvolutionBwdDataAlgo_t>> backward_data;
  std::optional<CudnnChoice<cudnnConvolutionBwdFilterAlgo_t>> backward_filter;
};

template <class T>
class CudnnConvolution {
  static constexpr cudnnDataType_t kType = cudnn_data_type<T>();
  static constexpr bool kFp32 = std::is_same_v<T, float>;
  // cudnnFind*Ex tries the algorithms that fit this much scratch (freed again after the search).
  static constexpr std::size_t kFindWorkspaceLimit = std::size_t{256} << 20;

 public:
  CudnnConvolution(const cuda::ConvGeometry& geometry, std::int64_t out_channels)
      : geometry_(geometry), out_channels_(out_channels) {
    cudnnFilterDescriptor_t filter = nullptr;
    COLTRAIN_CHECK_CUDNN(cudnnCreateFilterDescriptor(&filter));
    filter_.reset(filter);
    COLTRAIN_CHECK_CUDNN(cudnnSetFilter4dDescriptor(
        filter, kType, CUDNN_TENSOR_NCHW, as_int(out_channels), as_int(geometry.channels),
        as_int(geometry.kernel), as_int(geometry.kernel)));
  }

  // The first call at a batch size times the algorithms (writing y) and keeps the fastest.
  std::size_t prepare_forward(std::int64_t batch, const T* x, const T* w, T* y,
                              Context<tensor::Cuda>& ctx) {
    CudnnPlan& p = plan(batch);
    if (!p.forward) {
      cudnnConvolutionFwdAlgoPerf_t results[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      int count = 0;
      if (cudnn_search_enabled()) {
        const std::size_t bytes = find_workspace_bytes();
        DeviceBlock scratch = device_block(bytes);
        COLTRAIN_CHECK_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(
            ctx.cudnn(), p.x.get(), x, filter_.get(), w, p.forward_convolution.get(), p.y.get(), y,
            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, results, scratch.get(), bytes));
      } else {
        COLTRAIN_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(
            ctx.cudnn(), p.x.get(), filter_.get(), p.forward_convolution.get(), p.y.get(),
            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, results));
      }
      p.forward = choose(results, count, p.forward_convolution.get(), "forward", batch);
    }
    return p.forward->workspace_bytes;
  }

  void forward(std::int64_t batch, const T* x, const T* w, T* y, void* workspace,
               Context<tensor::Cuda>& ctx) {
    CudnnPlan& p = plan(batch);
    const float one = 1.0f, zero = 0.0f;
    COLTRAIN_CHECK_CUDNN(cudnnConvolutionForward(
        ctx.cudnn(), &one, p.x.get(), x, filter_.get(), w, p.forward_convolution.get(),
        p.forward->algo, workspace, p.forward->workspace_bytes, &zero, p.y.get(), y));
  }

  // As prepare_forward, for the weight gradient and (unless dx is null) the input gradient; the
  // search writes dx and a weight-sized scratch, never the weight gradient.
  std::size_t prepare_backward(std::int64_t batch, const T* x, const T* w, const T* dy, T* dx,
                               Context<tensor::Cuda>& ctx) {
    CudnnPlan& p = plan(batch);
    if (!p.backward_filter) {
      cudnnConvolutionBwdFilterAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      int count = 0;
      if (cudnn_search_enabled()) {
        const std::size_t bytes = find_workspace_bytes();
        DeviceBlock scratch = device_block(bytes);
        DeviceBlock weight_scratch = device_block(static_cast<std::size_t>(
            out_channels_ * geometry_.column_rows() * static_cast<std::int64_t>(sizeof(T))));
        COLTRAIN_CHECK_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            ctx.cudnn(), p.x.get(), x, p.y.get(), dy, p.filter_convolution.get(), filter_.get(),
            weight_scratch.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, results,
            scratch.get(), bytes));
      } else {
        COLTRAIN_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            ctx.cudnn(), p.x.get(), p.y.get(), p.filter_convolution.get(), filter_.get(),
            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, results));
      }
      p.backward_filter =
          choose(results, count, p.filter_convolution.get(), "weight-gradient", batch);
    }
    if (dx != nullptr && !p.backward_data) {
      cudnnConvolutionBwdDataAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      int count = 0;
      if (cudnn_search_enabled()) {
        const std::size_t bytes = find_workspace_bytes();
        DeviceBlock scratch = device_block(bytes);
        COLTRAIN_CHECK_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(
            ctx.cudnn(), filter_.get(), w, p.y.get(), dy, p.data_convolution.get(), p.x.get(), dx,
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, results, scratch.get(), bytes));
      } else {
        COLTRAIN_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            ctx.cudnn(), filter_.get(), p.y.get(), p.data_convolution.get(), p.x.get(),
            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, results));
      }
      p.backward_data = choose(results, count, p.data_convolution.get(), "input-gradient", batch);
    }
    const std::size_t data_bytes = dx != nullptr ? p.backward_data->workspace_bytes : 0;
    return std::max(p.backward_filter->workspace_bytes, data_bytes);
  }

  // dw += the weight gradient (beta = 1); dx = the input gradient unless dx is null. The two
  // products run one after the other on the stream, so they share the workspace.
  void backward(std::int64_t batch, const T* x, const T* w, const T* dy, T* dw, T* dx,
                void* workspace, Context<tensor::Cuda>& ctx) {
    CudnnPlan& p = plan(batch);
    const float one = 1.0f, zero = 0.0f;
    COLTRAIN_CHECK_CUDNN(cudnnConvolutionBackwardFilter(
        ctx.cudnn(), &one, p.x.get(), x, p.y.get(), dy, p.filter_convolution.get(),
        p.backward_filter->algo, workspace, p.backward_filter->workspace_bytes, &one,
        filter_.get(), dw));
    if (dx == nullptr) return;
    COLTRAIN_CHECK_CUDNN(cudnnConvolutionBackwardData(
        ctx.cudnn(), &one, filter_.get(), w, p.y.get(), dy, p.data_convolution.get(),
        p.backward_data->algo, workspace, p.backward_data->workspace_bytes, &zero, p.x.get(), dx));
  }

 private:
  static int as_int(std::int64_t value) { return static_cast<int>(value); }

  static std::size_t find_workspace_bytes() {
    std::size_t free = 0, total = 0;
    COLTRAIN_CHECK_CUDA(cudaMemGetInfo(&free, &total));
    return std::min(kFindWorkspaceLimit, free / 2);
  }

  static CudnnTensor tensor_descriptor(std::int64_t n, std::int64_t c, std::int64_t h,
                                       std::int64_t w) {
    cudnnTensorDescriptor_t descriptor = nullptr;
    COLTRAIN_CHECK_CUDNN(cudnnCreateTensorDescriptor(&descriptor));
    CudnnTensor owned(descriptor);
    COLTRAIN_CHECK_CUDNN(cudnnSetTensor4dDescriptor(descriptor, CUDNN_TENSOR_NCHW, kType,
                                                    as_int(n), as_int(c), as_int(h), as_int(w)));
    return owned;
  }

  // Cross-correlation (what torch calls convolution), accumulated in fp32 for every data type.
  CudnnConvolutionDescriptor convolution_descriptor() const {
    cudnnConvolutionDescriptor_t descriptor = nullptr;
    COLTRAIN_CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&descriptor));
    CudnnConvolutionDescriptor owned(descriptor);
    const int padding = as_int(geometry_.padding), stride = as_int(geometry_.stride);
    COLTRAIN_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(
        descriptor, padding, padding, stride, stride, 1, 1, CUDNN_CROSS_CORRELATION,
        CUDNN_DATA_FLOAT));
    COLTRAIN_CHECK_CUDNN(
        cudnnSetConvolutionMathType(descriptor, kFp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
    return owned;
  }

  CudnnPlan& plan(std::int64_t batch) {
    for (CudnnPlan& p : plans_)
      if (p.batch == batch) return p;
    const cuda::ConvGeometry& g = geometry_;
    CudnnPlan p;
    p.batch = batch;
    p.x = tensor_descriptor(batch, g.channels, g.height, g.width);
    p.y = tensor_descriptor(batch, out_channels_, g.out_height, g.out_width);
    p.forward_convolution = convolution_descriptor();
    p.data_convolution = convolution_descriptor();
    p.filter_convolution = convolution_descriptor();
    int n = 0, c = 0, h = 0, w = 0;
    COLTRAIN_CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(
        p.forward_convolution.get(), p.x.get(), filter_.get(), &n, &c, &h, &w));
    if (n != batch || c != out_channels_ || h != g.out_height || w != g.out_width)
      throw Error("cuDNN computes an output of " + std::to_string(n) + " x " + std::to_string(c) +
                  " x " + std::to_string(h) + " x " + std::to_string(w) + " for " +
                  describe_convolution(g, out_channels_, batch) + ", not the layer's");
    plans_.push_back(std::move(p));
    return plans_.back();
  }

  // The fastest algorithm that ran (the results come sorted by time, or by the heuristics' guess)
  // and suits the data type; for 16-bit data the descriptor takes the math type of that result.
  template <class Perf>
  auto choose(const Perf* results, int count, cudnnConvolutionDescriptor_t convolution,
              const char* product, std::int64_t batch) const
      -> CudnnChoice<decltype(Perf::algo)> {
    for (int i = 0; i < count; ++i) {
      const Perf& result = results[i];
      // The heuristics list algorithms that need more scratch than the search would allow.
      if (result.status != CUDNN_STATUS_SUCCESS || result.memory > kFindWorkspaceLimit) continue;
      if constexpr (kFp32) {
        if (coarse_algorithm(result.algo)) continue;
      } else {
        COLTRAIN_CHECK_CUDNN(cudnnSetConvolutionMathType(convolution, result.mathType));
      }
      return {result.algo, result.memory};
    }
    throw BackendError("cuDNN", CUDNN_STATUS_NOT_SUPPORTED,
                       std::string("no ") + product + " algorithm runs " +
                           describe_convolution(geometry_, out_channels_, batch));
  }

  cuda::ConvGeometry geometry_;
  std::int64_t out_channels_;
  CudnnFilter filter_;
  std::vector<CudnnPlan> plans_;  // one per batch size seen, a few at most
};

#endif  // COLTRAIN_WITH_CUDNN

}  // namespace detail

template <std::size_t OutChannels, std::size_t Kernel, std::size_t Stride, std::size_t Padding,
          bool HasBias, bool FusedRelu, class In, class T>
class Conv2dLayer<OutChannels, Kernel, Stride, Padding, HasBias, FusedRelu, In, T, tensor::Cuda>
    : public WeightAndBias<T, tensor::Cuda, HasBias> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> ||
                    std::is_same_v<T, bfloat16>,
                "coltrain::nn::Conv2d on the GPU stores float, half or bfloat16");
  using Device = tensor::Cuda;
  using ConvShape = detail::Conv2dShape<In, OutChannels, Kernel, Stride, Padding>;
  static constexpr std::int64_t kCin = ConvShape::kCin, kH = ConvShape::kH, kW = ConvShape::kW;
  static constexpr std::int64_t kOutH = ConvShape::kOutH, kOutW = ConvShape::kOutW;
  static constexpr std::int64_t kCout = ConvShape::kCout, kK = ConvShape::kK, kHw = ConvShape::kHw;
  static constexpr std::int64_t kKernel = Kernel;
  static constexpr cuda::ConvGeometry kGeometry{
      kCin, kH, kW, kKernel, static_cast<std::int64_t>(Stride), static_cast<std::int64_t>(Padding),
      kOutH, kOutW};

 public:
  using Input = In;
  using Output = Chw<OutChannels, kOutH, kOutW>;
  static constexpr std::size_t kParameterCount =
      OutChannels * In::kDims[0] * Kernel * Kernel + (HasBias ? OutChannels : 0);
  static constexpr std::size_t kForwardMacs = static_cast<std::size_t>(kCout * kK * kHw);

  Conv2dLayer()
      : Parameters({kCout, kCin, kKernel, kKernel}, kCout),
        bias_partials_({HasBias ? cuda::bias_grad_scratch_floats(kCout) : 0}) {}

  // The same draws as the CPU layer (cuda/nn/initialize.cuh).
  void initialize(Rng& rng) {
    initialize_weight_and_bias(weight_, HasBias ? &bias_ : nullptr, kK, rng);
  }

  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const std::int64_t batch = checked_batch(in, out, "forward");
    if (batch == 0) return;
    const T* w = weight_.value.data();
    with_engine([&](auto& engine) {
      const std::size_t bytes = engine.prepare_forward(batch, in.data(), w, out.data(), ctx);
      engine.forward(batch, in.data(), w, out.data(), ctx.workspace(bytes), ctx);
    });
    cuda::add_bias(out.data(), HasBias ? bias_.value.data() : nullptr, {batch, kCout, kHw},
                   FusedRelu, ctx.stream());
  }

  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device> out,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    const std::int64_t batch = checked_batch(in, out, "backward");
    if (grad_out.numel() != out.numel() || (!grad_in.empty() && grad_in.numel() != in.numel()))
      throw InvalidArgument("coltrain::nn::Conv2d (CUDA) backward: the gradients " +
                            grad_out.shape().to_string() + " and " + grad_in.shape().to_string() +
                            " do not match the output " + out.shape().to_string() +
                            " and the input " + in.shape().to_string());
    if (batch == 0) return;
    T* dx = grad_in.empty() ? nullptr : grad_in.data();
    const T* w = weight_.value.data();
    const cuda::ChannelShape shape{batch, kCout, kHw};
    with_engine([&](auto& engine) {
      const std::size_t engine_bytes =
          engine.prepare_backward(batch, in.data(), w, grad_out.data(), dx, ctx);
      // The output gradient through the ReLU goes first in the workspace, the engine's after it.
      const std::size_t masked_bytes =
          FusedRelu ? detail::round_up_bytes(static_cast<std::size_t>(out.numel()) * sizeof(T))
                    : 0;
      auto* workspace = static_cast<unsigned char*>(ctx.workspace(masked_bytes + engine_bytes));
      const T* dy = grad_out.data();
      if constexpr (FusedRelu) {
        T* masked = reinterpret_cast<T*>(workspace);
        cuda::relu_backward_add_bias_grad(out.data(), dy, shape, masked,
                                          HasBias ? bias_.grad.data() : nullptr,
                                          bias_partials_.data(), ctx.stream());
        dy = masked;
      } else if constexpr (HasBias) {
        cuda::add_bias_grad(dy, shape, bias_.grad.data(), bias_partials_.data(), ctx.stream());
      }
      engine.backward(batch, in.data(), w, dy, weight_.grad.data(), dx,
                      masked_bytes + engine_bytes > 0 ? workspace + masked_bytes : nullptr, ctx);
    });
  }

  // Which engine computes the products (kDefaultConvolutionBackend unless set); kCudnn needs a
  // build with cuDNN. Each engine keeps its own per-batch-size setup.
  ConvolutionBackend backend() const { return backend_; }
  void set_backend(ConvolutionBackend backend) {
    if (backend == ConvolutionBackend::kCudnn && !COLTRAIN_WITH_CUDNN)
      throw ConfigError("coltrain::nn::Conv2d: the cuDNN backend needs a build with cuDNN "
                        "(COLTRAIN_WITH_CUDNN=1)");
    backend_ = backend;
  }

 private:
  static std::int64_t checked_batch(tensor::TensorView<const T, Device> in,
                                    tensor::TensorView<const T, Device> out, const char* pass) {
    const std::int64_t batch = in.shape().rank() > 0 ? in.extent(0) : 0;
    if (in.numel() != batch * kCin * kH * kW || out.numel() != batch * kCout * kHw)
      throw InvalidArgument(std::string("coltrain::nn::Conv2d (CUDA) ") + pass + ": input " +
                            in.shape().to_string() + " and output " + out.shape().to_string() +
                            " do not fit " + detail::describe_convolution(kGeometry, kCout, batch));
    return batch;
  }

  template <class F>
  void with_engine(F&& f) {
#if COLTRAIN_WITH_CUDNN
    if (backend_ == ConvolutionBackend::kCudnn) {
      f(cudnn_);
      return;
    }
#endif
    f(im2col_);
  }

  using Parameters = WeightAndBias<T, Device, HasBias>;
  using Parameters::bias_;
  using Parameters::weight_;
  tensor::Tensor<float, Device> bias_partials_;  // the bias gradient's per-slice sums
  ConvolutionBackend backend_ = kDefaultConvolutionBackend;
  detail::Im2colConvolution<T> im2col_{kGeometry, kCout};
#if COLTRAIN_WITH_CUDNN
  detail::CudnnConvolution<T> cudnn_{kGeometry, kCout};
#endif
};

}  // namespace coltrain::nn
