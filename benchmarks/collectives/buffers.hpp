#pragma once
// The buffers of one measurement, in host, pinned or device memory, filled with the exact inputs
// and checked against the expected results.

#include "exact_inputs.hpp"
#include "options.hpp"
#include "sizes.hpp"

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/storage.hpp>

#if COLTRAIN_WITH_CUDA
#include "../nccl_runner.hpp"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace coltrain::bench {

// `count` elements of T in the memory --mem names, with a host view for filling and checking: the
// buffer itself in host and pinned memory, a staging copy for device memory.
template <class T>
class Buffer {
 public:
  Buffer(MemoryKind memory, std::size_t count) : count_(count) {
    switch (memory) {
      case MemoryKind::kHost:
        staging_ = coltrain::tensor::Storage<T, coltrain::tensor::Cpu>(count);
        data_ = host_ = staging_.data();
        return;
#if COLTRAIN_WITH_CUDA
      case MemoryKind::kPinned:
        cuda_.emplace(CudaMemory::pinned(count * sizeof(T)));
        data_ = host_ = static_cast<T*>(cuda_->get());
        return;
      case MemoryKind::kDevice:
        cuda_.emplace(CudaMemory::device(count * sizeof(T)));
        staging_ = coltrain::tensor::Storage<T, coltrain::tensor::Cpu>(count);
        data_ = static_cast<T*>(cuda_->get());
        host_ = staging_.data();
        return;
#else
      default:
        throw coltrain::ConfigError(std::string("--mem ") + name_of(memory) +
                                    " needs a build with CUDA");
#endif
    }
  }

  T* data() { return data_; }
  std::span<T> host() { return {host_, count_}; }
  void upload() {
    if (data_ != host_) copy_in();
  }
  void download() {
    if (data_ != host_) copy_out();
  }

 private:
#if COLTRAIN_WITH_CUDA
  void copy_in() { cuda_->copy_from_host(host_, count_ * sizeof(T)); }
  void copy_out() { cuda_->copy_to_host(host_, count_ * sizeof(T)); }
  std::optional<CudaMemory> cuda_;
#else
  void copy_in() {}
  void copy_out() {}
#endif
  std::size_t count_;
  coltrain::tensor::Storage<T, coltrain::tensor::Cpu> staging_;  // as tensors are: huge pages
  T* data_ = nullptr;
  T* host_ = nullptr;
};

// The buffers of one case. Out of place the input and output are separate buffers; in place they
// are one, with the input (allgather) or the output (reduce_scatter) this rank's block of it.
template <class T>
class Workspace {
 public:
  Workspace(MemoryKind memory, const Case& c, bool in_place) : case_(c) {
    const std::size_t mine = static_cast<std::size_t>(c.rank) * c.block;
    in_count_ = c.collective == Collective::kAllgather ? c.block : c.count;
    out_count_ = c.collective == Collective::kReduceScatter ? c.block : c.count;
    if (in_place) {
      if (c.collective == Collective::kAllgather) in_offset_ = mine;
      if (c.collective == Collective::kReduceScatter) out_offset_ = mine;
      first_.emplace(memory, c.count);
    } else {
      first_.emplace(memory, in_count_);
      second_.emplace(memory, out_count_);
    }
  }

  T* input() { return first_->data() + in_offset_; }
  T* output() { return output_buffer().data() + out_offset_; }
  std::size_t input_count() const { return in_count_; }
  std::size_t output_count() const { return out_count_; }

  // Fresh inputs; the output poisoned with a value no result takes, so unwritten elements show.
  void fill(const Inputs& inputs) {
    const T poison = element<T>(-1000);
    std::span<T> out = output_buffer().host();
    std::fill(out.begin(), out.end(), poison);
    const bool has_input = case_.collective != Collective::kBroadcast || case_.rank == case_.root;
    if (has_input) {
      std::span<T> in = first_->host().subspan(in_offset_, in_count_);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = element<T>(inputs.value(case_.rank, i));
    }
    first_->upload();
    if (second_) second_->upload();
  }

  // Elements of this rank's output that differ from the expected result.
  std::int64_t count_wrong(const Inputs& inputs) {
    const Case& c = case_;
    if (c.collective == Collective::kReduce && c.rank != c.root) return 0;
    output_buffer().download();
    std::span<const T> out = output_buffer().host().subspan(out_offset_, out_count_);
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      T expected;
      switch (c.collective) {
        case Collective::kAllgather:
          expected = element<T>(inputs.value(static_cast<int>(i / c.block), i % c.block));
          break;
        case Collective::kBroadcast:
          expected = element<T>(inputs.value(c.root, i));
          break;
        case Collective::kAlltoall:  // block j came from rank j's block for this rank
          expected =
              element<T>(inputs.value(static_cast<int>(i / c.block),
                                      static_cast<std::size_t>(c.rank) * c.block + i % c.block));
          break;
        case Collective::kReduceScatter:
          expected = expected_reduction<T>(
              inputs.reduced(static_cast<std::size_t>(c.rank) * c.block + i), c.op, c.ranks);
          break;
        default:
          expected = expected_reduction<T>(inputs.reduced(i), c.op, c.ranks);
          break;
      }
      if (!same_bits(out[i], expected)) ++wrong;
    }
    return wrong;
  }

 private:
  Buffer<T>& output_buffer() { return second_ ? *second_ : *first_; }

  Case case_;
  std::size_t in_count_ = 0;
  std::size_t out_count_ = 0;
  std::size_t in_offset_ = 0;
  std::size_t out_offset_ = 0;
  std::optional<Buffer<T>> first_;
  std::optional<Buffer<T>> second_;
};

}  // namespace coltrain::bench
