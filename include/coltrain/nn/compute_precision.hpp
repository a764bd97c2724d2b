#pragma once
// Storage type versus compute type. Layers store parameters and activations as T and compute in
// compute_t<T>: double for double (gradient checks), float for everything else, so fp16 and bf16
// storage is computed with fp32 accumulation, as tensor cores do. When T is the compute type the
// helpers below are no-ops that hand back the caller's own memory.

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cstdint>
#include <type_traits>

namespace coltrain::nn {

template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

namespace detail {

template <class S, class T>
S to_compute_value(T value) {
  if constexpr (std::is_same_v<S, T>)
    return value;
  else
    return static_cast<S>(static_cast<float>(value));
}

template <class T, class S>
T to_storage_value(S value) {
  if constexpr (std::is_same_v<S, T>)
    return value;
  else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>)
    return static_cast<T>(value);
  else
    return T(static_cast<float>(value));
}

// A read-only view of `v` in compute precision: `v` itself, or a converted copy in `scratch`.
template <class T, class S = compute_t<T>>
tensor::TensorView<const S> compute_view(tensor::TensorView<const T> v, tensor::Tensor<S>& scratch) {
  if constexpr (std::is_same_v<S, T>) {
    return v;
  } else {
    scratch.resize(v.shape());
    const T* src = v.data();
    S* dst = scratch.data();
    for (std::int64_t i = 0, n = v.numel(); i < n; ++i) dst[i] = to_compute_value<S>(src[i]);
    return scratch.view();
  }
}

// Where to compute a result destined for `out`: `out` itself, or `scratch` (then store_result).
template <class T, class S = compute_t<T>>
tensor::TensorView<S> compute_target(tensor::TensorView<T> out, tensor::Tensor<S>& scratch) {
  if constexpr (std::is_same_v<S, T>) {
    return out;
  } else {
    scratch.resize(out.shape());
    return scratch.view();
  }
}

// Rounds a result computed by compute_target into `out` (nothing to do when T is S).
template <class T, class S>
void store_result(tensor::TensorView<const S> result, tensor::TensorView<T> out) {
  if constexpr (!std::is_same_v<S, T>) {
    const S* src = result.data();
    T* dst = out.data();
    for (std::int64_t i = 0, n = out.numel(); i < n; ++i) dst[i] = to_storage_value<T>(src[i]);
  }
}

// grad += delta, for a gradient stored as T and a delta computed as S.
template <class T, class S>
void accumulate(tensor::TensorView<T> grad, tensor::TensorView<const S> delta) {
  T* g = grad.data();
  const S* d = delta.data();
  for (std::int64_t i = 0, n = grad.numel(); i < n; ++i)
    g[i] = to_storage_value<T>(to_compute_value<S>(g[i]) + d[i]);
}

// sum of term(p[i]) over [0, n) in 16 independent lanes: a single running sum is a serial chain the
// compiler may not reorder (no -ffast-math), so it would not vectorise; lanes also grow the rounding
// error more slowly.
template <class S, class T, class F>
S lane_sum(const T* p, std::int64_t n, F&& term) {
  constexpr int kLanes = 16;
  S lanes[kLanes] = {};
  const std::int64_t full = n - n % kLanes;  // (a loop bound g++ 12 does not misjudge as overflowing)
  for (std::int64_t i = 0; i < full; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += term(p[i + l]);
  S total = 0;
  for (std::int64_t i = full; i < n; ++i) total += term(p[i]);
  for (int l = 0; l < kLanes; ++l) total += lanes[l];
  return total;
}

template <class S, class T>
S lane_sum(const T* p, std::int64_t n) {
  return lane_sum<S>(p, n, [](T v) { return to_compute_value<S>(v); });
}

}  // namespace detail
}  // namespace coltrain::nn
