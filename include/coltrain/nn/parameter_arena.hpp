#pragma once
// ParameterArena<T, Device>: two allocations of one layout that hold every parameter of a network,
// one for the values and one for the gradients, in reverse state_dict order: the order in which a
// backward pass finishes the gradients and in which train::DataParallel packs its buckets.
// - A bucket of consecutive parameters is one contiguous range of the gradients, which the
//   allreduce averages in place (PyTorch DDP's gradient_as_bucket_view) instead of a copy into a
//   flat buffer and back; zero_grad() is one pass.
// - ZeRO-1 (train/zero_optimizer.hpp) splits the whole arena into one contiguous shard per rank:
//   a reduce-scatter of the gradients and an allgather of the values, both in place.
//
// Each parameter starts on a 64-byte boundary (the alignment Storage gives a tensor of its own, so
// the kernels see no difference). The padding between parameters is zero and stays zero, in
// values and gradients alike: no layer and no optimizer reads or writes it, so reducing or
// gathering it with its neighbours changes nothing.

#include <coltrain/core/error.hpp>
#include <coltrain/tensor/storage.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::nn {

template <class T, class Device>
class ParameterArena {
 public:
  // Elements per 64 bytes: where each parameter may start.
  static constexpr std::size_t kAlignment = std::max<std::size_t>(1, 64 / sizeof(T));

  ParameterArena() = default;
  // Lays out parameters of the given element counts, given in state_dict order; zeroed.
  explicit ParameterArena(std::span<const std::size_t> sizes) : sizes_(sizes.begin(), sizes.end()) {
    offsets_.resize(sizes_.size());
    std::size_t next = 0;
    for (std::size_t p = sizes_.size(); p-- > 0;) {
      offsets_[p] = next;
      next += padded(sizes_[p]);
    }
    values_ = tensor::Storage<T, Device>(next);
    gradients_ = tensor::Storage<T, Device>(next);
  }

  T* values() { return values_.data(); }
  T* gradients() { return gradients_.data(); }
  std::size_t size() const { return values_.size(); }  // elements, padding included
  std::size_t parameters() const { return sizes_.size(); }
  std::size_t offset(std::size_t p) const { return offsets_.at(p); }  // parameter p's first element
  std::size_t size(std::size_t p) const { return sizes_.at(p); }

  // Parameter p's elements and the padding after it: what a range holding it carries.
  std::size_t extent(std::size_t p) const { return padded(sizes_.at(p)); }

  // The elements [first, end) that hold exactly the given parameters, which must be consecutive
  // in the arena's order (descending state_dict indices, as a DataParallel bucket lists them).
  // Throws InvalidArgument otherwise.
  std::pair<std::size_t, std::size_t> range(std::span<const std::size_t> parameters) const {
    if (parameters.empty()) return {0, 0};
    const std::size_t first = offset(parameters.front());
    std::size_t end = first;
    for (const std::size_t p : parameters) {
      if (offset(p) != end) {
        throw InvalidArgument("ParameterArena: parameter " + std::to_string(p) +
                              " does not follow the previous one in the arena (parameters are "
                              "laid out in reverse state_dict order)");
      }
      end += extent(p);
    }
    return {first, end};
  }

 private:
  static constexpr std::size_t padded(std::size_t n) {
    return (n + kAlignment - 1) / kAlignment * kAlignment;
  }

  std::vector<std::size_t> sizes_;    // by state_dict index
  std::vector<std::size_t> offsets_;  // by state_dict index
  tensor::Storage<T, Device> values_;
  tensor::Storage<T, Device> gradients_;
};

}  // namespace coltrain::nn
