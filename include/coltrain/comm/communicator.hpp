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

#include <coltrain/comm/call_checks.hpp>
#include <coltrain/comm/device/staging_options.hpp>
#include <coltrain/comm/elements.hpp>
#include <coltrain/comm/host_layout.hpp>
#include <coltrain/comm/nonblocking_calls.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/point_to_point.hpp>
#include <coltrain/comm/request.hpp>
#include <coltrain/comm/transport/tcp/file_descriptor.hpp>
#include <coltrain/comm/tuning/algorithm_tuning.hpp>
#include <coltrain/comm/tuning/cost_model.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/launch_env.hpp>

#if COLTRAIN_WITH_MPI
#include <mpi.h>
#endif

#if COLTRAIN_WITH_CUDA
#include <coltrain/comm/device/device_path.hpp>

#include <cuda_runtime.h>
#endif

// Under nvcc, where cuda_fp16.h is in already, the NCCL backend and the ring's and tree's
// reduction kernel register themselves (comm/device/device_collectives.hpp says why not under g++).
#if COLTRAIN_WITH_NCCL && defined(__CUDACC__)
#include <coltrain/comm/device/nccl/nccl_backend.hpp>
#include <coltrain/cuda/nccl_reduce.cuh>
#endif

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::comm {

class FlightRecorder;
class HostCollectives;
struct TuningFile;

class Communicator : public NonBlockingCalls<Communicator>, public PointToPoint<Communicator> {
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
  static Communicator nccl(Communicator host, CommOptions options = comm_options_from_env());

  // The NCCL backend's device side; dynamic_cast it to NcclBackend
  // (comm/device/nccl/nccl_backend.hpp) for what this class does not wrap (the ncclComm_t, a stream
  // per call).
  DeviceCollectives& nccl();
#endif

  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  // Finishes the requests still outstanding first (each bounded by the timeout).
  ~Communicator();

  int rank() const;
  int size() const;
  // Which ranks share a host (comm/host_layout.hpp): where hierarchical allreduce reduces first.
  const HostLayout& host_layout() const;
  // The options the host path runs with: those it was made with, and a tuning file's measured
  // values where use_tuning or CommOptions::tuning_file gave one.
  const CommOptions& options() const;
  // Whether large host payloads to `peer` can go by single copy: TCP between ranks of a host
  // whose memory this rank may read (CommOptions::shared_memory_single_copy). Never over MPI.
  bool single_copy_with(int peer) const;
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
  std::string trace_dir() const;
  void set_trace_dir(std::string dir);

  // The model kAutomatic uses for `memory`'s buffers: the host backend's, and for device buffers
  // on NCCL the NCCL one (staged device buffers run host collectives per chunk).
  const CostModel& cost_model(Memory memory = Memory::kHost) const;
  void set_cost_model(const CostModel& model, Memory memory = Memory::kHost);
  const AlgorithmTuning& tuning() const;
  void set_tuning(const AlgorithmTuning& tuning);
  // Measurements for kAutomatic to choose from: a file benchmarks/coltrain_tune wrote
  // (load_tuning_file, comm/tuning/tuning_file.hpp). Its rules for this job's shape come first;
  // its constants replace the cost models of the backends it has; its single-copy ranges replace
  // CommOptions::single_copy_exchanges(_on_small_pages). COLTRAIN_TUNING_FILE does this when the
  // communicator is made. The same file on every rank; waits for this rank's requests first.
  void use_tuning(const TuningFile& tuning);
  // How device buffers are staged on MPI and TCP; the same on every rank.
  const StagingOptions& staging_options() const { return staging_options_; }
  void set_staging_options(const StagingOptions& options);

  // What kAutomatic runs for `collective` over an array of `bytes` bytes in `memory` on this
  // communicator (staged device buffers: what each chunk's host collective would run).
  Algorithm choose(Collective collective, std::size_t bytes, Memory memory = Memory::kHost) const;

  // Whether reductions run in rank order whatever algorithm they name (CommOptions::deterministic).
  bool deterministic() const;

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
  void set_stream(cudaStream_t stream) { device_.set_stream(stream); }
  cudaStream_t stream() const { return device_.stream(); }

  // Returns once every device collective called so far has finished; on NCCL waits up to the
  // communicator's timeout (COLTRAIN_TIMEOUT) and throws TimeoutError or BackendError, after
  // aborting the communicator, naming the rank, operation, count and dtype. Staged collectives
  // have finished when they return.
  void synchronize() { device_.synchronize(); }
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
    const detail::CallChecks check = checks();
    check.require_size(Collective::kAllreduce, "output", output.size(), input.size());
    dispatch(
        memory_of_call(Collective::kAllreduce, std::as_bytes(input), std::as_bytes(output)),
        [&] {
          host_reduce(Collective::kAllreduce, std::as_bytes(input), std::as_writable_bytes(output),
                      data_type_v<T>, op, 0, algorithm,
                      check.wire_format<T>(compression, algorithm, compression_));
        },
        [&](auto& device) {
          if (compression && *compression != WireCompression::kNone) {
            throw InvalidArgument("allreduce: wire compression applies to host buffers",
                                  check.context(Collective::kAllreduce));
          }
          device.allreduce(input, output, op, algorithm);
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
    checks().require_root(Collective::kBroadcast, root);
    dispatch(
        memory_of_call(Collective::kBroadcast, std::as_bytes(data), std::as_bytes(data)),
        [&] { host_broadcast(std::as_writable_bytes(data), data_type_v<T>, root, algorithm); },
        [&](auto& device) { device.broadcast(data, root, algorithm); });
  }

  // ---- allgather: output[i * count, (i + 1) * count) = rank i's input; output has size() * count
  template <detail::CollectiveElement T>
  void allgather(std::span<const T> input, std::span<T> output,
                 Algorithm algorithm = Algorithm::kAutomatic) {
    const detail::CallChecks check = checks();
    check.require_size(Collective::kAllgather, "output", output.size(),
                       input.size() * check.group_size());
    dispatch(
        memory_of_call(Collective::kAllgather, std::as_bytes(input), std::as_bytes(output)),
        [&] {
          host_allgather(std::as_bytes(input), std::as_writable_bytes(output), data_type_v<T>,
                         algorithm);
        },
        [&](auto& device) { device.allgather(input, output, algorithm); });
  }
  // In place: data holds size() blocks; this rank's block is its input.
  template <detail::CollectiveElement T>
  void allgather(std::span<T> data, Algorithm algorithm = Algorithm::kAutomatic) {
    const detail::CallChecks check = checks();
    const std::size_t count = data.size() / check.group_size();
    check.require_size(Collective::kAllgather, "data", data.size(), count * check.group_size());
    allgather(std::span<const T>(data.subspan(count * static_cast<std::size_t>(rank()), count)),
              data, algorithm);
  }

  // ---- reduce_scatter: rank i gets block i of the reduction; input has size() * output.size()
  // ----
  template <detail::CollectiveElement T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum,
                      Algorithm algorithm = Algorithm::kAutomatic) {
    const detail::CallChecks check = checks();
    check.require_size(Collective::kReduceScatter, "input", input.size(),
                       output.size() * check.group_size());
    dispatch(
        memory_of_call(Collective::kReduceScatter, std::as_bytes(input), std::as_bytes(output)),
        [&] {
          host_reduce(Collective::kReduceScatter, std::as_bytes(input),
                      std::as_writable_bytes(output), data_type_v<T>, op, 0, algorithm,
                      WireCompression::kNone);
        },
        [&](auto& device) { device.reduce_scatter(input, output, op, algorithm); });
  }
  // In place: data holds size() blocks; the result lands in this rank's block.
  template <detail::CollectiveElement T>
  void reduce_scatter(std::span<T> data, ReduceOp op = ReduceOp::kSum,
                      Algorithm algorithm = Algorithm::kAutomatic) {
    const detail::CallChecks check = checks();
    const std::size_t count = data.size() / check.group_size();
    check.require_size(Collective::kReduceScatter, "data", data.size(), count * check.group_size());
    reduce_scatter(std::span<const T>(data),
                   data.subspan(count * static_cast<std::size_t>(rank()), count), op, algorithm);
  }

  // ---- reduce: the root gets the reduction; output is written (and checked) on the root only ----
  template <detail::CollectiveElement T>
  void reduce(std::span<const T> input, std::span<T> output, int root = 0,
              ReduceOp op = ReduceOp::kSum, Algorithm algorithm = Algorithm::kAutomatic) {
    const detail::CallChecks check = checks();
    check.require_root(Collective::kReduce, root);
    const bool is_root = rank() == root;
    if (is_root) check.require_size(Collective::kReduce, "output", output.size(), input.size());
    // Off the root the output is not used: only the input says where the call's data lives.
    const std::span<T> used_output = is_root ? output : std::span<T>();
    dispatch(
        memory_of_call(Collective::kReduce, std::as_bytes(input), std::as_bytes(used_output)),
        [&] {
          host_reduce(Collective::kReduce, std::as_bytes(input), std::as_writable_bytes(output),
                      data_type_v<T>, op, root, algorithm, WireCompression::kNone);
        },
        [&](auto& device) { device.reduce(input, output, root, op, algorithm); });
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
    const detail::CallChecks check = checks();
    check.require_size(Collective::kAlltoall, "output", output.size(), input.size());
    const std::size_t count = input.size() / check.group_size();
    check.require_size(Collective::kAlltoall, "input", input.size(), count * check.group_size());
    check.require_distinct(Collective::kAlltoall, std::as_bytes(input), std::as_bytes(output));
    dispatch(
        memory_of_call(Collective::kAlltoall, std::as_bytes(input), std::as_bytes(output)),
        [&] {
          host_alltoall(std::as_bytes(input), std::as_writable_bytes(output), data_type_v<T>,
                        algorithm);
        },
        [&](auto& device) { device.alltoall(input, output, algorithm); });
  }
  // In place: data's blocks are replaced by the blocks the other ranks sent (through a copy).
  template <detail::CollectiveElement T>
  void alltoall(std::span<T> data, Algorithm algorithm = Algorithm::kAutomatic) {
    const detail::CallChecks check = checks();
    const Memory memory =
        memory_of_call(Collective::kAlltoall, std::as_bytes(data), std::as_bytes(data));
    if (memory == Memory::kDevice) {
      check.require_size(Collective::kAlltoall, "data", data.size(),
                         data.size() / check.group_size() * check.group_size());
      return dispatch(
          memory, [] {}, [&](auto& device) { device.alltoall(data, algorithm); });
    }
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
    const detail::CallChecks check = checks();
    check.require_root(Collective::kGather, root);
    if (rank() == root)
      check.require_size(Collective::kGather, "output", output.size(),
                         input.size() * check.group_size());
    const std::span<T> used = rank() == root ? output : std::span<T>();
    dispatch(
        memory_of_call(Collective::kGather, std::as_bytes(input), std::as_bytes(used)),
        [&] {
          host_rooted_blocks(Collective::kGather, std::as_bytes(input),
                             std::as_writable_bytes(output), input.size_bytes(), data_type_v<T>,
                             root, algorithm);
        },
        [&](auto& device) { device.gather(input, output, root, algorithm); });
  }

  // ---- scatter: rank i's output is block i of the root's input (size() blocks); other ranks'
  // input may be empty and is not read.
  template <detail::CollectiveElement T>
  void scatter(std::span<const T> input, std::span<T> output, int root = 0,
               Algorithm algorithm = Algorithm::kAutomatic) {
    const detail::CallChecks check = checks();
    check.require_root(Collective::kScatter, root);
    if (rank() == root)
      check.require_size(Collective::kScatter, "input", input.size(),
                         output.size() * check.group_size());
    const std::span<const T> used = rank() == root ? input : std::span<const T>();
    dispatch(
        memory_of_call(Collective::kScatter, std::as_bytes(used), std::as_bytes(output)),
        [&] {
          host_rooted_blocks(Collective::kScatter, std::as_bytes(input),
                             std::as_writable_bytes(output), output.size_bytes(), data_type_v<T>,
                             root, algorithm);
        },
        [&](auto& device) { device.scatter(input, output, root, algorithm); });
  }

  // ---- allgatherv: rank i contributes counts[i] elements; output holds them all in rank order
  // (rank i's at the sum of counts[0..i)). counts has size() entries, the same on every rank;
  // counts[rank()] is input.size().
  template <detail::CollectiveElement T>
  void allgatherv(std::span<const T> input, std::span<T> output,
                  std::span<const std::size_t> counts,
                  Algorithm algorithm = Algorithm::kAutomatic) {
    const detail::CallChecks check = checks();
    check.require_size(Collective::kAllgatherv, "counts", counts.size(), check.group_size());
    check.require_size(Collective::kAllgatherv, "input (counts[rank])", input.size(),
                       counts[static_cast<std::size_t>(rank())]);
    std::vector<std::size_t> bytes(counts.size());
    std::vector<std::size_t> offsets(counts.size());
    std::size_t total = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      bytes[i] = counts[i] * sizeof(T);
      offsets[i] = total * sizeof(T);
      total += counts[i];
    }
    check.require_size(Collective::kAllgatherv, "output", output.size(), total);
    check.require_distinct(Collective::kAllgatherv, std::as_bytes(input), std::as_bytes(output));
    const Memory memory =
        memory_of_call(Collective::kAllgatherv, std::as_bytes(input), std::as_bytes(output));
    if (memory == Memory::kDevice) {
      return dispatch(
          memory, [] {},
          [&](auto& device) {
            device.allgatherv(input, output, counts, std::span<const std::size_t>(bytes),
                              std::span<const std::size_t>(offsets), algorithm);
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
    const detail::CallChecks check = checks();
    const detail::BlockLayout sent = check.block_layout(
        Collective::kAlltoallv, "send", send_counts, send_displacements, input.size(), sizeof(T));
    const detail::BlockLayout received =
        check.block_layout(Collective::kAlltoallv, "receive", recv_counts, recv_displacements,
                           output.size(), sizeof(T));
    const auto self = static_cast<std::size_t>(rank());
    check.require_size(Collective::kAlltoallv,
                       "the block this rank sends itself (recv_counts[rank])", recv_counts[self],
                       send_counts[self]);
    check.require_distinct(Collective::kAlltoallv, std::as_bytes(input), std::as_bytes(output));
    const Memory memory =
        memory_of_call(Collective::kAlltoallv, std::as_bytes(input), std::as_bytes(output));
    if (memory == Memory::kDevice) {
      return dispatch(
          memory, [] {},
          [&](auto& device) {
            device.alltoallv(input, send_counts, send_displacements, output, recv_counts,
                             recv_displacements, std::span<const std::size_t>(sent.bytes),
                             std::span<const std::size_t>(sent.offsets),
                             std::span<const std::size_t>(received.bytes),
                             std::span<const std::size_t>(received.offsets), algorithm);
          });
    }
    host_alltoallv(std::as_bytes(input), sent.bytes, sent.offsets, std::as_writable_bytes(output),
                   received.bytes, received.offsets, data_type_v<T>, algorithm);
  }

  // ---- barrier: returns on every rank once all ranks have entered it (over the host backend;
  // it does not wait for device work: synchronize() does) ----
  void barrier(Algorithm algorithm = Algorithm::kAutomatic);

  // ---- Non-blocking forms (iallreduce, ibroadcast... ibarrier): comm/nonblocking_calls.hpp ----

  // ---- send / recv, isend / irecv: comm/point_to_point.hpp ----

  // ---- split: a new communicator of the ranks that pass the same color, ordered by key and then
  // by their rank here (MPI_Comm_split's order); nullopt for a negative color. Collective over
  // this communicator. The new one has this one's backend (MPI_Comm_split; over TCP connections of
  // its own, made without a rendezvous: comm/rendezvous/split.hpp; ncclCommSplit), options, cost
  // model and tuning. The two may be used one after another or each from its own thread, and their
  // messages never meet.
  std::optional<Communicator> split(int color, int key = 0);

 private:
  friend class NonBlockingCalls<Communicator>;
  friend class PointToPoint<Communicator>;

  // Queues `call` on the progress thread; device buffers on NCCL are enqueued on stream() at once
  // instead, as their blocking form is.
  template <class F>
  Request issue(Collective collective, std::span<const std::byte> input,
                std::span<const std::byte> output, F&& call) {
    if (memory_of_call(collective, input, output) == Memory::kDevice) {
#if COLTRAIN_WITH_CUDA
      if (!stream_ordered()) return device_path().issue_staged(progress_, std::forward<F>(call));
#endif
      call();
      return Request();
    }
    return progress_.submit(std::forward<F>(call));
  }

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

  detail::CallChecks checks() const { return {rank(), size()}; }

  // Where the call's buffers live (detail::CallChecks::memory_of_call).
  Memory memory_of_call(Collective collective, std::span<const std::byte> input,
                        std::span<const std::byte> output) const {
    return checks().memory_of_call(collective, input, output, backend_ == Backend::kNccl);
  }

  // Runs `host()` for host buffers and `device(DevicePath&)` for device buffers (which, without
  // CUDA, there are none of).
  template <class Host, class Device>
  void dispatch(Memory memory, Host&& host, [[maybe_unused]] Device&& device) {
    if (memory == Memory::kHost) return host();
#if COLTRAIN_WITH_CUDA
    device(device_path());
#endif
  }

#if COLTRAIN_WITH_CUDA
  // The device path, pointed at this communicator (which may have moved since the last call).
  DevicePath<Communicator>& device_path() {
    device_.rebind(*this);
    return device_;
  }
#endif

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

  // `names_process`: this communicator's ranks are the process's ranks on the timeline (not a
  // split's, whose ranks are numbered within their group).
  void start_recording(const CommOptions& options, bool names_process = true);

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
  DevicePath<Communicator> device_;  // declared last: NCCL goes before the host transport
#endif
};

}  // namespace coltrain::comm

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/comm/impl/communicator.ipp>
#endif
