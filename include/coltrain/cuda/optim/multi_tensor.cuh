#pragma once
// Multi-tensor launches: one kernel over many parameter tensors, as PyTorch's multi_tensor_apply.
// A table in device memory lists each tensor's pointers (model values and gradients, fp32 master
// weights and optimizer state) and the tensors are cut into chunks of kMultiTensorChunk elements;
// block b handles chunks b, b + gridDim.x, ... So a model of a hundred small tensors costs one
// launch instead of a hundred, and a large tensor still spreads over the whole GPU.

#if !defined(__CUDACC__)
#error "coltrain/cuda/optim/multi_tensor.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/elementwise.cuh>
#include <coltrain/cuda/launch.cuh>
#include <coltrain/tensor/cuda_storage.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace coltrain::cuda {

inline constexpr std::int64_t kMultiTensorChunk = 8192;

// One parameter tensor of a multi-tensor launch. Unused pointers are null.
template <class Storage>
struct TensorSlot {
  Storage* value;  // the model's parameter
  Storage* grad;   // the model's gradient
  float* master;   // fp32 master weights (mixed precision)
  float* state1;   // SGD's momentum buffer, Adam's exp_avg
  float* state2;   // Adam's exp_avg_sq
  std::int64_t size;
  std::int32_t weight_decay;  // 0 exempts the tensor (biases, norms)
  std::int32_t vectors;       // all pointers 16-byte aligned: packed loads and stores
};

struct TensorChunk {
  std::int32_t tensor;
  std::int32_t index;  // elements [index * kMultiTensorChunk, ...) of the tensor
};

// The table and its chunk list in device memory, built once.
template <class Storage>
class MultiTensorTable {
 public:
  MultiTensorTable() = default;
  explicit MultiTensorTable(std::vector<TensorSlot<Storage>> slots) {
    std::vector<TensorChunk> chunks;
    for (std::size_t t = 0; t < slots.size(); ++t) {
      TensorSlot<Storage>& slot = slots[t];
      slot.vectors = detail::all_aligned_for_vectors(slot.value, slot.grad, slot.master,
                                                     slot.state1, slot.state2)
                         ? 1
                         : 0;
      const std::int64_t count = (slot.size + kMultiTensorChunk - 1) / kMultiTensorChunk;
      if (count > std::numeric_limits<std::int32_t>::max()) {
        throw InvalidArgument("multi-tensor table: tensor #" + std::to_string(t) + " of " +
                              std::to_string(slot.size) + " elements is too large");
      }
      for (std::int64_t c = 0; c < count; ++c) {
        chunks.push_back({static_cast<std::int32_t>(t), static_cast<std::int32_t>(c)});
      }
    }
    if (chunks.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      throw InvalidArgument("multi-tensor table: too many chunks");
    }
    slots_ = upload(slots);
    chunks_ = upload(chunks);
    chunk_count_ = static_cast<int>(chunks.size());
  }

  const TensorSlot<Storage>* slots() const { return slots_.data(); }
  const TensorChunk* chunks() const { return chunks_.data(); }
  int chunk_count() const { return chunk_count_; }
  // Blocks for a launch over the table (0 when it has no elements: launch nothing).
  unsigned blocks() const { return static_cast<unsigned>(std::min(chunk_count_, 132 * 8)); }

 private:
  template <class U>
  static tensor::Storage<U, tensor::Cuda> upload(const std::vector<U>& host) {
    tensor::Storage<U, tensor::Cuda> device(host.size());
    if (!host.empty()) {
      COLTRAIN_CHECK_CUDA(
          cudaMemcpy(device.data(), host.data(), host.size() * sizeof(U), cudaMemcpyHostToDevice));
    }
    return device;
  }

  tensor::Storage<TensorSlot<Storage>, tensor::Cuda> slots_;
  tensor::Storage<TensorChunk, tensor::Cuda> chunks_;
  int chunk_count_ = 0;
};

namespace detail {

// Calls op.apply<V>(slot, i) for the packs of this block's chunks and op.apply<1> for the rest.
template <int V, class Storage, class Op>
__device__ void for_each_chunk_element(const TensorSlot<Storage>* slots, const TensorChunk* chunks,
                                       int chunk_count, const Op& op) {
  for (int c = static_cast<int>(blockIdx.x); c < chunk_count; c += static_cast<int>(gridDim.x)) {
    const TensorChunk chunk = chunks[c];
    const TensorSlot<Storage> slot = slots[chunk.tensor];
    const std::int64_t begin = static_cast<std::int64_t>(chunk.index) * kMultiTensorChunk;
    const std::int64_t end =
        begin + kMultiTensorChunk < slot.size ? begin + kMultiTensorChunk : slot.size;
    std::int64_t rest = begin;
    if (slot.vectors) {
      const std::int64_t packed_end = begin + (end - begin) / V * V;
      for (std::int64_t i = begin + std::int64_t{threadIdx.x} * V; i < packed_end;
           i += std::int64_t{blockDim.x} * V) {
        op.template apply<V>(slot, i);
      }
      rest = packed_end;
    }
    for (std::int64_t i = rest + threadIdx.x; i < end; i += blockDim.x)
      op.template apply<1>(slot, i);
  }
}

}  // namespace detail
}  // namespace coltrain::cuda
