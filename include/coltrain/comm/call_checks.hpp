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
#include <string>
#include <type_traits>
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

  ErrorContext context(Collective collective) const {
    ErrorContext context;
    context.rank = rank;
    context.operation = operation_prefix + std::string(name_of(collective));
    return context;
  }

  std::size_t group_size() const { return static_cast<std::size_t>(size); }

  void require_size(Collective collective, const char* what, std::size_t actual,
                    std::size_t expected) const {
    if (actual == expected) return;
    throw InvalidArgument(std::string(what) + " has " + std::to_string(actual) +
                              " elements, expected " + std::to_string(expected),
                          context(collective));
  }

  void require_root(Collective collective, int root) const {
    if (root >= 0 && root < size) return;
    throw InvalidArgument("root " + std::to_string(root) + " is not a rank of this " +
                              std::to_string(size) + "-rank communicator",
                          context(collective));
  }

  void require_distinct(Collective collective, std::span<const std::byte> input,
                        std::span<const std::byte> output) const {
    const bool overlap = !input.empty() && !output.empty() &&
                         input.data() < output.data() + output.size() &&
                         output.data() < input.data() + input.size();
    if (!overlap) return;
    throw InvalidArgument("input and output overlap; use the in-place form", context(collective));
  }

  // The blocks `counts` and `displacements` (in elements, one per rank) describe, each checked to
  // lie inside a buffer of `elements` elements.
  BlockLayout block_layout(Collective collective, const char* side,
                           std::span<const std::size_t> counts,
                           std::span<const std::size_t> displacements, std::size_t elements,
                           std::size_t element_bytes) const {
    const std::string name(side);
    require_size(collective, (name + " counts").c_str(), counts.size(), group_size());
    require_size(collective, (name + " displacements").c_str(), displacements.size(), group_size());
    BlockLayout layout;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      if (displacements[i] > elements || counts[i] > elements - displacements[i]) {
        throw InvalidArgument(name + " block " + std::to_string(i) + " (" +
                                  std::to_string(counts[i]) + " elements at " +
                                  std::to_string(displacements[i]) + ") passes the end of the " +
                                  std::to_string(elements) + "-element buffer",
                              context(collective));
      }
      layout.bytes.push_back(counts[i] * element_bytes);
      layout.offsets.push_back(displacements[i] * element_bytes);
    }
    return layout;
  }

  // Where a call's buffers live: device when any non-empty one is device memory. Mixed memory is
  // refused: the host path would read device memory, the device path host memory. Empty buffers
  // live nowhere: on NCCL (`empty_on_device`) they take the device path (a no-op there, and the
  // algorithms a device call may name, 'native' among them), elsewhere the host path.
  Memory memory_of_call(Collective collective, std::span<const std::byte> input,
                        std::span<const std::byte> output, bool empty_on_device) const {
    if constexpr (!BuildConfig::kWithCuda) return Memory::kHost;
    if (input.empty() && output.empty()) return empty_on_device ? Memory::kDevice : Memory::kHost;
    const Memory in = input.empty() ? Memory::kHost : memory_of(input.data());
    const bool same = output.empty() || output.data() == input.data();
    const Memory out = same ? in : memory_of(output.data());
    if (!input.empty() && in != out) {
      throw InvalidArgument("input is " + std::string(name_of(in)) + " memory but output is " +
                                std::string(name_of(out)) +
                                " memory; a call's buffers must live in the same memory",
                            context(collective));
    }
    return out;
  }

  // What an allreduce of T travels as: the call's choice, else the communicator's (`fallback`) for
  // f32 with the automatic algorithm. Compression takes f32 and its own schedule, so it refuses
  // other types and named algorithms.
  template <class T>
  WireCompression wire_format(std::optional<WireCompression> requested, Algorithm algorithm,
                              WireCompression fallback) const {
    if (!requested) {
      const bool applies = std::is_same_v<T, float> && algorithm == Algorithm::kAutomatic;
      return applies ? fallback : WireCompression::kNone;
    }
    if (*requested == WireCompression::kNone) return *requested;
    if (!std::is_same_v<T, float>) {
      throw InvalidArgument(
          "allreduce: wire compression takes f32 data, not " + std::string(name_of(data_type_v<T>)),
          context(Collective::kAllreduce));
    }
    if (algorithm != Algorithm::kAutomatic) {
      throw InvalidArgument(
          "allreduce: wire compression has its own schedule (pairwise "
          "reduce-scatter, ring allgather); pass Algorithm::kAutomatic, not '" +
              std::string(name_of(algorithm)) + "'",
          context(Collective::kAllreduce));
    }
    return *requested;
  }
};

}  // namespace coltrain::comm::detail
