#pragma once
// Elementwise kernels on raw device pointers: ReLU forward and backward, the residual add, the
// ResNet block's tail relu(a + b) and its backward, axpy, scale and fill. T is float, double,
// coltrain::half or coltrain::bfloat16; 16-bit values are computed in float (accum_t), as on the
// CPU.
//
// Each kernel moves 16 bytes per load and store (a Pack, which the bias, cast, reduction,
// batch-norm and pooling kernels use too) when every pointer is 16-byte aligned, the case of whole
// tensors (cudaMalloc aligns to 256 bytes); a view at an odd offset runs the same operation one
// element at a time. All work is enqueued on `stream`; nothing synchronises, so the
// calls can be captured into a CUDA graph. Outputs may alias inputs of the same element (in place).

#if !defined(__CUDACC__)
#error "coltrain/cuda/elementwise.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/launch.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace coltrain::cuda {

// The type a kernel computes T in: double for double, float for float and the 16-bit types.
template <class T>
using accum_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

namespace detail {

template <class T>
inline constexpr bool kIsKernelElement = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                         std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <class T>
__device__ __forceinline__ accum_t<T> widen(T value) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return value;
  } else {
    return static_cast<float>(value);
  }
}

// Rounds to nearest even, as the host conversions of core/dtype.hpp.
template <class T>
__device__ __forceinline__ T narrow(accum_t<T> value) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return value;
  } else {
    return T(value);
  }
}

inline constexpr int kVectorBytes = 16;

// Elements of T in one 16-byte access.
template <class T>
inline constexpr int kVectorWidth = static_cast<int>(kVectorBytes / sizeof(T));

// V consecutive elements loaded or stored as whole 16-byte words (two for 8 floats).
template <class T, int V>
struct alignas(std::min<std::size_t>(sizeof(T) * V, kVectorBytes)) Pack {
  T v[V];
};

template <int V, class T>
__device__ __forceinline__ Pack<T, V> load(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

template <int V, class T>
__device__ __forceinline__ void store(T* p, const Pack<T, V>& pack) {
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

// The widest vector (of at most 16 bytes) that divides a plane, so no vector straddles two planes
// (the batch-norm and pooling kernels).
template <class T, std::int64_t kPlane>
COLTRAIN_HOST_DEVICE constexpr int widest_vector() {
  int vector = kVectorWidth<T>;
  while (vector > 1 && kPlane % vector != 0) vector /= 2;
  return vector;
}

inline bool aligned_for_vectors(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % kVectorBytes == 0;
}

template <class... Pointers>
bool all_aligned_for_vectors(const Pointers*... pointers) {
  return (aligned_for_vectors(pointers) && ...);
}

inline void check_count(std::int64_t n, const char* what) {
  if (n < 0)
    throw InvalidArgument(std::string(what) + ": negative element count " + std::to_string(n));
}

// Runs op.apply<V>(i) on packs [i, i + V) over a grid-stride loop, then op.apply<1> on the tail
// that does not fill a pack (fewer than V elements, one per thread of the first block).
template <int V, class Op>
__global__ void __launch_bounds__(kThreadsPerBlock) elementwise_kernel(Op op, std::int64_t n) {
  const std::int64_t packs = n / V;
  for (std::int64_t p = grid_index(); p < packs; p += grid_stride()) op.template apply<V>(p * V);
  if constexpr (V > 1) {
    const std::int64_t tail = packs * V + grid_index();
    if (tail < n) op.template apply<1>(tail);
  }
}

// Launches op over n elements, in packs of V when all of `pointers` are 16-byte aligned.
template <int V, class Op, class... Pointers>
void launch_elementwise(const Op& op, std::int64_t n, cudaStream_t stream, const char* what,
                        const Pointers*... pointers) {
  check_count(n, what);
  if (n == 0) return;
  if (all_aligned_for_vectors(pointers...)) {
    elementwise_kernel<V><<<blocks_for(n, V), kThreadsPerBlock, 0, stream>>>(op, n);
  } else {
    elementwise_kernel<1><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(op, n);
  }
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

// max(x, 0) keeping x's bits where it passes (NaN and -0 pass, as torch.relu and nn::ReluLayer).
template <class T>
__device__ __forceinline__ T relu_value(T x) {
  return widen(x) < accum_t<T>(0) ? narrow<T>(accum_t<T>(0)) : x;
}

template <class T>
struct ReluForward {
  const T* x;
  T* y;
  template <int V>
  __device__ void apply(std::int64_t i) const {
    const Pack<T, V> in = load<V>(x + i);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = relu_value(in.v[k]);
    store<V>(y + i, out);
  }
};

// dx = dy where the output is positive, else 0.
template <class T>
struct ReluBackward {
  const T* y;
  const T* dy;
  T* dx;
  template <int V>
  __device__ void apply(std::int64_t i) const {
    const Pack<T, V> out = load<V>(y + i);
    const Pack<T, V> grad = load<V>(dy + i);
    Pack<T, V> result;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      result.v[k] = widen(out.v[k]) > accum_t<T>(0) ? grad.v[k] : narrow<T>(accum_t<T>(0));
    }
    store<V>(dx + i, result);
  }
};

template <class T, bool kRelu>
struct Add {
  const T* a;
  const T* b;
  T* out;
  template <int V>
  __device__ void apply(std::int64_t i) const {
    const Pack<T, V> x = load<V>(a + i);
    const Pack<T, V> y = load<V>(b + i);
    Pack<T, V> result;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const T sum = narrow<T>(widen(x.v[k]) + widen(y.v[k]));
      result.v[k] = kRelu ? relu_value(sum) : sum;
    }
    store<V>(out + i, result);
  }
};

// The gradient of relu(a + b) is the same for a and b: dy where the output is positive.
template <class T>
struct AddReluBackward {
  const T* y;
  const T* dy;
  T* grad_a;  // either may be null: not written
  T* grad_b;
  template <int V>
  __device__ void apply(std::int64_t i) const {
    const Pack<T, V> out = load<V>(y + i);
    const Pack<T, V> grad = load<V>(dy + i);
    Pack<T, V> result;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      result.v[k] = widen(out.v[k]) > accum_t<T>(0) ? grad.v[k] : narrow<T>(accum_t<T>(0));
    }
    if (grad_a != nullptr) store<V>(grad_a + i, result);
    if (grad_b != nullptr) store<V>(grad_b + i, result);
  }
};

// y = alpha * x + (kAccumulate ? y : 0).
template <class T, bool kAccumulate>
struct Axpy {
  accum_t<T> alpha;
  const T* x;
  T* y;
  template <int V>
  __device__ void apply(std::int64_t i) const {
    const Pack<T, V> in = load<V>(x + i);
    Pack<T, V> out;
    if constexpr (kAccumulate) out = load<V>(y + i);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const accum_t<T> scaled = alpha * widen(in.v[k]);
      out.v[k] = narrow<T>(kAccumulate ? scaled + widen(out.v[k]) : scaled);
    }
    store<V>(y + i, out);
  }
};

template <class T>
struct Fill {
  T value;
  T* x;
  template <int V>
  __device__ void apply(std::int64_t i) const {
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = value;
    store<V>(x + i, out);
  }
};

template <class T>
void check_element() {
  static_assert(kIsKernelElement<T>,
                "coltrain::cuda: elementwise kernels take float, double, half or bfloat16");
}

}  // namespace detail

// y = relu(x).
template <class T>
void relu_forward(const T* x, T* y, std::int64_t n, cudaStream_t stream) {
  detail::check_element<T>();
  detail::launch_elementwise<detail::kVectorWidth<T>>(detail::ReluForward<T>{x, y}, n, stream,
                                                      "relu_forward", x, y);
}

// dx = y > 0 ? dy : 0, with y the forward output.
template <class T>
void relu_backward(const T* y, const T* dy, T* dx, std::int64_t n, cudaStream_t stream) {
  detail::check_element<T>();
  detail::launch_elementwise<detail::kVectorWidth<T>>(detail::ReluBackward<T>{y, dy, dx}, n, stream,
                                                      "relu_backward", y, dy, dx);
}

// out = a + b (the residual connection).
template <class T>
void add(const T* a, const T* b, T* out, std::int64_t n, cudaStream_t stream) {
  detail::check_element<T>();
  detail::launch_elementwise<detail::kVectorWidth<T>>(detail::Add<T, false>{a, b, out}, n, stream,
                                                      "add", a, b, out);
}

// out = relu(a + b), the sum rounded to T before the ReLU (the tail of a ResNet block).
template <class T>
void add_relu_forward(const T* a, const T* b, T* out, std::int64_t n, cudaStream_t stream) {
  detail::check_element<T>();
  detail::launch_elementwise<detail::kVectorWidth<T>>(detail::Add<T, true>{a, b, out}, n, stream,
                                                      "add_relu_forward", a, b, out);
}

// grad_a = grad_b = out > 0 ? grad_out : 0, with out the forward output. Either gradient may be
// null (not wanted) or grad_out itself.
template <class T>
void add_relu_backward(const T* out, const T* grad_out, T* grad_a, T* grad_b, std::int64_t n,
                       cudaStream_t stream) {
  detail::check_element<T>();
  detail::launch_elementwise<detail::kVectorWidth<T>>(
      detail::AddReluBackward<T>{out, grad_out, grad_a, grad_b}, n, stream, "add_relu_backward",
      out, grad_out, grad_a, grad_b);
}

// y = alpha * x + y.
template <class T>
void axpy(accum_t<T> alpha, const T* x, T* y, std::int64_t n, cudaStream_t stream) {
  detail::check_element<T>();
  detail::launch_elementwise<detail::kVectorWidth<T>>(detail::Axpy<T, true>{alpha, x, y}, n, stream,
                                                      "axpy", x, y);
}

// y = alpha * x (y may be x).
template <class T>
void scale(accum_t<T> alpha, const T* x, T* y, std::int64_t n, cudaStream_t stream) {
  detail::check_element<T>();
  detail::launch_elementwise<detail::kVectorWidth<T>>(detail::Axpy<T, false>{alpha, x, y}, n,
                                                      stream, "scale", x, y);
}

// x[i] = value.
template <class T>
void fill(T* x, T value, std::int64_t n, cudaStream_t stream) {
  detail::check_element<T>();
  detail::launch_elementwise<detail::kVectorWidth<T>>(detail::Fill<T>{value, x}, n, stream, "fill",
                                                      x);
}

}  // namespace coltrain::cuda
