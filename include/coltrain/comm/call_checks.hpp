#pragma once
// The checks a Communicator makes on a call's arguments before any byte moves: sizes, roots,
// overlapping buffers, the blocks of the v-forms, where the buffers live and what an allreduce
// travels as. Each failure is an InvalidArgument naming the rank and the operation, thrown on the
// rank that passed the bad argument, before it takes part in anything the others could wait for.

#include <coltrain/comm/device/buffer_memory.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

namespace coltrain::comm::detail {

// Byte sizes and offsets of blocks given in elements.
struct BlockLayout {
  std::vector<std::size_t> bytes;
  std::vector<std::size_t> offsets;
};

struct CallChecks {
  int rank = 0;
  int size = 1;
  const char* operation_prefix = "";  // "staged " for the staged path's own checks

  ErrorContext context(Collective collective) const;

  std::size_t group_size() const { return static_cast<std::size_t>(size); }

  void require_size(Collective collective, const char* what, std::size_t actual,
                    std::size_t expected) const {
    if (actual != expected) size_mismatch(collective, what, actual, expected);
  }

  void require_root(Collective collective, int root) const {
    if (root < 0 || root >= size) root_outside(collective, root);
  }

  void require_distinct(Collective collective, std::span<const std::byte> input,
                        std::span<const std::byte> output) const;

  // The blocks `counts` and `displacements` (in elements, one per rank) describe, each checked to
  // lie inside a buffer of `elements` elements.
  BlockLayout block_layout(Collective collective, const char* side,
                           std::span<const std::size_t> counts,
                           std::span<const std::size_t> displacements, std::size_t elements,
                           std::size_t element_bytes) const;

  // Where a call's buffers live: device when any non-empty one is device memory. Mixed memory is
  // refused: the host path would read device memory, the device path host memory. Empty buffers
  // live nowhere: on NCCL (`empty_on_device`) they take the device path (a no-op there, and the
  // algorithms a device call may name, 'native' among them), elsewhere the host path.
  Memory memory_of_call(Collective collective, std::span<const std::byte> input,
                        std::span<const std::byte> output, bool empty_on_device) const {
    if constexpr (!BuildConfig::kWithCuda) return Memory::kHost;
    return memory_of_buffers(collective, input, output, empty_on_device);
  }

  // What an allreduce of T travels as: the call's choice, else the communicator's (`fallback`) for
  // f32 with the automatic algorithm. Compression takes f32 and its own schedule, so it refuses
  // other types and named algorithms.
  template <class T>
  WireCompression wire_format(std::optional<WireCompression> requested, Algorithm algorithm,
                              WireCompression fallback) const {
    return wire_format(data_type_v<T>, requested, algorithm, fallback);
  }
  WireCompression wire_format(DataType type, std::optional<WireCompression> requested,
                              Algorithm algorithm, WireCompression fallback) const;

 private:
  // The failures, out of line: the checks above are inlined into every typed call, their
  // messages are built once (in <coltrain/src.hpp> under separate compilation).
  [[noreturn]] void size_mismatch(Collective collective, const char* what, std::size_t actual,
                                  std::size_t expected) const;
  [[noreturn]] void root_outside(Collective collective, int root) const;
  Memory memory_of_buffers(Collective collective, std::span<const std::byte> input,
                           std::span<const std::byte> output, bool empty_on_device) const;
};

}  // namespace coltrain::comm::detail

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/comm/impl/call_checks.ipp>
#endif
