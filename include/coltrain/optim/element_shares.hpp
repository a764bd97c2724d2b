#pragma once
// The optimizers' elementwise passes (unscaling, the update, rounding into the model) split across
// the network's thread pool. Each element is computed alone, so any split gives the same bits.
// Splitting matters beyond the second core's arithmetic: the backward pass wrote part of the
// gradients from the other core, and a step on one thread pulls those lines across: on the 2-core
// machine Mlp's step took 190-200 us on the calling thread of a 2-thread network, 70-100 us in a
// 1-thread one, and 80-107 us shared out.

#include <coltrain/core/thread_pool.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace coltrain::optim::detail {

// Below this many elements in all, waking the pool's workers costs more than the pass.
inline constexpr std::size_t kParallelElementPass = std::size_t{1} << 15;

// Calls body(p, begin, end) for ranges [begin, end) of params[p].value that cover every element
// once: in parameter order on the calling thread without a pool (or for few elements), otherwise
// the parameters' elements laid end to end and cut into one contiguous share per thread of
// `pool`. An exception from any share is rethrown here.
template <class Param, class F>
void for_each_element_share(std::span<const Param> params, ThreadPool* pool, F&& body) {
  std::size_t total = 0;
  for (const Param& param : params) total += param.value.size();
  if (pool == nullptr || pool->size() == 1 || total < kParallelElementPass) {
    for (std::size_t p = 0; p < params.size(); ++p) {
      if (!params[p].value.empty()) body(p, std::size_t{0}, params[p].value.size());
    }
    return;
  }
  pool->parallel_for(static_cast<std::int64_t>(total),
                     [&](std::int64_t begin, std::int64_t end, int) {
                       const auto share_begin = static_cast<std::size_t>(begin);
                       const auto share_end = static_cast<std::size_t>(end);
                       std::size_t offset = 0;  // of params[p]'s first element
                       for (std::size_t p = 0; p < params.size() && offset < share_end; ++p) {
                         const std::size_t n = params[p].value.size();
                         const std::size_t lo = std::max(share_begin, offset);
                         const std::size_t hi = std::min(share_end, offset + n);
                         if (lo < hi) body(p, lo - offset, hi - offset);
                         offset += n;
                       }
                     });
}

}  // namespace coltrain::optim::detail
