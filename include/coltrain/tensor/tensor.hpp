#pragma once
// Tensor<T, Device>: an owning (or borrowing), contiguous, row-major array with a runtime shape,
// and TensorView<T, Device>: a non-owning window on one (a reshape, a slice along the first axis,
// or one sample). Layers read views and write views; networks own the tensors.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/device.hpp>
#include <coltrain/tensor/shape.hpp>
#include <coltrain/tensor/storage.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

namespace coltrain::tensor {

template <class T, class Device = Cpu>
class TensorView {
 public:
  using value_type = std::remove_const_t<T>;
  using device_type = Device;

  TensorView() = default;
  TensorView(T* data, Shape shape) : data_(data), shape_(shape) {}
  // A mutable view converts to a read-only one.
  template <class U>
    requires(std::is_const_v<T> && std::is_same_v<const U, T>)
  TensorView(TensorView<U, Device> other) : data_(other.data()), shape_(other.shape()) {}

  T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::int64_t extent(int axis) const { return shape_[axis]; }
  bool empty() const { return data_ == nullptr || numel() == 0; }

  // The elements, for host code.
  std::span<T> span() const
    requires std::same_as<Device, Cpu>
  {
    return {data_, static_cast<std::size_t>(numel())};
  }

  TensorView reshape(Shape shape) const {
    if (shape.numel() != numel())
      throw InvalidArgument("cannot reshape " + shape_.to_string() + " to " + shape.to_string());
    return {data_, shape};
  }

  // Items [begin, end) along the first axis.
  TensorView slice(std::int64_t begin, std::int64_t end) const {
    if (shape_.rank() == 0 || begin < 0 || end < begin || end > shape_[0])
      throw InvalidArgument("slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") is outside a tensor of shape " + shape_.to_string());
    Shape s = shape_;
    const std::int64_t stride = shape_[0] == 0 ? 0 : numel() / shape_[0];
    s = s.drop_front().with_front(end - begin);
    return {data_ + begin * stride, s};
  }

  // Item i along the first axis (one sample of a batch), without that axis.
  TensorView operator[](std::int64_t i) const { return slice(i, i + 1).reshape(shape_.drop_front()); }

 private:
  T* data_ = nullptr;
  Shape shape_;
};

template <class T, class Device = Cpu>
class Tensor {
 public:
  using value_type = T;
  using device_type = Device;

  Tensor() = default;
  explicit Tensor(Shape shape) : storage_(static_cast<std::size_t>(shape.numel())), shape_(shape) {}

  // A tensor whose elements live in memory the caller owns and keeps alive (a network's gradient
  // arena); a copy of it owns its own.
  static Tensor borrowing(T* data, Shape shape) {
    Tensor t;
    t.storage_ = Storage<T, Device>::borrow(data, static_cast<std::size_t>(shape.numel()));
    t.shape_ = shape;
    return t;
  }

  T* data() { return storage_.data(); }
  const T* data() const { return storage_.data(); }
  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::int64_t extent(int axis) const { return shape_[axis]; }
  // Elements the storage holds; resize() reuses it when the new shape fits.
  std::size_t capacity() const { return storage_.size(); }

  // Changes the shape. Storage is reallocated (and zeroed) only when the new shape does not fit, so
  // a network that sees a smaller last batch does not allocate.
  void resize(Shape shape) {
    if (static_cast<std::size_t>(shape.numel()) > storage_.size())
      storage_ = Storage<T, Device>(static_cast<std::size_t>(shape.numel()));
    shape_ = shape;
  }

  TensorView<T, Device> view() { return {data(), shape_}; }
  TensorView<const T, Device> view() const { return {data(), shape_}; }
  operator TensorView<T, Device>() { return view(); }
  operator TensorView<const T, Device>() const { return view(); }

  std::span<T> span()
    requires std::same_as<Device, Cpu>
  {
    return {data(), static_cast<std::size_t>(numel())};
  }
  std::span<const T> span() const
    requires std::same_as<Device, Cpu>
  {
    return {data(), static_cast<std::size_t>(numel())};
  }

  void fill(T value)
    requires std::same_as<Device, Cpu>
  {
    std::fill_n(data(), numel(), value);
  }

 private:
  Storage<T, Device> storage_;
  Shape shape_;
};

}  // namespace coltrain::tensor
