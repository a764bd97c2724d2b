#pragma once
// NonBlockingCalls<Comm>: the non-blocking form of each of Communicator's collectives (its base
// class; comm/communicator.hpp has the blocking forms and their rules). Each takes the blocking
// call's arguments and returns a Request (comm/request.hpp) at once; the call runs on the
// communicator's progress thread, after the calls issued before it, and Request::wait() throws
// what the blocking call would. Its buffers must stay valid and untouched until then. Staged device
// buffers (MPI, TCP) are queued the same way and start after the work on stream() at the time of
// the call; on NCCL the call is enqueued on stream() as its blocking form is, and its Request is
// complete at once.

#include <coltrain/comm/elements.hpp>
#include <coltrain/comm/request.hpp>
#include <coltrain/comm/types.hpp>

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

namespace coltrain::comm {

template <class Comm>
class NonBlockingCalls {
 public:
  template <detail::CollectiveElement T>
  Request iallreduce(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum,
                     Algorithm algorithm = Algorithm::kAutomatic,
                     std::optional<WireCompression> compression = std::nullopt) {
    return self().issue(
        Collective::kAllreduce, std::as_bytes(input), std::as_bytes(output),
        [=, &comm = self()] { comm.allreduce(input, output, op, algorithm, compression); });
  }
  template <detail::CollectiveElement T>
  Request iallreduce(std::span<T> data, ReduceOp op = ReduceOp::kSum,
                     Algorithm algorithm = Algorithm::kAutomatic,
                     std::optional<WireCompression> compression = std::nullopt) {
    return iallreduce(std::span<const T>(data), data, op, algorithm, compression);
  }
  template <detail::CollectiveElement T>
  Request ibroadcast(std::span<T> data, int root = 0, Algorithm algorithm = Algorithm::kAutomatic) {
    return self().issue(Collective::kBroadcast, std::as_bytes(data), std::as_bytes(data),
                        [=, &comm = self()] { comm.broadcast(data, root, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request iallgather(std::span<const T> input, std::span<T> output,
                     Algorithm algorithm = Algorithm::kAutomatic) {
    return self().issue(Collective::kAllgather, std::as_bytes(input), std::as_bytes(output),
                        [=, &comm = self()] { comm.allgather(input, output, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request ireduce_scatter(std::span<const T> input, std::span<T> output,
                          ReduceOp op = ReduceOp::kSum,
                          Algorithm algorithm = Algorithm::kAutomatic) {
    return self().issue(Collective::kReduceScatter, std::as_bytes(input), std::as_bytes(output),
                        [=, &comm = self()] { comm.reduce_scatter(input, output, op, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request ireduce(std::span<const T> input, std::span<T> output, int root = 0,
                  ReduceOp op = ReduceOp::kSum, Algorithm algorithm = Algorithm::kAutomatic) {
    const std::span<T> used_output = self().rank() == root ? output : std::span<T>();
    return self().issue(Collective::kReduce, std::as_bytes(input), std::as_bytes(used_output),
                        [=, &comm = self()] { comm.reduce(input, output, root, op, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request ialltoall(std::span<const T> input, std::span<T> output,
                    Algorithm algorithm = Algorithm::kAutomatic) {
    return self().issue(Collective::kAlltoall, std::as_bytes(input), std::as_bytes(output),
                        [=, &comm = self()] { comm.alltoall(input, output, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request igather(std::span<const T> input, std::span<T> output, int root = 0,
                  Algorithm algorithm = Algorithm::kAutomatic) {
    return self().issue(Collective::kGather, std::as_bytes(input), std::as_bytes(output),
                        [=, &comm = self()] { comm.gather(input, output, root, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request iscatter(std::span<const T> input, std::span<T> output, int root = 0,
                   Algorithm algorithm = Algorithm::kAutomatic) {
    return self().issue(Collective::kScatter, std::as_bytes(input), std::as_bytes(output),
                        [=, &comm = self()] { comm.scatter(input, output, root, algorithm); });
  }
  // The counts (and displacements) are copied: they may go once the call returns.
  template <detail::CollectiveElement T>
  Request iallgatherv(std::span<const T> input, std::span<T> output,
                      std::span<const std::size_t> counts,
                      Algorithm algorithm = Algorithm::kAutomatic) {
    return self().issue(Collective::kAllgatherv, std::as_bytes(input), std::as_bytes(output),
                        [=, &comm = self(), counts = std::vector(counts.begin(), counts.end())] {
                          comm.allgatherv(input, output, std::span(counts), algorithm);
                        });
  }
  template <detail::CollectiveElement T>
  Request ialltoallv(std::span<const T> input, std::span<const std::size_t> send_counts,
                     std::span<const std::size_t> send_displacements, std::span<T> output,
                     std::span<const std::size_t> recv_counts,
                     std::span<const std::size_t> recv_displacements,
                     Algorithm algorithm = Algorithm::kAutomatic) {
    using Sizes = std::vector<std::size_t>;
    return self().issue(Collective::kAlltoallv, std::as_bytes(input), std::as_bytes(output),
                        [=, &comm = self(), sc = Sizes(send_counts.begin(), send_counts.end()),
                         sd = Sizes(send_displacements.begin(), send_displacements.end()),
                         rc = Sizes(recv_counts.begin(), recv_counts.end()),
                         rd = Sizes(recv_displacements.begin(), recv_displacements.end())] {
                          comm.alltoallv(input, std::span(sc), std::span(sd), output, std::span(rc),
                                         std::span(rd), algorithm);
                        });
  }
  Request ibarrier(Algorithm algorithm = Algorithm::kAutomatic) {
    return self().progress_.submit([=, &comm = self()] { comm.barrier(algorithm); });
  }

 private:
  Comm& self() { return static_cast<Comm&>(*this); }
};

}  // namespace coltrain::comm
