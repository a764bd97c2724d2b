#pragma once
// The pieces of a convolution as GEMMs on the device, for the layers' fallback when cuDNN is
// absent: im2col (a batch of NCHW images to the matrix whose columns are the receptive fields),
// its adjoint col2im, and the swap of a tensor's two leading axes (NCHW <-> CNHW), which turns
// the GEMM's [Cout, N*OH*OW] product into NCHW and back.
//
// The column matrix of `count` images is [C*k*k, count*OH*OW]: row (c*k + kh)*k + kw, column
// n*OH*OW + oh*OW + ow. Keeping the images side by side in the columns makes the weight gradient,
// a sum over the batch, one GEMM with depth count*OH*OW.

#if !defined(__CUDACC__)
#error "coltrain/cuda/im2col.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/launch.cuh>

#include <cuda_runtime.h>

#include <cstdint>

namespace coltrain::cuda {

// A square-kernel convolution without dilation or groups, on one image.
struct ConvGeometry {
  std::int64_t channels = 0, height = 0, width = 0;  // input
  std::int64_t kernel = 1, stride = 1, padding = 0;
  std::int64_t out_height = 0, out_width = 0;

  COLTRAIN_HOST_DEVICE std::int64_t column_rows() const { return channels * kernel * kernel; }
  COLTRAIN_HOST_DEVICE std::int64_t out_plane() const { return out_height * out_width; }
  COLTRAIN_HOST_DEVICE std::int64_t image_size() const { return channels * height * width; }
};

namespace detail {

template <class T>
__global__ void im2col_kernel(const T* images, std::int64_t count, ConvGeometry g, T* col) {
  const std::int64_t plane = g.out_plane();
  const std::int64_t columns = count * plane;
  const std::int64_t total = g.column_rows() * columns;
  for (std::int64_t i = grid_index(); i < total; i += grid_stride()) {
    const std::int64_t row = i / columns, column = i - row * columns;
    const std::int64_t kw = row % g.kernel, kh = row / g.kernel % g.kernel;
    const std::int64_t c = row / (g.kernel * g.kernel);
    const std::int64_t n = column / plane, q = column - n * plane;
    const std::int64_t oh = q / g.out_width, ow = q - oh * g.out_width;
    const std::int64_t ih = oh * g.stride - g.padding + kh, iw = ow * g.stride - g.padding + kw;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    col[i] = inside ? images[((n * g.channels + c) * g.height + ih) * g.width + iw] : T(0.0f);
  }
}

// One thread per image element gathers the column entries read from it (no atomics: the same bits
// on every run), summed in float.
template <class T>
__global__ void col2im_kernel(const T* col, std::int64_t count, ConvGeometry g, T* images) {
  const std::int64_t plane = g.out_plane();
  const std::int64_t columns = count * plane;
  const std::int64_t total = count * g.image_size();
  for (std::int64_t i = grid_index(); i < total; i += grid_stride()) {
    const std::int64_t iw = i % g.width, ih = i / g.width % g.height;
    const std::int64_t c = i / (g.width * g.height) % g.channels;
    const std::int64_t n = i / g.image_size();
    float sum = 0.0f;
    for (std::int64_t kh = 0; kh < g.kernel; ++kh) {
      const std::int64_t y = ih + g.padding - kh;
      if (y < 0 || y % g.stride != 0 || y / g.stride >= g.out_height) continue;
      for (std::int64_t kw = 0; kw < g.kernel; ++kw) {
        const std::int64_t x = iw + g.padding - kw;
        if (x < 0 || x % g.stride != 0 || x / g.stride >= g.out_width) continue;
        const std::int64_t row = (c * g.kernel + kh) * g.kernel + kw;
        sum += static_cast<float>(
            col[row * columns + n * plane + y / g.stride * g.out_width + x / g.stride]);
      }
    }
    images[i] = T(sum);
  }
}

template <class T>
__global__ void swap_leading_axes_kernel(const T* in, std::int64_t a_extent, std::int64_t b_extent,
                                         std::int64_t inner, T* out) {
  const std::int64_t total = a_extent * b_extent * inner;
  for (std::int64_t i = grid_index(); i < total; i += grid_stride()) {
    const std::int64_t x = i % inner, ba = i / inner;
    const std::int64_t a = ba % a_extent, b = ba / a_extent;
    out[i] = in[(a * b_extent + b) * inner + x];
  }
}

}  // namespace detail

// col [g.column_rows(), count * g.out_plane()] = the receptive fields of `count` NCHW images.
template <class T>
void im2col(const T* images, std::int64_t count, const ConvGeometry& g, T* col,
            cudaStream_t stream) {
  const std::int64_t total = g.column_rows() * count * g.out_plane();
  if (total == 0) return;
  detail::im2col_kernel<kernel_t<T>>
      <<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(images, count, g, col);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

// images = the columns folded back onto the pixels they were read from (overwritten, not added to).
template <class T>
void col2im(const T* col, std::int64_t count, const ConvGeometry& g, T* images,
            cudaStream_t stream) {
  const std::int64_t total = count * g.image_size();
  if (total == 0) return;
  detail::col2im_kernel<kernel_t<T>>
      <<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(col, count, g, images);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

// out [b_extent, a_extent, inner] = in [a_extent, b_extent, inner] with its leading axes swapped.
template <class T>
void swap_leading_axes(const T* in, std::int64_t a_extent, std::int64_t b_extent,
                       std::int64_t inner, T* out, cudaStream_t stream) {
  const std::int64_t total = a_extent * b_extent * inner;
  if (total == 0) return;
  detail::swap_leading_axes_kernel<kernel_t<T>>
      <<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(in, a_extent, b_extent, inner, out);
  COLTRAIN_CHECK_CUDA_LAUNCH();
}

}  // namespace coltrain::cuda
