#pragma once
// Collectives on buffers the host transport cannot touch (GPU memory), run by staging: each chunk
// is copied into a host slot, communicated there by a Communicator, and copied back. Three stages
// overlap, one chunk each: while chunk k is communicated, chunk k+1 is copied in and chunk k-1
// copied out, so that for large arrays only the first copy in and the last copy out add to the
// host collective's time. Reductions run on the host, inside the Communicator's algorithms, on the
// received data they already hold: a reduction on the device would cost another copy per received
// chunk, and the host reduces faster than TCP or MPI deliver.
//
// The Stager moves the bytes; coltrain/comm/device/device_staging.hpp has the CUDA one, which
// Communicator uses for device buffers on MPI and TCP. Every rank must use the same
// StagingOptions: each chunk is a collective call of its own, and a different chunking is a
// MismatchError on the counts.

#include <coltrain/comm/call_checks.hpp>
#include <coltrain/comm/device/staging_options.hpp>
#include <coltrain/comm/elements.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::comm {

// A chunk: elements [begin, begin + size) of every block.
struct StagedChunk {
  std::size_t begin = 0;
  std::size_t size = 0;
};

// How `count` elements per block are cut into chunks. At least one chunk, empty when count is 0, so
// that every rank still makes the call and a rank with other counts is a MismatchError, not a hang.
struct ChunkPlan {
  std::size_t count = 0;     // elements per block
  std::size_t elements = 1;  // per chunk and block; the last chunk may be shorter
  std::size_t chunks = 1;

  StagedChunk chunk(std::size_t k) const {
    const std::size_t begin = k * elements;
    return {begin, std::min(elements, count - begin)};
  }
};

// `blocks` blocks (1, or the ranks of allgather and reduce_scatter) of `count` elements of
// `element_bytes` bytes: chunks of at most options.chunk_bytes over all blocks (but at least one
// element per block), at least options.min_chunks of them where that leaves them
// options.min_chunk_bytes or more.
inline ChunkPlan plan_chunks(std::size_t count, std::size_t element_bytes, std::size_t blocks,
                             const StagingOptions& options) {
  if (options.chunk_bytes == 0 || options.min_chunks == 0 || element_bytes == 0 || blocks == 0) {
    throw InvalidArgument(
        "plan_chunks: chunk_bytes, min_chunks, element_bytes and blocks must be "
        "positive");
  }
  ChunkPlan plan;
  plan.count = count;
  if (count == 0) return plan;
  const std::size_t row_bytes = element_bytes * blocks;  // one element of every block
  const std::size_t total = count * row_bytes;
  const std::size_t floor = std::min(options.min_chunk_bytes, options.chunk_bytes);
  const std::size_t target =
      std::clamp((total + options.min_chunks - 1) / options.min_chunks, floor, options.chunk_bytes);
  plan.elements = std::clamp<std::size_t>(target / row_bytes, 1, count);
  plan.chunks = (count + plan.elements - 1) / plan.elements;
  return plan;
}

// `rows` rows of `row_bytes` bytes: row i from source + i * source_pitch to
// destination + i * destination_pitch.
struct StagedCopy {
  void* destination = nullptr;
  std::size_t destination_pitch = 0;
  const void* source = nullptr;
  std::size_t source_pitch = 0;
  std::size_t row_bytes = 0;
  std::size_t rows = 1;
};

// What StagedCommunicator needs from the thing that moves the bytes. Slots are host memory that
// the Communicator reads and writes; copies are asynchronous, and the waits order them:
//   reserve(bytes)       every slot holds at least `bytes` (called before begin(), nothing pending)
//   slot(s)              slot s < kSlots
//   begin()              later copies come after the caller's pending work on the buffers
//   to_host(s, copy)     into slot s, once slot s's last to_device() has read it
//   wait_host(s)         blocks until the host may use slot s: its to_host() copy is done, and
//                        its last to_device() copy too (also where no to_host() came before)
//   to_device(s, copy)   out of slot s
//   finish()             blocks until every copy is done
//   abandon()            after an error: waits for the copies in flight, never throws
template <class S>
concept Stager = requires(S stager, std::size_t index, const StagedCopy& copy) {
  { S::kSlots } -> std::convertible_to<std::size_t>;
  stager.reserve(index);
  { stager.slot(index) } -> std::same_as<std::byte*>;
  stager.begin();
  stager.to_host(index, copy);
  stager.wait_host(index);
  stager.to_device(index, copy);
  stager.finish();
  stager.abandon();
  requires noexcept(stager.abandon());
};

class Communicator;

// The collectives of `Host` (a Communicator), with the same arguments and rules, on buffers that
// the Stager copies (CudaStager: device memory). Blocking: a call returns when its output is
// written. Keeps a pointer to `host`, which must outlive it (rebind() after moving the host); not
// thread-safe, like Communicator.
template <Stager S, class Host = Communicator>
class StagedCommunicator {
 public:
  template <class... StagerArgs>
  explicit StagedCommunicator(Host& host, StagingOptions options = {}, StagerArgs&&... stager_args)
      : host_(&host), options_(options), stager_(std::forward<StagerArgs>(stager_args)...) {
    plan_chunks(0, 1, 1, options_);  // rejects bad options now, not at the first call
  }

  Host& host() { return *host_; }
  void rebind(Host& host) { host_ = &host; }
  const StagingOptions& options() const { return options_; }
  void set_options(const StagingOptions& options) {
    plan_chunks(0, 1, 1, options);
    options_ = options;
  }
  S& stager() { return stager_; }

  template <detail::CollectiveElement T>
  void allreduce(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum,
                 Algorithm algorithm = Algorithm::kAutomatic) {
    checks().require_size(Collective::kAllreduce, "output", output.size(), input.size());
    run<T>(
        Collective::kAllreduce, input.size(),
        [&](StagedChunk c, T* slot) { return contiguous(slot, input.data() + c.begin, c.size); },
        [&](StagedChunk c, T* slot) {
          host_->allreduce(std::span<T>(slot, c.size), op, algorithm);
        },
        [&](StagedChunk c, T* slot) { return contiguous(output.data() + c.begin, slot, c.size); });
  }
  template <detail::CollectiveElement T>
  void allreduce(std::span<T> data, ReduceOp op = ReduceOp::kSum,
                 Algorithm algorithm = Algorithm::kAutomatic) {
    allreduce(std::span<const T>(data), data, op, algorithm);
  }

  template <detail::CollectiveElement T>
  void broadcast(std::span<T> data, int root = 0, Algorithm algorithm = Algorithm::kAutomatic) {
    checks().require_root(Collective::kBroadcast, root);
    const bool is_root = host_->rank() == root;
    run<T>(
        Collective::kBroadcast, data.size(),
        [&](StagedChunk c, T* slot) -> std::optional<StagedCopy> {
          if (!is_root) return std::nullopt;
          return contiguous(slot, data.data() + c.begin, c.size);
        },
        [&](StagedChunk c, T* slot) {
          host_->broadcast(std::span<T>(slot, c.size), root, algorithm);
        },
        [&](StagedChunk c, T* slot) -> std::optional<StagedCopy> {
          if (is_root) return std::nullopt;
          return contiguous(data.data() + c.begin, slot, c.size);
        });
  }

  // output holds size() blocks of input.size() elements; block i is rank i's input.
  template <detail::CollectiveElement T>
  void allgather(std::span<const T> input, std::span<T> output,
                 Algorithm algorithm = Algorithm::kAutomatic) {
    const std::size_t ranks = group_size();
    checks().require_size(Collective::kAllgather, "output", output.size(), input.size() * ranks);
    const std::size_t count = input.size();
    const std::size_t mine = static_cast<std::size_t>(host_->rank());
    run<T>(
        Collective::kAllgather, count,
        [&](StagedChunk c, T* slot) {
          return contiguous(slot + mine * c.size, input.data() + c.begin, c.size);
        },
        [&](StagedChunk c, T* slot) {
          host_->allgather(std::span<T>(slot, ranks * c.size), algorithm);
        },
        [&](StagedChunk c, T* slot) {
          return strided(output.data() + c.begin, count, slot, c.size, c.size, ranks);
        });
  }
  // In place: data holds size() blocks; this rank's block is its input.
  template <detail::CollectiveElement T>
  void allgather(std::span<T> data, Algorithm algorithm = Algorithm::kAutomatic) {
    const std::size_t count = data.size() / group_size();
    checks().require_size(Collective::kAllgather, "data", data.size(), count * group_size());
    const std::size_t mine = static_cast<std::size_t>(host_->rank());
    allgather(std::span<const T>(data.subspan(count * mine, count)), data, algorithm);
  }

  // input holds size() blocks of output.size() elements; this rank gets the reduction of block
  // rank().
  template <detail::CollectiveElement T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum,
                      Algorithm algorithm = Algorithm::kAutomatic) {
    const std::size_t ranks = group_size();
    checks().require_size(Collective::kReduceScatter, "input", input.size(), output.size() * ranks);
    const std::size_t count = output.size();
    const std::size_t mine = static_cast<std::size_t>(host_->rank());
    run<T>(
        Collective::kReduceScatter, count,
        [&](StagedChunk c, T* slot) {
          return strided(slot, c.size, input.data() + c.begin, count, c.size, ranks);
        },
        [&](StagedChunk c, T* slot) {
          host_->reduce_scatter(std::span<T>(slot, ranks * c.size), op, algorithm);
        },
        [&](StagedChunk c, T* slot) {
          return contiguous(output.data() + c.begin, slot + mine * c.size, c.size);
        });
  }
  // In place: data holds size() blocks; the result lands in this rank's block.
  template <detail::CollectiveElement T>
  void reduce_scatter(std::span<T> data, ReduceOp op = ReduceOp::kSum,
                      Algorithm algorithm = Algorithm::kAutomatic) {
    const std::size_t count = data.size() / group_size();
    checks().require_size(Collective::kReduceScatter, "data", data.size(), count * group_size());
    const std::size_t mine = static_cast<std::size_t>(host_->rank());
    reduce_scatter(std::span<const T>(data), data.subspan(count * mine, count), op, algorithm);
  }

  // The root gets the reduction; output is written (and checked) on the root only.
  template <detail::CollectiveElement T>
  void reduce(std::span<const T> input, std::span<T> output, int root = 0,
              ReduceOp op = ReduceOp::kSum, Algorithm algorithm = Algorithm::kAutomatic) {
    checks().require_root(Collective::kReduce, root);
    const bool is_root = host_->rank() == root;
    if (is_root) checks().require_size(Collective::kReduce, "output", output.size(), input.size());
    run<T>(
        Collective::kReduce, input.size(),
        [&](StagedChunk c, T* slot) { return contiguous(slot, input.data() + c.begin, c.size); },
        [&](StagedChunk c, T* slot) {
          host_->reduce(std::span<T>(slot, c.size), root, op, algorithm);
        },
        [&](StagedChunk c, T* slot) -> std::optional<StagedCopy> {
          if (!is_root) return std::nullopt;
          return contiguous(output.data() + c.begin, slot, c.size);
        });
  }
  template <detail::CollectiveElement T>
  void reduce(std::span<T> data, int root = 0, ReduceOp op = ReduceOp::kSum,
              Algorithm algorithm = Algorithm::kAutomatic) {
    reduce(std::span<const T>(data), data, root, op, algorithm);
  }

  // The calls below move each byte once and have blocks of different sizes, or blocks on one
  // rank only, so they are staged whole rather than pipelined: the input is copied into one slot,
  // the host call runs from it into another, and the output is copied out (run_whole). Arguments
  // are the host calls' and are checked there.

  template <detail::CollectiveElement T>
  void alltoall(std::span<const T> input, std::span<T> output,
                Algorithm algorithm = Algorithm::kAutomatic) {
    run_whole(input, output, [&](std::span<const T> in, std::span<T> out) {
      host_->alltoall(in, out, algorithm);
    });
  }
  template <detail::CollectiveElement T>
  void alltoall(std::span<T> data, Algorithm algorithm = Algorithm::kAutomatic) {
    alltoall(std::span<const T>(data), data, algorithm);
  }

  template <detail::CollectiveElement T>
  void alltoallv(std::span<const T> input, std::span<const std::size_t> send_counts,
                 std::span<const std::size_t> send_displacements, std::span<T> output,
                 std::span<const std::size_t> recv_counts,
                 std::span<const std::size_t> recv_displacements,
                 Algorithm algorithm = Algorithm::kAutomatic) {
    // Only the received blocks are copied out: the output between them stays as it was.
    std::vector<StagedChunk> received;
    for (std::size_t j = 0; j < recv_counts.size() && j < recv_displacements.size(); ++j)
      received.push_back({recv_displacements[j], recv_counts[j]});
    run_whole(
        input, output,
        [&](std::span<const T> in, std::span<T> out) {
          host_->alltoallv(in, send_counts, send_displacements, out, recv_counts,
                           recv_displacements, algorithm);
        },
        received);
  }

  // Only the root's output is written; other ranks' may be empty.
  template <detail::CollectiveElement T>
  void gather(std::span<const T> input, std::span<T> output, int root = 0,
              Algorithm algorithm = Algorithm::kAutomatic) {
    checks().require_root(Collective::kGather, root);
    const std::span<T> used = host_->rank() == root ? output : std::span<T>();
    run_whole(input, used, [&](std::span<const T> in, std::span<T> out) {
      host_->gather(in, out, root, algorithm);
    });
  }

  // Only the root's input is read; other ranks' may be empty.
  template <detail::CollectiveElement T>
  void scatter(std::span<const T> input, std::span<T> output, int root = 0,
               Algorithm algorithm = Algorithm::kAutomatic) {
    checks().require_root(Collective::kScatter, root);
    const std::span<const T> used = host_->rank() == root ? input : std::span<const T>();
    run_whole(used, output, [&](std::span<const T> in, std::span<T> out) {
      host_->scatter(in, out, root, algorithm);
    });
  }

  template <detail::CollectiveElement T>
  void allgatherv(std::span<const T> input, std::span<T> output,
                  std::span<const std::size_t> counts,
                  Algorithm algorithm = Algorithm::kAutomatic) {
    run_whole(input, output, [&](std::span<const T> in, std::span<T> out) {
      host_->allgatherv(in, out, counts, algorithm);
    });
  }

 private:
  // Slots hold a chunk of every rank's block for allgather and reduce_scatter.
  std::size_t blocks_of(Collective collective) const {
    const bool per_rank =
        collective == Collective::kAllgather || collective == Collective::kReduceScatter;
    return per_rank ? group_size() : 1;
  }
  std::size_t group_size() const { return static_cast<std::size_t>(host_->size()); }

  template <class T>
  static StagedCopy contiguous(T* destination, const T* source, std::size_t count) {
    return strided(destination, count, source, count, count, 1);
  }
  // `rows` rows of `count` elements; pitches in elements.
  template <class T>
  static StagedCopy strided(T* destination, std::size_t destination_pitch, const T* source,
                            std::size_t source_pitch, std::size_t count, std::size_t rows) {
    StagedCopy copy;
    copy.destination = destination;
    copy.destination_pitch = destination_pitch * sizeof(T);
    copy.source = source;
    copy.source_pitch = source_pitch * sizeof(T);
    copy.row_bytes = count * sizeof(T);
    copy.rows = rows;
    return copy;
  }

  // The pipeline: chunk k + 1 is copied in while chunk k is communicated and chunk k - 1 copied
  // out; the Stager keeps a slot's next copy in behind its last copy out.
  template <class T, class ToHost, class Communicate, class ToDevice>
  void run(Collective collective, std::size_t count, ToHost to_host, Communicate communicate,
           ToDevice to_device) {
    const std::size_t blocks = blocks_of(collective);
    const ChunkPlan plan = plan_chunks(count, sizeof(T), blocks, options_);
    constexpr std::size_t kSlots = S::kSlots;
    stager_.reserve(plan.elements * blocks * sizeof(T));
    const auto slot = [&](std::size_t k) { return reinterpret_cast<T*>(stager_.slot(k % kSlots)); };
    const auto stage_in = [&](std::size_t k) {
      const std::optional<StagedCopy> copy = to_host(plan.chunk(k), slot(k));
      if (copy) stager_.to_host(k % kSlots, *copy);
    };
    try {
      stager_.begin();
      stage_in(0);
      for (std::size_t k = 0; k < plan.chunks; ++k) {
        if (k + 1 < plan.chunks) stage_in(k + 1);
        stager_.wait_host(k % kSlots);
        communicate(plan.chunk(k), slot(k));
        const std::optional<StagedCopy> copy = to_device(plan.chunk(k), slot(k));
        if (copy) stager_.to_device(k % kSlots, *copy);
      }
      stager_.finish();
    } catch (...) {
      stager_.abandon();
      throw;
    }
  }

  // Slot 0 holds the input and slot 1 the output while `communicate(in, out)` runs on them; the
  // output's `written` ranges (default: all of it) are copied out.
  template <class T, class Communicate>
  void run_whole(std::span<const T> input, std::span<T> output, Communicate communicate,
                 std::span<const StagedChunk> written = {}) {
    const StagedChunk whole{0, output.size()};
    if (written.empty()) written = std::span(&whole, 1);
    static_assert(S::kSlots >= 2, "run_whole needs an input and an output slot");
    stager_.reserve(std::max({input.size_bytes(), output.size_bytes(), sizeof(T)}));
    const std::span<const T> in(reinterpret_cast<const T*>(stager_.slot(0)), input.size());
    const std::span<T> out(reinterpret_cast<T*>(stager_.slot(1)), output.size());
    try {
      stager_.begin();
      stager_.to_host(0,
                      contiguous(stager_.slot(0), reinterpret_cast<const std::byte*>(input.data()),
                                 input.size_bytes()));
      stager_.wait_host(0);
      stager_.wait_host(1);
      communicate(in, out);
      for (const StagedChunk& range : written) {
        if (range.size > 0)
          stager_.to_device(
              1, contiguous(output.data() + range.begin, out.data() + range.begin, range.size));
      }
      stager_.finish();
    } catch (...) {
      stager_.abandon();
      throw;
    }
  }

  detail::CallChecks checks() const { return {host_->rank(), host_->size(), "staged "}; }

  Host* host_;
  StagingOptions options_;
  S stager_;
};

}  // namespace coltrain::comm
