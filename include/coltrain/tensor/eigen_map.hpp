#pragma once
// Eigen views of host tensors, for code that wants Eigen's expressions on coltrain's memory without
// copying: as_matrix(view, rows, cols) is a row-major matrix map (the layout of a [rows, cols]
// tensor), as_array(view) a flat array map.
//
//   auto w = tensor::as_matrix(weight.view(), 10, 784);
//   w *= 0.5f;

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/eigen.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace coltrain::tensor {

template <class T>
using RowMajorMatrix = Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
auto as_matrix(TensorView<T, Cpu> view, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0 || rows * cols != view.numel())
    throw InvalidArgument("cannot view a tensor of shape " + view.shape().to_string() + " as a " +
                          std::to_string(rows) + " x " + std::to_string(cols) + " matrix");
  using Matrix = std::conditional_t<std::is_const_v<T>, const RowMajorMatrix<T>, RowMajorMatrix<T>>;
  return Eigen::Map<Matrix>(view.data(), rows, cols);
}

// A [rows, cols] tensor (rank 2) as a matrix.
template <class T>
auto as_matrix(TensorView<T, Cpu> view) {
  if (view.shape().rank() != 2)
    throw InvalidArgument("as_matrix needs a rank-2 tensor, got shape " + view.shape().to_string());
  return as_matrix(view, view.extent(0), view.extent(1));
}

template <class T>
auto as_array(TensorView<T, Cpu> view) {
  using Array = Eigen::Array<std::remove_const_t<T>, Eigen::Dynamic, 1>;
  using Mapped = std::conditional_t<std::is_const_v<T>, const Array, Array>;
  return Eigen::Map<Mapped>(view.data(), view.numel());
}

}  // namespace coltrain::tensor
