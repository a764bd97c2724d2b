#pragma once
// DeterministicGradients<Net>: the engine of DataParallel's deterministic mode
// (DataParallelOptions::micro_shards): a step's gradients whose bits do not depend on the number
// of ranks. The global batch is cut into M micro-shards of equal size, fixed by the batch and M
// alone; rank r of p computes shards [r M/p, (r+1) M/p), each with a forward and backward pass of
// its own, all from the same BatchNorm statistics and with dropout masks keyed by (pass, shard).
// The shards' gradients, running statistics and losses are then folded in one fixed binary tree:
// first over the rank's own shards, which form a subtree of it, then across ranks by the
// rank_order allreduce (comm/algorithms/rank_order.hpp), whose tree over the ranks continues the
// same one; the sums are divided by M. Whenever M/p is a power of two (M = 8: 1, 2, 4 or 8 ranks)
// the result is the same bits on every world size, as one rank computing all M shards would get.
//
// What changes against plain data-parallel training: BatchNorm normalises each shard by the
// shard's statistics (ghost batches of batch / M samples) and its running statistics become the
// tree's average of the M shards' updates, each made from the statistics before the step; the
// passes run one after another, not overlapped with communication. 16-bit gradients are widened
// to f32 for the fold and rounded once. docs/data-parallel.md, "The same bits on any number of
// ranks", says what is promised.

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/error.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::train {

namespace detail {

// Folds slots[0..n) into slots[0] in the fixed tree of rank_order (pairs first, then pairs of
// pairs...): `add(into, from)` adds slot `from` into slot `into`.
template <class Add>
void fold_slots_in_fixed_tree(std::size_t n, Add add) {
  for (std::size_t width = 1; width < n; width *= 2) {
    for (std::size_t i = 0; i + width < n; i += 2 * width) add(i, i + width);
  }
}

// A network's buffers, flattened by element type in state_dict order.
struct BufferSnapshot {
  std::vector<float> floats;
  std::vector<double> doubles;
  std::vector<std::int64_t> integers;
};

template <class Net>
void take_buffers(Net& network, BufferSnapshot& into) {
  into.floats.clear();
  into.doubles.clear();
  into.integers.clear();
  network.visit_buffers([&](const std::string&, auto& buffer) {
    using U = typename std::remove_reference_t<decltype(buffer)>::value_type;
    const auto values = buffer.span();
    if constexpr (std::is_same_v<U, float>) {
      into.floats.insert(into.floats.end(), values.begin(), values.end());
    } else if constexpr (std::is_same_v<U, double>) {
      into.doubles.insert(into.doubles.end(), values.begin(), values.end());
    } else {
      static_assert(std::is_same_v<U, std::int64_t>, "buffers are float, double or int64");
      into.integers.insert(into.integers.end(), values.begin(), values.end());
    }
  });
}

template <class Net>
void put_buffers(Net& network, const BufferSnapshot& from) {
  std::size_t f = 0;
  std::size_t d = 0;
  std::size_t i = 0;
  network.visit_buffers([&](const std::string&, auto& buffer) {
    using U = typename std::remove_reference_t<decltype(buffer)>::value_type;
    for (U& value : buffer.span()) {
      if constexpr (std::is_same_v<U, float>) {
        value = from.floats[f++];
      } else if constexpr (std::is_same_v<U, double>) {
        value = from.doubles[d++];
      } else {
        value = from.integers[i++];
      }
    }
  });
}

}  // namespace detail

// Whether `micro_shards` over `world_size` ranks gives the same bits on every such world size:
// a multiple of the world size, a power of two shards per rank.
inline bool micro_shards_fit(int micro_shards, int world_size) {
  return micro_shards >= 1 && world_size >= 1 && micro_shards % world_size == 0 &&
         std::has_single_bit(static_cast<unsigned>(micro_shards / world_size));
}

template <class Net>
class DeterministicGradients {
  using T = typename Net::value_type;
  // The fold's type: T for float and double, f32 for the 16-bit types.
  using G = std::conditional_t<std::is_floating_point_v<T>, T, float>;

 public:
  // Throws InvalidArgument unless micro_shards_fit(micro_shards, communicator.size()).
  DeterministicGradients(Net& network, comm::Communicator& communicator, int micro_shards)
      : network_(network), comm_(communicator), shards_(micro_shards) {
    const int p = comm_.size();
    if (!micro_shards_fit(shards_, p)) {
      throw InvalidArgument(
          "DataParallel: " + std::to_string(shards_) + " micro-shards over " + std::to_string(p) +
              " ranks; the world size must divide the micro-shards into a power of two per rank "
              "(8 micro-shards: 1, 2, 4 or 8 ranks)",
          context("construct"));
    }
    local_shards_ = shards_ / p;
    first_shard_ = comm_.rank() * local_shards_;
  }

  int first_shard() const { return first_shard_; }
  int local_shards() const { return local_shards_; }

  // Shard `shard`'s samples within a global batch of `global_batch`: [begin, end). Throws
  // InvalidArgument unless the batch is a positive multiple of the micro-shards.
  std::pair<std::int64_t, std::int64_t> shard_samples(std::int64_t global_batch, int shard) const {
    if (global_batch <= 0 || global_batch % shards_ != 0 || shard < 0 || shard >= shards_) {
      throw InvalidArgument("DataParallel: shard " + std::to_string(shard) +
                                " of a global batch of " + std::to_string(global_batch) + " in " +
                                std::to_string(shards_) +
                                " micro-shards (the batch must be a multiple of them)",
                            context("shard_samples"));
    }
    const std::int64_t size = global_batch / shards_;
    return {shard * size, (shard + 1) * size};
  }

  // DataParallel::compute_gradients.
  template <class Pass>
  double compute(std::uint64_t pass_number, Pass&& pass, bool accumulate) {
    auto& arena = network_.parameter_arena();
    const std::size_t n = arena.size();
    const auto local = static_cast<std::size_t>(local_shards_);
    open_sums_.resize(static_cast<std::size_t>(std::bit_width(local)));
    std::size_t open = 0;  // partial sums in open_sums_ waiting for their right operand
    buffer_slots_.resize(local);
    losses_.assign(local, 0.0);
    if (accumulate) {
      accumulated_.resize(n);
      std::copy_n(arena.gradients(), n, accumulated_.begin());
    }
    detail::take_buffers(network_, before_);
    const auto total = static_cast<std::uint64_t>(shards_);
    for (std::size_t k = 0; k < local; ++k) {
      const int shard = first_shard_ + static_cast<int>(k);
      detail::put_buffers(network_, before_);
      network_.zero_grad();
      // forward() counts a step before drawing masks: (pass, shard) gets pass * M + shard + 1.
      network_.context().set_step(pass_number * total + static_cast<std::uint64_t>(shard));
      try {
        losses_[k] = pass(shard);
      } catch (...) {
        restore_after_failed_pass(accumulate);
        throw;
      }
      open = fold_gradients(k, open, arena.gradients(), n);
      detail::take_buffers(network_, buffer_slots_[k]);
    }
    network_.context().set_step((pass_number + 1) * total);

    detail::fold_slots_in_fixed_tree(local, [&](std::size_t into, std::size_t from) {
      add_into(buffer_slots_[into].floats, buffer_slots_[from].floats);
      add_into(buffer_slots_[into].doubles, buffer_slots_[from].doubles);
      add_into(buffer_slots_[into].integers, buffer_slots_[from].integers);
      losses_[into] = losses_[into] + losses_[from];
    });
    std::vector<G>& gradient = open_sums_[0];
    detail::BufferSnapshot& buffers = buffer_slots_[0];
    double loss = losses_[0];
    sum_across_ranks(std::span<G>(gradient));
    sum_across_ranks(std::span<float>(buffers.floats));
    sum_across_ranks(std::span<double>(buffers.doubles));
    sum_across_ranks(std::span<std::int64_t>(buffers.integers));
    sum_across_ranks(std::span<double>(&loss, 1));

    // Divided by M: exact when M is a power of two, and the same rounding on every world size
    // otherwise. Every shard counted the same number of batches, so the counts divide exactly.
    // Accumulated passes add in their order (16-bit gradients in f32, rounded once), as a single
    // rank would.
    T* gradients = arena.gradients();
    for (std::size_t i = 0; i < n; ++i) {
      const T mean = static_cast<T>(gradient[i] / G(shards_));
      gradients[i] = accumulate
                         ? static_cast<T>(static_cast<G>(accumulated_[i]) + static_cast<G>(mean))
                         : mean;
    }
    for (float& v : buffers.floats) v /= static_cast<float>(shards_);
    for (double& v : buffers.doubles) v /= static_cast<double>(shards_);
    for (std::int64_t& v : buffers.integers) v /= shards_;
    detail::put_buffers(network_, buffers);
    return loss / static_cast<double>(shards_);
  }

 private:
  // Shard k's gradients (in `gradients`, n of them) into the fold, which follows the tree of
  // fold_slots_in_fixed_tree as a binary counter does: the local shards are a power of two, and
  // shard k completes as many subtrees as k has trailing one bits. Each completed subtree's left
  // operand waits in open_sums_ (the oldest, and largest, first); the shard's gradients become
  // open_sums_[open] when k is even, else they are added to the waiting sums, newest first, in
  // one pass: left_2 + (left_1 + (left_0 + shard)), rounded after each addition as the tree is.
  // So only every other shard's gradients are copied aside, and the passes over the gradients
  // (larger than the caches for most networks) are as few as the tree allows. Returns the number
  // of sums open after it.
  std::size_t fold_gradients(std::size_t k, std::size_t open, const T* gradients, std::size_t n) {
    const auto closed = static_cast<std::size_t>(std::countr_one(k));
    if (closed == 0) {
      std::vector<G>& slot = open_sums_[open];
      slot.resize(n);
      for (std::size_t i = 0; i < n; ++i) slot[i] = static_cast<G>(gradients[i]);
      return open + 1;
    }
    // The newest waiting sums, up to three, with the shard in one pass; older ones after it.
    const std::size_t fused = std::min<std::size_t>(closed, 3);
    G* target = open_sums_[open - fused].data();
    const G* left_0 = open_sums_[open - 1].data();
    if (fused == 1) {
      for (std::size_t i = 0; i < n; ++i) target[i] = left_0[i] + static_cast<G>(gradients[i]);
    } else if (fused == 2) {
      const G* left_1 = open_sums_[open - 2].data();
      for (std::size_t i = 0; i < n; ++i)
        target[i] = left_1[i] + (left_0[i] + static_cast<G>(gradients[i]));
    } else {
      const G* left_1 = open_sums_[open - 2].data();
      const G* left_2 = open_sums_[open - 3].data();
      for (std::size_t i = 0; i < n; ++i)
        target[i] = left_2[i] + (left_1[i] + (left_0[i] + static_cast<G>(gradients[i])));
    }
    for (std::size_t level = fused; level < closed; ++level) {
      G* into = open_sums_[open - 1 - level].data();
      const G* right = open_sums_[open - level].data();
      for (std::size_t i = 0; i < n; ++i) into[i] = into[i] + right[i];
    }
    return open - closed + 1;
  }

  template <class U>
  static void add_into(std::vector<U>& into, const std::vector<U>& from) {
    for (std::size_t i = 0; i < into.size(); ++i) into[i] = into[i] + from[i];
  }

  // A pass threw: the buffers as before the step, and the gradients as before the call.
  void restore_after_failed_pass(bool accumulate) {
    detail::put_buffers(network_, before_);
    auto& arena = network_.parameter_arena();
    if (accumulate)
      std::copy(accumulated_.begin(), accumulated_.end(), arena.gradients());
    else
      network_.zero_grad();
  }

  template <class U>
  void sum_across_ranks(std::span<U> values) {
    if (values.empty()) return;
    comm_.allreduce(values, comm::ReduceOp::kSum, comm::Algorithm::kRankOrder);
  }

  ErrorContext context(std::string operation) const {
    ErrorContext c;
    c.rank = comm_.rank();
    c.operation = std::move(operation);
    return c;
  }

  Net& network_;
  comm::Communicator& comm_;
  int shards_;
  int local_shards_ = 1;
  int first_shard_ = 0;
  std::vector<std::vector<G>> open_sums_;  // fold_gradients' waiting left operands
  std::vector<detail::BufferSnapshot> buffer_slots_;
  std::vector<double> losses_;
  std::vector<T> accumulated_;  // the gradients a call with `accumulate` adds to
  detail::BufferSnapshot before_;
};

}  // namespace coltrain::train
