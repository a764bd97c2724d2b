#pragma once
// How ZeRO-1 splits a network's parameter arena (nn/parameter_arena.hpp) across p ranks: rank r
// owns the contiguous elements [r q, (r + 1) q) with q = floor(n / p), and the last rank also the
// tail [p q, n), fewer than p elements. The even part [0, p q) is what the in-place reduce-scatter
// of the gradients and allgather of the values move; the tail takes an allreduce and a broadcast
// of at most p - 1 elements. Contiguous ownership means a parameter meets a rank's shard in at most
// one piece, so each rank's optimizer sees ordinary (shorter) parameters.

#include <coltrain/core/error.hpp>

#include <cstddef>
#include <string>
#include <utility>

namespace coltrain::train {

class ArenaShards {
 public:
  // Throws InvalidArgument for ranks < 1.
  ArenaShards(std::size_t elements, int ranks) : elements_(elements), ranks_(ranks) {
    if (ranks < 1) throw InvalidArgument("ArenaShards: " + std::to_string(ranks) + " ranks");
    block_ = elements / static_cast<std::size_t>(ranks);
  }

  std::size_t elements() const { return elements_; }
  int ranks() const { return ranks_; }
  std::size_t block() const { return block_; }  // q: each rank's part of the even part
  std::size_t even_end() const { return block_ * static_cast<std::size_t>(ranks_); }
  std::size_t tail() const { return elements_ - even_end(); }

  // The elements [first, end) rank `rank` owns.
  std::pair<std::size_t, std::size_t> owned(int rank) const {
    const std::size_t first = block_ * static_cast<std::size_t>(rank);
    return {first, rank == ranks_ - 1 ? elements_ : first + block_};
  }

 private:
  std::size_t elements_;
  int ranks_;
  std::size_t block_ = 0;
};

}  // namespace coltrain::train
