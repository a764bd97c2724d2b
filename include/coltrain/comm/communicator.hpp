#pragma once
// coltrain's collectives: allreduce, broadcast, allgather, reduce_scatter, reduce and barrier over
// MPI, our TCP transport or NCCL, on host or device buffers, with the algorithm chosen per call.
//
//   auto comm = coltrain::comm::Communicator::from_env();        // mpiexec, srun, torchrun...
//   comm.allreduce(std::span(gradients), ReduceOp::kAvg);        // in place, automatic algorithm
//   comm.allreduce(std::span(in), std::span(out), ReduceOp::kMax, Algorithm::kRing);
//
//   auto gpu = Communicator::from_env({}, comm_options_from_env(), Memory::kDevice);  // NCCL?
//   gpu.set_stream(stream);
//   gpu.allreduce(std::span(device_gradients, n), ReduceOp::kAvg);  // device memory: on `stream`
//   gpu.synchronize();
//
// Where the buffers live decides the path, per call (cudaPointerGetAttributes, when built with
// CUDA): host buffers run coltrain's algorithms (or MPI's) over MPI or TCP; device buffers run on
// NCCL when that is the backend, enqueued on stream() and returning at once (stream_ordered()),
// and otherwise are staged through pinned host memory in pipelined chunks
// (comm/device/device_staging.hpp) and return once the result is in device memory. An NCCL
// communicator keeps the MPI or TCP communicator that bootstrapped it for host buffers. Device
// calls come after the work already on stream(); work enqueued on stream() after a call sees its
// result. synchronize() waits for every device collective so far, up to the timeout, and throws
// TimeoutError or BackendError naming the rank, the operation, the count and the dtype.
//
// Every call is collective: all ranks call it in the same order with the same count, dtype, op,
// root and algorithm; coltrain's own algorithms check this in every message and throw MismatchError
// naming both ranks otherwise. f16 and bf16 are reduced in f32 and rounded once, at the end. A
// communicator is not thread-safe: one thread calls it at a time. After a communication error it is
// unusable.

#include <coltrain/comm/algorithms/peer_transfers.hpp>
#include <coltrain/comm/device/buffer_memory.hpp>
#include <coltrain/comm/device/staged_collectives.hpp>
#include <coltrain/comm/elements.hpp>
#include <coltrain/comm/host_layout.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/request.hpp>
#include <coltrain/comm/transport/tcp/file_descriptor.hpp>
#include <coltrain/comm/tuning/algorithm_tuning.hpp>
#include <coltrain/comm/tuning/backend_choice.hpp>
#include <coltrain/comm/tuning/cost_model.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>

#if COLTRAIN_WITH_MPI
#include <mpi.h>
#endif

#if COLTRAIN_WITH_CUDA
#include <coltrain/comm/device/device_collectives.hpp>
#include <coltrain/comm/device/device_staging.hpp>

#include <cuda_runtime.h>
#endif

// Under nvcc, where cuda_fp16.h is in already, the NCCL backend and the ring's and tree's
// reduction kernel register themselves (comm/device/device_collectives.hpp says why not under g++).
#if COLTRAIN_WITH_NCCL && defined(__CUDACC__)
#include <coltrain/comm/device/nccl/nccl_backend.hpp>
#include <coltrain/cuda/nccl_reduce.cuh>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::comm {

class FlightRecorder;
class HostCollectives;

namespace detail {

#if COLTRAIN_WITH_CUDA
// An event recorded on a stream when a queued call is issued; destroyed with the call.
class IssuedEvent {
 public:
  explicit IssuedEvent(cudaStream_t stream) {
    COLTRAIN_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    if (const cudaError_t status = cudaEventRecord(event_, stream); status != cudaSuccess) {
      cudaEventDestroy(event_);
      COLTRAIN_CHECK_CUDA(status);
    }
  }
  IssuedEvent(const IssuedEvent&) = delete;
  IssuedEvent& operator=(const IssuedEvent&) = delete;
  ~IssuedEvent() { cudaEventDestroy(event_); }
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};
#endif

}  // namespace detail

class Communicator {
 public:
  // From the launcher's environment. The backend is `backend`, else COLTRAIN_BACKEND (mpi, tcp or
  // nccl), else NCCL when `memory` is kDevice and this build has NCCL, else MPI when this build
  // has it and an MPI launcher started the process, else TCP (choose_backend in
  // comm/tuning/backend_choice.hpp). NCCL is bootstrapped over that MPI-or-TCP default, on the
  // current CUDA device (set it with cudaSetDevice first). Every backend takes host and device
  // buffers.
  static Communicator from_env(std::optional<Backend> backend = std::nullopt,
                               CommOptions options = comm_options_from_env(),
                               Memory memory = Memory::kHost);

  // Our TCP transport: rank 0 hosts the rendezvous on env.master_addr:env.master_port.
  static Communicator tcp(const LaunchEnv& env, CommOptions options = comm_options_from_env());

  // Over an established TCP mesh (one connected socket per other rank), as an elastic regroup
  // (comm/elastic/elastic_group.hpp) builds it.
  static Communicator tcp(int rank, std::vector<detail::FileDescriptor> sockets,
                          const LaunchEnv& env, CommOptions options);

#if COLTRAIN_WITH_MPI
  // An MPI code hands over its own communicator (MPI must be initialised); coltrain works on a
  // duplicate of it, so its messages never meet the application's.
  static Communicator mpi(MPI_Comm comm, CommOptions options = comm_options_from_env());
#endif

#if COLTRAIN_WITH_NCCL
  // NCCL over the ranks of the MPI or TCP communicator `host`, which it keeps for host buffers:
  // host's rank 0 draws the unique id and broadcasts it. On the current CUDA device; waits, up to
  // options.timeout, until every rank has joined. Needs
  // <coltrain/comm/device/nccl/nccl_backend.hpp> in one translation unit of the program (any
  // nvcc-compiled one that includes this header has it).
  static Communicator nccl(Communicator host, CommOptions options = comm_options_from_env()) {
    if (host.backend_ == Backend::kNccl) {
      throw InvalidArgument(
          "Communicator::nccl needs an MPI or TCP communicator to bootstrap over");
    }
    const NcclFactory factory = registered_nccl_factory();
    if (factory == nullptr) {
      throw ConfigError(
          "the NCCL backend is not in this program: include "
          "<coltrain/comm/device/nccl/nccl_backend.hpp> in one of its files (nvcc-compiled files "
          "that include coltrain/comm/communicator.hpp have it), or set COLTRAIN_BACKEND=mpi or "
          "tcp");
    }
    const BroadcastWords broadcast = [&host](std::span<std::int64_t> words) {
      host.broadcast(words, 0);
    };
    host.nccl_ = factory(host.rank(), host.size(), broadcast, options);
    host.backend_ = Backend::kNccl;
    host.start_recording(options);
    return host;
  }

  // The NCCL backend's device side; dynamic_cast it to NcclBackend
  // (comm/device/nccl/nccl_backend.hpp) for what this class does not wrap (the ncclComm_t, a stream
  // per call).
  DeviceCollectives& nccl() {
    if (!nccl_) {
      throw InvalidArgument("this communicator's backend is " + std::string(name_of(backend_)) +
                            ", not nccl");
    }
    return *nccl_;
  }
#endif

  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  // Finishes the requests still outstanding first (each bounded by the timeout).
  ~Communicator();

  int rank() const;
  int size() const;
  // Which ranks share a host (comm/host_layout.hpp): where hierarchical allreduce reduces first.
  const HostLayout& host_layout() const;
  // What device buffers run on: kMpi, kTcp (both staged) or kNccl.
  Backend backend() const { return backend_; }
  // What host buffers run on: kMpi or kTcp (under NCCL, the communicator that bootstrapped it).
  Backend host_backend() const { return host_backend_; }
  // True when device collectives are enqueued on stream() and return before they run (NCCL);
  // false when they return with the result in device memory (MPI and TCP, staged).
  bool stream_ordered() const { return backend_ == Backend::kNccl; }

  // The last calls on the host path (comm/protocol/flight_recorder.hpp), written to trace_dir()
  // when one fails and on SIGUSR1. NCCL's own device calls are not in it.
  const FlightRecorder& flight_recorder() const;
  // CommOptions::trace_dir (COLTRAIN_TRACE_DIR) unless changed here; the samples point it at their
  // run directory when the variable is unset.
  std::filesystem::path trace_dir() const;
  void set_trace_dir(std::filesystem::path dir);

  // The model kAutomatic uses for `memory`'s buffers: the host backend's, and for device buffers
  // on NCCL the NCCL one (staged device buffers run host collectives per chunk).
  const CostModel& cost_model(Memory memory = Memory::kHost) const;
  void set_cost_model(const CostModel& model, Memory memory = Memory::kHost);
  const AlgorithmTuning& tuning() const;
  void set_tuning(const AlgorithmTuning& tuning);
  // How device buffers are staged on MPI and TCP; the same on every rank.
  const StagingOptions& staging_options() const { return staging_options_; }
  void set_staging_options(const StagingOptions& options) {
    plan_chunks(0, 1, 1, options);  // rejects bad options here
    progress_.drain();              // queued staged calls keep the options they were issued under
    staging_options_ = options;
#if COLTRAIN_WITH_CUDA
    if (staged_) staged_->set_options(options);
#endif
  }

  // What kAutomatic runs for `collective` over an array of `bytes` bytes in `memory` on this
  // communicator (staged device buffers: what each chunk's host collective would run).
  Algorithm choose(Collective collective, std::size_t bytes, Memory memory = Memory::kHost) const;

  // Whether an allreduce of `bytes` host bytes with `algorithm` leaves bit-identical results on
  // every rank. coltrain's own algorithms (compressed ones too) reduce each element on one rank and
  // copy it to the others; the MPI standard does not promise that of MPI_Allreduce ('native').
  bool allreduce_identical_on_every_rank(std::size_t bytes,
                                         Algorithm algorithm = Algorithm::kAutomatic) const {
    if (algorithm == Algorithm::kAutomatic) algorithm = choose(Collective::kAllreduce, bytes);
    return algorithm != Algorithm::kNative;
  }

#if COLTRAIN_WITH_CUDA
  // The stream device collectives are ordered on (default: the legacy default stream). It must
  // belong to the device the communicator runs on.
  void set_stream(cudaStream_t stream) {
#if COLTRAIN_WITH_NCCL
    if (nccl_ && stream != stream_ &&
        std::find(earlier_streams_.begin(), earlier_streams_.end(), stream_) ==
            earlier_streams_.end()) {
      earlier_streams_.push_back(stream_);  // synchronize() still waits for what it holds
    }
#endif
    stream_ = stream;
    if (staged_) staged_->stager().set_caller_stream(stream);
  }
  cudaStream_t stream() const { return stream_; }

  // Returns once every device collective called so far has finished; on NCCL waits up to the
  // communicator's timeout (COLTRAIN_TIMEOUT) and throws TimeoutError or BackendError, after
  // aborting the communicator, naming the rank, operation, count and dtype. Staged collectives
  // have finished when they return.
  void synchronize() {
#if COLTRAIN_WITH_NCCL
    if (!nccl_) return;
    flush_device_messages();
    for (cudaStream_t earlier : earlier_streams_) nccl_->synchronize(earlier);
    earlier_streams_.clear();
    nccl_->synchronize(stream_);
#endif
  }
#endif

  // Every call below takes host or device spans (all of one call's buffers in the same memory).

  // How f32 allreduces on host buffers with Algorithm::kAutomatic travel when the call does not say
  // (default: kNone). The same on every rank; a rank that differs gets a MismatchError.
  WireCompression wire_compression() const { return compression_; }
  void set_wire_compression(WireCompression compression) { compression_ = compression; }

  // ---- allreduce: every rank ends with the reduction of all ranks' input. `compression` (f32 on
  // host buffers only) sends the data as bf16 or f16 and still reduces it in f32
  // (algorithms/compressed_allreduce.hpp); unset, the communicator's wire_compression() applies.
  template <detail::CollectiveElement T>
  void allreduce(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum,
                 Algorithm algorithm = Algorithm::kAutomatic,
                 std::optional<WireCompression> compression = std::nullopt) {
    require_size(Collective::kAllreduce, "output", output.size(), input.size());
    const auto device_call = [&] {
      if (compression && *compression != WireCompression::kNone) {
        throw InvalidArgument("allreduce: wire compression applies to host buffers",
                              call_context(Collective::kAllreduce));
      }
    };
    dispatch(
        memory_of_call(Collective::kAllreduce, std::as_bytes(input), std::as_bytes(output)),
        [&] {
          reduce_collective(Collective::kAllreduce, input, output, op, 0, algorithm,
                            wire_format<T>(compression, algorithm));
        },
        [&](auto& staged) {
          device_call();
          staged.allreduce(input, output, op, algorithm);
        },
        [&](auto& nccl, auto stream) {
          device_call();
          const Algorithm chosen =
              algorithm == Algorithm::kAutomatic
                  ? choose(Collective::kAllreduce, input.size_bytes(), Memory::kDevice)
                  : algorithm;
          nccl.allreduce(input.data(), output.data(), input.size(), data_type_v<T>, stream, op,
                         chosen);
        });
  }
  template <detail::CollectiveElement T>
  void allreduce(std::span<T> data, ReduceOp op = ReduceOp::kSum,
                 Algorithm algorithm = Algorithm::kAutomatic,
                 std::optional<WireCompression> compression = std::nullopt) {
    allreduce(std::span<const T>(data), data, op, algorithm, compression);
  }

  // ---- broadcast: root's data to every rank ----
  template <detail::CollectiveElement T>
  void broadcast(std::span<T> data, int root = 0, Algorithm algorithm = Algorithm::kAutomatic) {
    require_root(Collective::kBroadcast, root);
    dispatch(
        memory_of_call(Collective::kBroadcast, std::as_bytes(data), std::as_bytes(data)),
        [&] { host_broadcast(std::as_writable_bytes(data), data_type_v<T>, root, algorithm); },
        [&](auto& staged) { staged.broadcast(data, root, algorithm); },
        [&](auto& nccl, auto stream) {
          require_nccl_native(Collective::kBroadcast, algorithm);
          nccl.broadcast(data.data(), data.data(), data.size(), data_type_v<T>, root, stream);
        });
  }

  // ---- allgather: output[i * count, (i + 1) * count) = rank i's input; output has size() * count
  template <detail::CollectiveElement T>
  void allgather(std::span<const T> input, std::span<T> output,
                 Algorithm algorithm = Algorithm::kAutomatic) {
    require_size(Collective::kAllgather, "output", output.size(), input.size() * group_size());
    dispatch(
        memory_of_call(Collective::kAllgather, std::as_bytes(input), std::as_bytes(output)),
        [&] {
          host_allgather(std::as_bytes(input), std::as_writable_bytes(output), data_type_v<T>,
                         algorithm);
        },
        [&](auto& staged) { staged.allgather(input, output, algorithm); },
        [&](auto& nccl, auto stream) {
          require_nccl_native(Collective::kAllgather, algorithm);
          nccl.allgather(input.data(), output.data(), input.size(), data_type_v<T>, stream);
        });
  }
  // In place: data holds size() blocks; this rank's block is its input.
  template <detail::CollectiveElement T>
  void allgather(std::span<T> data, Algorithm algorithm = Algorithm::kAutomatic) {
    const std::size_t count = data.size() / group_size();
    require_size(Collective::kAllgather, "data", data.size(), count * group_size());
    allgather(std::span<const T>(data.subspan(count * static_cast<std::size_t>(rank()), count)),
              data, algorithm);
  }

  // ---- reduce_scatter: rank i gets block i of the reduction; input has size() * output.size()
  // ----
  template <detail::CollectiveElement T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum,
                      Algorithm algorithm = Algorithm::kAutomatic) {
    require_size(Collective::kReduceScatter, "input", input.size(), output.size() * group_size());
    dispatch(
        memory_of_call(Collective::kReduceScatter, std::as_bytes(input), std::as_bytes(output)),
        [&] { reduce_collective(Collective::kReduceScatter, input, output, op, 0, algorithm); },
        [&](auto& staged) { staged.reduce_scatter(input, output, op, algorithm); },
        [&](auto& nccl, auto stream) {
          require_nccl_native(Collective::kReduceScatter, algorithm);
          nccl.reduce_scatter(input.data(), output.data(), output.size(), data_type_v<T>, stream,
                              op);
        });
  }
  // In place: data holds size() blocks; the result lands in this rank's block.
  template <detail::CollectiveElement T>
  void reduce_scatter(std::span<T> data, ReduceOp op = ReduceOp::kSum,
                      Algorithm algorithm = Algorithm::kAutomatic) {
    const std::size_t count = data.size() / group_size();
    require_size(Collective::kReduceScatter, "data", data.size(), count * group_size());
    reduce_scatter(std::span<const T>(data),
                   data.subspan(count * static_cast<std::size_t>(rank()), count), op, algorithm);
  }

  // ---- reduce: the root gets the reduction; output is written (and checked) on the root only ----
  template <detail::CollectiveElement T>
  void reduce(std::span<const T> input, std::span<T> output, int root = 0,
              ReduceOp op = ReduceOp::kSum, Algorithm algorithm = Algorithm::kAutomatic) {
    require_root(Collective::kReduce, root);
    const bool is_root = rank() == root;
    if (is_root) require_size(Collective::kReduce, "output", output.size(), input.size());
    // Off the root the output is not used: only the input says where the call's data lives.
    const std::span<T> used_output = is_root ? output : std::span<T>();
    dispatch(
        memory_of_call(Collective::kReduce, std::as_bytes(input), std::as_bytes(used_output)),
        [&] { reduce_collective(Collective::kReduce, input, output, op, root, algorithm); },
        [&](auto& staged) { staged.reduce(input, output, root, op, algorithm); },
        [&](auto& nccl, auto stream) {
          require_nccl_native(Collective::kReduce, algorithm);
          nccl.reduce(input.data(), output.data(), input.size(), data_type_v<T>, root, stream, op);
        });
  }
  template <detail::CollectiveElement T>
  void reduce(std::span<T> data, int root = 0, ReduceOp op = ReduceOp::kSum,
              Algorithm algorithm = Algorithm::kAutomatic) {
    reduce(std::span<const T>(data), data, root, op, algorithm);
  }

  // ---- alltoall: block j of this rank's input goes to rank j, as block rank() of its output;
  // input and output hold size() blocks of the same count.
  template <detail::CollectiveElement T>
  void alltoall(std::span<const T> input, std::span<T> output,
                Algorithm algorithm = Algorithm::kAutomatic) {
    require_size(Collective::kAlltoall, "output", output.size(), input.size());
    const std::size_t count = input.size() / group_size();
    require_size(Collective::kAlltoall, "input", input.size(), count * group_size());
    require_distinct(Collective::kAlltoall, std::as_bytes(input), std::as_bytes(output));
    dispatch(
        memory_of_call(Collective::kAlltoall, std::as_bytes(input), std::as_bytes(output)),
        [&] {
          host_alltoall(std::as_bytes(input), std::as_writable_bytes(output), data_type_v<T>,
                        algorithm);
        },
        [&](auto& staged) { staged.alltoall(input, output, algorithm); },
        [&](auto& nccl, auto stream) {
          require_nccl_native(Collective::kAlltoall, algorithm);
          const std::vector<std::size_t> bytes(group_size(), count * sizeof(T));
          std::vector<std::size_t> offsets(group_size());
          for (std::size_t j = 0; j < offsets.size(); ++j) offsets[j] = j * count * sizeof(T);
          const PeerTransfers transfers =
              pairwise_transfers(input.data(), bytes, offsets, output.data(), bytes, offsets);
          nccl.exchange(Collective::kAlltoall, input.size(), data_type_v<T>, transfers.sends,
                        transfers.receives, stream);
        });
  }
  // In place: data's blocks are replaced by the blocks the other ranks sent (through a copy).
  template <detail::CollectiveElement T>
  void alltoall(std::span<T> data, Algorithm algorithm = Algorithm::kAutomatic) {
#if COLTRAIN_WITH_CUDA
    if (memory_of_call(Collective::kAlltoall, std::as_bytes(data), std::as_bytes(data)) ==
        Memory::kDevice) {
      return device_alltoall_in_place(data, algorithm);
    }
#endif
    std::vector<std::byte>& copy = alltoall_input_;
    const auto bytes = std::as_bytes(data);
    copy.assign(bytes.begin(), bytes.end());
    const std::span<const T> input(reinterpret_cast<const T*>(copy.data()), data.size());
    alltoall(input, data, algorithm);
  }

  // ---- gather: the root's output holds every rank's input in rank order (size() blocks); other
  // ranks' output may be empty and is not touched.
  template <detail::CollectiveElement T>
  void gather(std::span<const T> input, std::span<T> output, int root = 0,
              Algorithm algorithm = Algorithm::kAutomatic) {
    require_root(Collective::kGather, root);
    if (rank() == root)
      require_size(Collective::kGather, "output", output.size(), input.size() * group_size());
    const std::span<T> used = rank() == root ? output : std::span<T>();
    dispatch(
        memory_of_call(Collective::kGather, std::as_bytes(input), std::as_bytes(used)),
        [&] {
          host_rooted_blocks(Collective::kGather, std::as_bytes(input),
                             std::as_writable_bytes(output), input.size_bytes(), data_type_v<T>,
                             root, algorithm);
        },
        [&](auto& staged) { staged.gather(input, output, root, algorithm); },
        [&](auto& nccl, auto stream) {
          require_nccl_native(Collective::kGather, algorithm);
          const PeerTransfers transfers =
              gather_transfers(rank(), size(), root, input.data(), used.data(), input.size_bytes());
          nccl.exchange(Collective::kGather, input.size(), data_type_v<T>, transfers.sends,
                        transfers.receives, stream);
        });
  }

  // ---- scatter: rank i's output is block i of the root's input (size() blocks); other ranks'
  // input may be empty and is not read.
  template <detail::CollectiveElement T>
  void scatter(std::span<const T> input, std::span<T> output, int root = 0,
               Algorithm algorithm = Algorithm::kAutomatic) {
    require_root(Collective::kScatter, root);
    if (rank() == root)
      require_size(Collective::kScatter, "input", input.size(), output.size() * group_size());
    const std::span<const T> used = rank() == root ? input : std::span<const T>();
    dispatch(
        memory_of_call(Collective::kScatter, std::as_bytes(used), std::as_bytes(output)),
        [&] {
          host_rooted_blocks(Collective::kScatter, std::as_bytes(input),
                             std::as_writable_bytes(output), output.size_bytes(), data_type_v<T>,
                             root, algorithm);
        },
        [&](auto& staged) { staged.scatter(input, output, root, algorithm); },
        [&](auto& nccl, auto stream) {
          require_nccl_native(Collective::kScatter, algorithm);
          const PeerTransfers transfers = scatter_transfers(rank(), size(), root, used.data(),
                                                            output.data(), output.size_bytes());
          nccl.exchange(Collective::kScatter, output.size(), data_type_v<T>, transfers.sends,
                        transfers.receives, stream);
        });
  }

  // ---- allgatherv: rank i contributes counts[i] elements; output holds them all in rank order
  // (rank i's at the sum of counts[0..i)). counts has size() entries, the same on every rank;
  // counts[rank()] is input.size().
  template <detail::CollectiveElement T>
  void allgatherv(std::span<const T> input, std::span<T> output,
                  std::span<const std::size_t> counts,
                  Algorithm algorithm = Algorithm::kAutomatic) {
    require_size(Collective::kAllgatherv, "counts", counts.size(), group_size());
    require_size(Collective::kAllgatherv, "input (counts[rank])", input.size(),
                 counts[static_cast<std::size_t>(rank())]);
    std::vector<std::size_t> bytes(counts.size());
    std::vector<std::size_t> offsets(counts.size());
    std::size_t total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      bytes[i] = counts[i] * sizeof(T);
      offsets[i] = total * sizeof(T);
      total += counts[i];
    }
    require_size(Collective::kAllgatherv, "output", output.size(), total);
    require_distinct(Collective::kAllgatherv, std::as_bytes(input), std::as_bytes(output));
    const Memory memory =
        memory_of_call(Collective::kAllgatherv, std::as_bytes(input), std::as_bytes(output));
    if (memory == Memory::kDevice) {
      return dispatch(
          memory, [] {}, [&](auto& staged) { staged.allgatherv(input, output, counts, algorithm); },
          [&](auto& nccl, auto stream) {
            require_nccl_native(Collective::kAllgatherv, algorithm);
            const PeerTransfers transfers = allgatherv_transfers(input.data(), input.size_bytes(),
                                                                 output.data(), bytes, offsets);
            nccl.exchange(Collective::kAllgatherv, total, data_type_v<T>, transfers.sends,
                          transfers.receives, stream);
          });
    }
    host_allgatherv(std::as_bytes(input), std::as_writable_bytes(output), bytes, offsets,
                    data_type_v<T>, algorithm);
  }

  // ---- alltoallv: rank i sends send_counts[j] elements from input[send_displacements[j]] to rank
  // j, which receives recv_counts[i] of them at output[recv_displacements[i]] (MPI_Alltoallv's
  // contract; counts and displacements in elements, size() entries each). A sender and receiver
  // that disagree on a count fail with MismatchError (host buffers; NCCL does not compare them).
  template <detail::CollectiveElement T>
  void alltoallv(std::span<const T> input, std::span<const std::size_t> send_counts,
                 std::span<const std::size_t> send_displacements, std::span<T> output,
                 std::span<const std::size_t> recv_counts,
                 std::span<const std::size_t> recv_displacements,
                 Algorithm algorithm = Algorithm::kAutomatic) {
    const BlockLayout sent = block_layout(Collective::kAlltoallv, "send", send_counts,
                                          send_displacements, input.size(), sizeof(T));
    const BlockLayout received = block_layout(Collective::kAlltoallv, "receive", recv_counts,
                                              recv_displacements, output.size(), sizeof(T));
    const auto self = static_cast<std::size_t>(rank());
    require_size(Collective::kAlltoallv, "the block this rank sends itself (recv_counts[rank])",
                 recv_counts[self], send_counts[self]);
    require_distinct(Collective::kAlltoallv, std::as_bytes(input), std::as_bytes(output));
    const Memory memory =
        memory_of_call(Collective::kAlltoallv, std::as_bytes(input), std::as_bytes(output));
    if (memory == Memory::kDevice) {
      return dispatch(
          memory, [] {},
          [&](auto& staged) {
            staged.alltoallv(input, send_counts, send_displacements, output, recv_counts,
                             recv_displacements, algorithm);
          },
          [&](auto& nccl, auto stream) {
            require_nccl_native(Collective::kAlltoallv, algorithm);
            const PeerTransfers transfers =
                pairwise_transfers(input.data(), sent.bytes, sent.offsets, output.data(),
                                   received.bytes, received.offsets);
            nccl.exchange(Collective::kAlltoallv, input.size(), data_type_v<T>, transfers.sends,
                          transfers.receives, stream);
          });
    }
    host_alltoallv(std::as_bytes(input), sent.bytes, sent.offsets, std::as_writable_bytes(output),
                   received.bytes, received.offsets, data_type_v<T>, algorithm);
  }

  // ---- barrier: returns on every rank once all ranks have entered it (over the host backend;
  // it does not wait for device work: synchronize() does) ----
  void barrier(Algorithm algorithm = Algorithm::kAutomatic);

  // ---- Non-blocking calls: each takes the blocking call's arguments and returns a Request
  // (comm/request.hpp) at once; the call runs on this communicator's progress thread, after the
  // calls issued before it, and Request::wait() throws what the blocking call would. Its buffers
  // must stay valid and untouched until then. Staged device buffers (MPI, TCP) are queued the same
  // way and start after the work on stream() at the time of the call; on NCCL the call is enqueued
  // on stream() as its blocking form is, and its Request is complete at once.
  template <detail::CollectiveElement T>
  Request iallreduce(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum,
                     Algorithm algorithm = Algorithm::kAutomatic,
                     std::optional<WireCompression> compression = std::nullopt) {
    return issue(Collective::kAllreduce, std::as_bytes(input), std::as_bytes(output),
                 [=, this] { allreduce(input, output, op, algorithm, compression); });
  }
  template <detail::CollectiveElement T>
  Request iallreduce(std::span<T> data, ReduceOp op = ReduceOp::kSum,
                     Algorithm algorithm = Algorithm::kAutomatic,
                     std::optional<WireCompression> compression = std::nullopt) {
    return iallreduce(std::span<const T>(data), data, op, algorithm, compression);
  }
  template <detail::CollectiveElement T>
  Request ibroadcast(std::span<T> data, int root = 0, Algorithm algorithm = Algorithm::kAutomatic) {
    return issue(Collective::kBroadcast, std::as_bytes(data), std::as_bytes(data),
                 [=, this] { broadcast(data, root, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request iallgather(std::span<const T> input, std::span<T> output,
                     Algorithm algorithm = Algorithm::kAutomatic) {
    return issue(Collective::kAllgather, std::as_bytes(input), std::as_bytes(output),
                 [=, this] { allgather(input, output, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request ireduce_scatter(std::span<const T> input, std::span<T> output,
                          ReduceOp op = ReduceOp::kSum,
                          Algorithm algorithm = Algorithm::kAutomatic) {
    return issue(Collective::kReduceScatter, std::as_bytes(input), std::as_bytes(output),
                 [=, this] { reduce_scatter(input, output, op, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request ireduce(std::span<const T> input, std::span<T> output, int root = 0,
                  ReduceOp op = ReduceOp::kSum, Algorithm algorithm = Algorithm::kAutomatic) {
    const std::span<T> used_output = rank() == root ? output : std::span<T>();
    return issue(Collective::kReduce, std::as_bytes(input), std::as_bytes(used_output),
                 [=, this] { reduce(input, output, root, op, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request ialltoall(std::span<const T> input, std::span<T> output,
                    Algorithm algorithm = Algorithm::kAutomatic) {
    return issue(Collective::kAlltoall, std::as_bytes(input), std::as_bytes(output),
                 [=, this] { alltoall(input, output, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request igather(std::span<const T> input, std::span<T> output, int root = 0,
                  Algorithm algorithm = Algorithm::kAutomatic) {
    return issue(Collective::kGather, std::as_bytes(input), std::as_bytes(output),
                 [=, this] { gather(input, output, root, algorithm); });
  }
  template <detail::CollectiveElement T>
  Request iscatter(std::span<const T> input, std::span<T> output, int root = 0,
                   Algorithm algorithm = Algorithm::kAutomatic) {
    return issue(Collective::kScatter, std::as_bytes(input), std::as_bytes(output),
                 [=, this] { scatter(input, output, root, algorithm); });
  }
  // The counts (and displacements) are copied: they may go once the call returns.
  template <detail::CollectiveElement T>
  Request iallgatherv(std::span<const T> input, std::span<T> output,
                      std::span<const std::size_t> counts,
                      Algorithm algorithm = Algorithm::kAutomatic) {
    return issue(Collective::kAllgatherv, std::as_bytes(input), std::as_bytes(output),
                 [=, this, counts = std::vector(counts.begin(), counts.end())] {
                   allgatherv(input, output, std::span(counts), algorithm);
                 });
  }
  template <detail::CollectiveElement T>
  Request ialltoallv(std::span<const T> input, std::span<const std::size_t> send_counts,
                     std::span<const std::size_t> send_displacements, std::span<T> output,
                     std::span<const std::size_t> recv_counts,
                     std::span<const std::size_t> recv_displacements,
                     Algorithm algorithm = Algorithm::kAutomatic) {
    using Sizes = std::vector<std::size_t>;
    return issue(Collective::kAlltoallv, std::as_bytes(input), std::as_bytes(output),
                 [=, this, sc = Sizes(send_counts.begin(), send_counts.end()),
                  sd = Sizes(send_displacements.begin(), send_displacements.end()),
                  rc = Sizes(recv_counts.begin(), recv_counts.end()),
                  rd = Sizes(recv_displacements.begin(), recv_displacements.end())] {
                   alltoallv(input, std::span(sc), std::span(sd), output, std::span(rc),
                             std::span(rd), algorithm);
                 });
  }
  Request ibarrier(Algorithm algorithm = Algorithm::kAutomatic) {
    return progress_.submit([=, this] { barrier(algorithm); });
  }

  // ---- send / recv: a message from this rank to `peer`, received there by recv with this rank
  // and the same tag (0 to kMaxTag). Messages between two ranks with one tag arrive in the order
  // they were sent; with different tags, and against the collectives, in any order (MPI's rules):
  // a message never meets a collective's receive. The receive's count and dtype must be the
  // sender's, or both fail with MismatchError. A rank cannot send to itself. Device buffers over
  // MPI and TCP travel through host memory; on NCCL they take tag 0 only, wait in one group that
  // goes to NCCL when one of them is waited for or tested (or another device call comes), and
  // are then ordered on stream() like the collectives: synchronize() waits for the data.
  // isend/irecv post the message at once and return; it progresses whenever this communicator
  // moves bytes (any call on it, or wait/test on any of its requests). The buffer must stay valid
  // and untouched until the request completes. ----
  static constexpr int kMaxTag = 16000;

  template <detail::CollectiveElement T>
  void send(std::span<const T> data, int peer, int tag = 0) {
    isend(data, peer, tag).wait();
  }
  template <detail::CollectiveElement T>
  void recv(std::span<T> data, int peer, int tag = 0) {
    irecv(data, peer, tag).wait();
  }
  template <detail::CollectiveElement T>
  Request isend(std::span<const T> data, int peer, int tag = 0) {
    return post_message(true, peer, tag, data_type_v<T>, data.size(), std::as_bytes(data), {});
  }
  template <detail::CollectiveElement T>
  Request irecv(std::span<T> data, int peer, int tag = 0) {
    return post_message(false, peer, tag, data_type_v<T>, data.size(), {},
                        std::as_writable_bytes(data));
  }

  // ---- split: a new communicator of the ranks that pass the same color, ordered by key and then
  // by their rank here (MPI_Comm_split's order); nullopt for a negative color. Collective over
  // this communicator. The new one has this one's backend (MPI_Comm_split; over TCP connections of
  // its own, made without a rendezvous: comm/rendezvous/split.hpp; ncclCommSplit), options, cost
  // model and tuning. The two may be used one after another or each from its own thread, and their
  // messages never meet.
  std::optional<Communicator> split(int color, int key = 0);

 private:
  // Queues `call` on the progress thread; device buffers on NCCL are enqueued on stream() at once
  // instead, as their blocking form is.
  template <class F>
  Request issue(Collective collective, std::span<const std::byte> input,
                std::span<const std::byte> output, F&& call) {
    if (memory_of_call(collective, input, output) == Memory::kDevice) {
#if COLTRAIN_WITH_CUDA
      if (!stream_ordered()) return issue_staged(std::forward<F>(call));
#endif
      call();
      return Request();
    }
    return progress_.submit(std::forward<F>(call));
  }

#if COLTRAIN_WITH_CUDA
  // A staged device call, queued: it starts after the work stream() held when it was issued (an
  // event recorded now), not after what the stream holds when the progress thread reaches it, so
  // work the caller enqueues meanwhile neither delays it nor races it. The stager is made here, on
  // the caller's device.
  template <class F>
  Request issue_staged(F&& call) {
    DeviceStaging& staged = staging();
    const auto issued = std::make_shared<detail::IssuedEvent>(stream_);
    return progress_.submit([this, &staged, issued, call = std::forward<F>(call)]() mutable {
      COLTRAIN_CHECK_CUDA(cudaSetDevice(staged.stager().device()));
      staged.stager().start_after(issued->event());
      try {
        call();
      } catch (...) {
        staged.stager().start_after(nullptr);
        throw;
      }
      staged.stager().start_after(nullptr);
    });
  }
#endif

  // isend/irecv: checks the arguments, numbers the message within its rank pair and tag, and posts
  // it to the transport once the progress thread has finished the calls issued before it.
  Request post_message(bool sending, int peer, int tag, DataType dtype, std::size_t count,
                       std::span<const std::byte> outgoing, std::span<std::byte> incoming);

  // A message's request, driven by `advance` (comm/protocol/message_book.hpp).
  Request book_message(std::function<bool(bool block)> advance);

  // Records the new communicator's identity (and names the process in the timeline unless
  // names_process is false).
  Communicator(Backend backend, std::unique_ptr<HostCollectives> host, bool names_process = true);
#if COLTRAIN_WITH_MPI
  // MPI_COMM_WORLD, initialising MPI when nobody has, and finalising it with the communicator.
  static Communicator mpi_world(const CommOptions& options);
#endif

  // The host path, once the calls queued on the progress thread have run: from then on the host
  // transport is this thread's.
  HostCollectives& ready_host();

  // Where a call's buffers live: device when any non-empty one is device memory. Mixed memory is
  // refused: the host path would read device memory, the device path host memory. Empty buffers
  // live nowhere: on NCCL they take the device path (a no-op there, and the algorithms a device
  // call may name, 'native' among them), elsewhere the host path.
  Memory memory_of_call(Collective collective, std::span<const std::byte> input,
                        std::span<const std::byte> output) const {
    if constexpr (!BuildConfig::kWithCuda) return Memory::kHost;
    if (input.empty() && output.empty())
      return backend_ == Backend::kNccl ? Memory::kDevice : Memory::kHost;
    const Memory in = input.empty() ? Memory::kHost : detail::memory_of(input.data());
    const bool same = output.empty() || output.data() == input.data();
    const Memory out = same ? in : detail::memory_of(output.data());
    if (!input.empty() && in != out) {
      const ErrorContext context = call_context(collective);
      throw InvalidArgument("input is " + std::string(name_of(in)) + " memory but output is " +
                                std::string(name_of(out)) +
                                " memory; a call's buffers must live in the same memory",
                            context);
    }
    return out;
  }

  // Runs `host()` for host buffers, `staged(StagedCommunicator&)` for device buffers on MPI and
  // TCP, `nccl(DeviceCollectives&, stream())` for device buffers on NCCL. Without CUDA every
  // buffer is host.
  template <class Host, class Staged, class Nccl>
  void dispatch(Memory memory, Host&& host, [[maybe_unused]] Staged&& staged,
                [[maybe_unused]] Nccl&& nccl) {
    if (memory == Memory::kHost) return host();
#if COLTRAIN_WITH_CUDA
#if COLTRAIN_WITH_NCCL
    if (nccl_) {
      flush_device_messages();
      return nccl(*nccl_, stream_);
    }
#endif
    return staged(staging());
#endif
  }

#if COLTRAIN_WITH_CUDA
  // A blocking copy between host and device memory, after the work queued on `stream`.
  static void copy_after_stream(void* to, const void* from, std::size_t bytes,
                                cudaStream_t stream) {
    if (bytes == 0) return;
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, stream));
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
  }

  // The in-place alltoall of device buffers: staged, the input slot holds the copy; on NCCL, a
  // copy on the device, made and freed on stream().
  template <class T>
  void device_alltoall_in_place(std::span<T> data, Algorithm algorithm) {
    const std::size_t count = data.size() / group_size();
    require_size(Collective::kAlltoall, "data", data.size(), count * group_size());
    dispatch(
        Memory::kDevice, [] {}, [&](auto& staged) { staged.alltoall(data, algorithm); },
        [&](auto&, auto stream) {
          if (data.empty()) return alltoall(std::span<const T>(), data, algorithm);
          void* copy = nullptr;
          COLTRAIN_CHECK_CUDA(cudaMallocAsync(&copy, data.size_bytes(), stream));
          try {
            COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(copy, data.data(), data.size_bytes(),
                                                cudaMemcpyDeviceToDevice, stream));
            alltoall(std::span<const T>(static_cast<const T*>(copy), data.size()), data, algorithm);
          } catch (...) {
            cudaFreeAsync(copy, stream);
            throw;
          }
          COLTRAIN_CHECK_CUDA(cudaFreeAsync(copy, stream));
        });
  }
#endif

#if COLTRAIN_WITH_NCCL
  // Device messages on NCCL wait in one group, which goes to NCCL as one ncclGroupStart ...
  // ncclGroupEnd when one of its requests is waited for or tested, and before any other device
  // call: two ranks that each isend and then irecv do not deadlock, as two separate NCCL calls
  // would.
  struct DeviceMessageGroup {
    DeviceCollectives* nccl = nullptr;
    cudaStream_t stream = nullptr;
    PeerTransfers transfers;
    std::size_t bytes = 0;

    void flush() {
      if (transfers.sends.empty() && transfers.receives.empty()) return;
      const PeerTransfers posted = std::exchange(transfers, {});
      nccl->exchange(Collective::kSendRecv, std::exchange(bytes, 0), DataType::kUInt8, posted.sends,
                     posted.receives, stream);
    }
  };

  Request post_nccl_message(bool sending, int peer, int tag, std::span<const std::byte> outgoing,
                            std::span<std::byte> incoming, const ErrorContext& context) {
    if (tag != 0) {
      throw InvalidArgument(std::string(sending ? "send" : "recv") + ": tag " +
                                std::to_string(tag) +
                                " on NCCL device buffers; NCCL has no tags and matches a pair of "
                                "ranks' messages in the order they are posted: use tag 0",
                            context);
    }
    if (!device_messages_) device_messages_ = std::make_shared<DeviceMessageGroup>();
    DeviceMessageGroup& group = *device_messages_;
    if (group.stream != stream_) group.flush();
    group.nccl = nccl_.get();
    group.stream = stream_;
    if (sending) {
      group.transfers.sends.push_back({peer, outgoing.data(), outgoing.size()});
    } else {
      group.transfers.receives.push_back({peer, incoming.data(), incoming.size()});
    }
    group.bytes += sending ? outgoing.size() : incoming.size();
    progress_.drain();
    return book_message([group = device_messages_](bool) {
      group->flush();
      return true;
    });
  }

  void flush_device_messages() {
    if (device_messages_) device_messages_->flush();
  }
#endif

#if COLTRAIN_WITH_CUDA
  using DeviceStaging = StagedCommunicator<CudaStager, Communicator>;

  // The stager, made at the first staged call on the device current then, and pointed at this
  // communicator (which may have moved since).
  DeviceStaging& staging() {
    if (!staged_) staged_ = std::make_unique<DeviceStaging>(*this, staging_options_, stream_);
    staged_->rebind(*this);
    return *staged_;
  }
#endif

  // NCCL runs only its own collectives, except allreduce (which has ring and tree too).
  void require_nccl_native(Collective collective, Algorithm algorithm) const {
    if (algorithm == Algorithm::kAutomatic || algorithm == Algorithm::kNative) return;
    const ErrorContext context = call_context(collective);
    throw InvalidArgument(std::string(name_of(collective)) +
                              " on NCCL device buffers has no "
                              "algorithm '" +
                              std::string(name_of(algorithm)) + "' (it has: native, automatic)",
                          context);
  }

  // Byte sizes and offsets of blocks given in elements, each checked to lie inside a buffer of
  // `elements` elements.
  struct BlockLayout {
    std::vector<std::size_t> bytes;
    std::vector<std::size_t> offsets;
  };
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
        const ErrorContext context = call_context(collective);
        throw InvalidArgument(name + " block " + std::to_string(i) + " (" +
                                  std::to_string(counts[i]) + " elements at " +
                                  std::to_string(displacements[i]) + ") passes the end of the " +
                                  std::to_string(elements) + "-element buffer",
                              context);
      }
      layout.bytes.push_back(counts[i] * element_bytes);
      layout.offsets.push_back(displacements[i] * element_bytes);
    }
    return layout;
  }

  void require_distinct(Collective collective, std::span<const std::byte> input,
                        std::span<const std::byte> output) const {
    const bool overlap = !input.empty() && !output.empty() &&
                         input.data() < output.data() + output.size() &&
                         output.data() < input.data() + input.size();
    if (!overlap) return;
    const ErrorContext context = call_context(collective);
    throw InvalidArgument("input and output overlap; use the in-place form", context);
  }

  // The host path of each collective, on bytes (comm/host/host_collectives.hpp).
  void host_reduce(Collective collective, std::span<const std::byte> input,
                   std::span<std::byte> output, DataType dtype, ReduceOp op, int root,
                   Algorithm algorithm, WireCompression compression);
  void host_broadcast(std::span<std::byte> data, DataType dtype, int root, Algorithm algorithm);
  void host_allgather(std::span<const std::byte> input, std::span<std::byte> output, DataType dtype,
                      Algorithm algorithm);
  void host_allgatherv(std::span<const std::byte> input, std::span<std::byte> output,
                       std::span<const std::size_t> bytes, std::span<const std::size_t> offsets,
                       DataType dtype, Algorithm algorithm);
  void host_alltoall(std::span<const std::byte> input, std::span<std::byte> output, DataType dtype,
                     Algorithm algorithm);
  void host_alltoallv(std::span<const std::byte> input, std::span<const std::size_t> sent_bytes,
                      std::span<const std::size_t> sent_offsets, std::span<std::byte> output,
                      std::span<const std::size_t> received_bytes,
                      std::span<const std::size_t> received_offsets, DataType dtype,
                      Algorithm algorithm);
  // Gather and scatter: `block_bytes` per rank; the root's side holds size() blocks.
  void host_rooted_blocks(Collective collective, std::span<const std::byte> input,
                          std::span<std::byte> output, std::size_t block_bytes, DataType dtype,
                          int root, Algorithm algorithm);

  std::size_t group_size() const { return static_cast<std::size_t>(size()); }

  // `names_process`: this communicator's ranks are the process's ranks on the timeline (not a
  // split's, whose ranks are numbered within their group).
  void start_recording(const CommOptions& options, bool names_process = true);

  void require_size(Collective collective, const char* what, std::size_t actual,
                    std::size_t expected) const {
    if (actual != expected) {
      const ErrorContext context = call_context(collective);
      throw InvalidArgument(std::string(what) + " has " + std::to_string(actual) +
                                " elements, expected " + std::to_string(expected),
                            context);
    }
  }

  void require_root(Collective collective, int root) const {
    if (root < 0 || root >= size()) {
      const ErrorContext context = call_context(collective);
      throw InvalidArgument("root " + std::to_string(root) + " is not a rank of this " +
                                std::to_string(size()) + "-rank communicator",
                            context);
    }
  }

  ErrorContext call_context(Collective collective) const {
    ErrorContext context;
    context.rank = rank();
    context.operation = std::string(name_of(collective));
    return context;
  }

  // What an allreduce of T travels as: the call's choice, else the communicator's for f32 with
  // the automatic algorithm. Compression takes f32 and its own schedule, so it refuses other types
  // and named algorithms.
  template <class T>
  WireCompression wire_format(std::optional<WireCompression> requested, Algorithm algorithm) const {
    if (!requested) {
      const bool applies = std::is_same_v<T, float> && algorithm == Algorithm::kAutomatic;
      return applies ? compression_ : WireCompression::kNone;
    }
    if (*requested == WireCompression::kNone) return *requested;
    if (!std::is_same_v<T, float>) {
      throw InvalidArgument(
          "allreduce: wire compression takes f32 data, not " + std::string(name_of(data_type_v<T>)),
          call_context(Collective::kAllreduce));
    }
    if (algorithm != Algorithm::kAutomatic) {
      throw InvalidArgument(
          "allreduce: wire compression has its own schedule (pairwise "
          "reduce-scatter, ring allgather); pass Algorithm::kAutomatic, not '" +
              std::string(name_of(algorithm)) + "'",
          call_context(Collective::kAllreduce));
    }
    return *requested;
  }

  // allreduce, reduce_scatter and reduce on host buffers.
  template <detail::CollectiveElement T>
  void reduce_collective(Collective collective, std::span<const T> input, std::span<T> output,
                         ReduceOp op, int root, Algorithm algorithm,
                         WireCompression compression = WireCompression::kNone) {
    host_reduce(collective, std::as_bytes(input), std::as_writable_bytes(output), data_type_v<T>,
                op, root, algorithm, compression);
  }

  // First: moving a communicator waits for its requests, whose calls hold its address, before any
  // other member moves.
  detail::ProgressThread progress_;
  Backend backend_;
  Backend host_backend_;
  // On the heap: it never moves (SIGUSR1's thread holds its flight recorder's address).
  std::unique_ptr<HostCollectives> host_;
  CostModel device_cost_model_;  // NCCL's, for device buffers
  WireCompression compression_ = WireCompression::kNone;
  StagingOptions staging_options_;
  std::vector<std::byte> alltoall_input_;  // the in-place alltoall's copy of its input
#if COLTRAIN_WITH_CUDA
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DeviceStaging> staged_;
#endif
#if COLTRAIN_WITH_NCCL
  std::vector<cudaStream_t> earlier_streams_;            // NCCL calls went there before set_stream
  std::shared_ptr<DeviceMessageGroup> device_messages_;  // isend/irecv not yet given to NCCL
  std::unique_ptr<DeviceCollectives> nccl_;  // declared last: goes before the host transport
#endif
};

}  // namespace coltrain::comm

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/comm/impl/communicator.ipp>
#endif
