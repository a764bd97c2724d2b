// The argument checks of comm/call_checks.hpp and their messages. Header-only builds include this
// file at the end of comm/call_checks.hpp; with COLTRAIN_SEPARATE_COMPILATION only
// <coltrain/src.hpp> includes it.
#pragma once

#include <coltrain/comm/call_checks.hpp>
#include <coltrain/comm/device/buffer_memory.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <cstddef>
#include <optional>
#include <span>
#include <string>

namespace coltrain::comm::detail {

COLTRAIN_DECL ErrorContext CallChecks::context(Collective collective) const {
  ErrorContext context;
  context.rank = rank;
  context.operation = operation_prefix + std::string(name_of(collective));
  return context;
}

COLTRAIN_DECL void CallChecks::size_mismatch(Collective collective, const char* what,
                                             std::size_t actual, std::size_t expected) const {
  throw InvalidArgument(std::string(what) + " has " + std::to_string(actual) +
                            " elements, expected " + std::to_string(expected),
                        context(collective));
}

COLTRAIN_DECL void CallChecks::root_outside(Collective collective, int root) const {
  throw InvalidArgument("root " + std::to_string(root) + " is not a rank of this " +
                            std::to_string(size) + "-rank communicator",
                        context(collective));
}

COLTRAIN_DECL void CallChecks::require_distinct(Collective collective,
                                                std::span<const std::byte> input,
                                                std::span<const std::byte> output) const {
  const bool overlap = !input.empty() && !output.empty() &&
                       input.data() < output.data() + output.size() &&
                       output.data() < input.data() + input.size();
  if (!overlap) return;
  throw InvalidArgument("input and output overlap; use the in-place form", context(collective));
}

COLTRAIN_DECL BlockLayout CallChecks::block_layout(Collective collective, const char* side,
                                                   std::span<const std::size_t> counts,
                                                   std::span<const std::size_t> displacements,
                                                   std::size_t elements,
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

COLTRAIN_DECL Memory CallChecks::memory_of_buffers(Collective collective,
                                                   std::span<const std::byte> input,
                                                   std::span<const std::byte> output,
                                                   bool empty_on_device) const {
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

COLTRAIN_DECL WireCompression CallChecks::wire_format(DataType type,
                                                      std::optional<WireCompression> requested,
                                                      Algorithm algorithm,
                                                      WireCompression fallback) const {
  const bool f32 = type == DataType::kFloat32;
  if (!requested)
    return f32 && algorithm == Algorithm::kAutomatic ? fallback : WireCompression::kNone;
  if (*requested == WireCompression::kNone) return *requested;
  if (!f32) {
    throw InvalidArgument(
        "allreduce: wire compression takes f32 data, not " + std::string(name_of(type)),
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

}  // namespace coltrain::comm::detail
