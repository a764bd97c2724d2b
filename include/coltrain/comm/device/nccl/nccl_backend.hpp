#pragma once
// The NCCL backend of comm::Communicator: collectives on device buffers of one GPU per rank, given
// as raw pointers with the stream each is enqueued on. Communicator::from_env(Backend::kNccl) (or
// COLTRAIN_BACKEND=nccl, or Memory::kDevice in a build with NCCL) bootstraps one over MPI or TCP
// and routes device spans here, through the DeviceCollectives interface; including this header
// registers the factory it uses (comm/device/device_collectives.hpp). Communicator::nccl(), cast to
// NcclBackend, reaches it for what the front door does not wrap (the ncclComm_t, per-call streams,
// wait with a deadline of one's own). The front door is the one way to build a communicator.
//
// Collectives are enqueued on the given stream and return at once; buffers must stay valid until
// the stream has run them. The NCCL communicator is non-blocking (ncclConfig_t::blocking = 0), so
// no call into NCCL waits on a peer: wait() and synchronize() poll cudaStreamQuery and
// ncclCommGetAsyncError against a deadline, and on an error or at the deadline abort the
// communicator and throw (TimeoutError, BackendError) naming the rank, the world size and the last
// operation enqueued. After that the communicator is unusable. NCCL does not check that ranks
// agree on the collective, count or dtype: a disagreement shows as a timeout (or garbage). Not
// thread-safe: one thread calls a communicator at a time.
//
// Algorithms: kNative is NCCL's own collective, tuned for the topology; allreduce also runs
// coltrain's ring and pipelined double binary tree over ncclSend/ncclRecv, both cut into chunks
// of about 1 MiB, whose reduction of each received chunk is a CUDA kernel
// (comm/device/nccl/device_reduction.hpp says where it comes from; set_device_reduction overrides
// it). The ring reduces on a second stream of its own, so that a chunk's reduction overlaps the
// next chunk's transfer. (NCCL has no local-reduce primitive that could stand in for the kernel.)

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_NCCL
#error "coltrain/comm/device/nccl/nccl_backend.hpp needs NCCL: build with COLTRAIN_WITH_NCCL=1"
#endif

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/device/device_collectives.hpp>
#include <coltrain/comm/device/nccl/device_reduction.hpp>
#include <coltrain/comm/device/nccl/nccl_resources.hpp>
#include <coltrain/comm/device/nccl/nccl_schedules.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "coltrain's NCCL backend needs NCCL 2.14 or newer (non-blocking communicators)"
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace coltrain::comm {

class NcclBackend final : public DeviceCollectives {
 public:
  // Rank `rank` of `size` ranks that share `id` (from ncclGetUniqueId on one of them), on CUDA
  // device `device`. Waits, up to options.timeout, until all ranks have joined.
  NcclBackend(int rank, int size, const ncclUniqueId& id, int device,
              CommOptions options = comm_options_from_env())
      : rank_(rank), size_(size), device_(device), options_(std::move(options)) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw InvalidArgument("rank " + std::to_string(rank) + " is outside a world of " +
                                std::to_string(size) + " ranks",
                            context_of("NCCL init"));
    }
    require_device_exists();
    const detail::CurrentDevice current(device_);
    comm_ = detail::NcclHandle(device_, options_.timeout);
    last_call_.operation = "NCCL init";
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    finish_enqueue(ncclCommInitRankConfig(comm_.receive(), size, id, rank, &config));
  }

  NcclBackend(NcclBackend&&) noexcept = default;
  NcclBackend& operator=(NcclBackend&&) noexcept = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const override { return device_; }
  const CommOptions& options() const { return options_; }
  // The NCCL communicator, for calls coltrain does not wrap; null once aborted.
  ncclComm_t nccl_comm() const { return comm_.get(); }

  // The kernel that reduces received chunks in Algorithm::kRing and kTree: the one set here, else
  // the registered one (comm/device/nccl/device_reduction.hpp); null when there is neither.
  void set_device_reduction(DeviceReduction reduction) { device_reduction_ = reduction; }
  DeviceReduction device_reduction() const override {
    return device_reduction_ != nullptr ? device_reduction_ : registered_device_reduction();
  }

  // ---- allreduce: every rank's output is the reduction of all ranks' input (count elements) ----
  void allreduce(const void* input, void* output, std::size_t count, DataType dtype,
                 cudaStream_t stream, ReduceOp op = ReduceOp::kSum,
                 Algorithm algorithm = Algorithm::kAutomatic) override {
    start(Collective::kAllreduce, count, dtype);
    const ncclRedOp_t nccl_op = detail::nccl_reduce_op(op);
    if (algorithm == Algorithm::kHalvingDoubling || algorithm == Algorithm::kRankOrder) {
      throw invalid("has no algorithm '" + std::string(name_of(algorithm)) +
                    "' on NCCL (it has: native, ring, tree, automatic)");
    }
    if (algorithm == Algorithm::kAutomatic) algorithm = Algorithm::kNative;
    const bool own_algorithm = algorithm == Algorithm::kRing || algorithm == Algorithm::kTree;
    if (own_algorithm && device_reduction() == nullptr) {
      throw invalid("with algorithm '" + std::string(name_of(algorithm)) +
                    "' reduces on the device with a CUDA kernel, and this program has none: "
                    "compile one translation unit that includes <coltrain/comm/communicator.hpp> "
                    "(or <coltrain/cuda/nccl_reduce.cuh>) with nvcc, or use 'native'");
    }
    require_buffer("input", input, count);
    require_buffer("output", output, count);
    if (count == 0) return;
    const detail::CurrentDevice current(device_);
    if (own_algorithm && size_ == 1) {  // the reduction of one input is the input
      copy_input(input, output, count, dtype, stream);
      return;
    }
    if (algorithm == Algorithm::kRing) {
      ring_allreduce(input, output, count, dtype, op, stream);
      return;
    }
    if (algorithm == Algorithm::kTree) {
      tree_allreduce(input, output, count, dtype, op, stream);
      return;
    }
    if (average_of_one_rank(op, input, output, count, dtype, stream)) return;
    finish_enqueue(ncclAllReduce(input, output, count, detail::nccl_data_type(dtype), nccl_op,
                                 comm_.get(), stream));
  }
  template <SupportedElement T>
  void allreduce(std::span<const T> input, std::span<T> output, cudaStream_t stream,
                 ReduceOp op = ReduceOp::kSum, Algorithm algorithm = Algorithm::kAutomatic) {
    require_size(Collective::kAllreduce, "output", output.size(), input.size());
    allreduce(input.data(), output.data(), input.size(), data_type_v<T>, stream, op, algorithm);
  }

  // ---- broadcast: root's input to every rank's output (input is read on the root only) ----
  void broadcast(const void* input, void* output, std::size_t count, DataType dtype, int root,
                 cudaStream_t stream) override {
    start(Collective::kBroadcast, count, dtype);
    require_root(root);
    if (rank_ == root) require_buffer("input", input, count);
    require_buffer("output", output, count);
    if (count == 0) return;
    const detail::CurrentDevice current(device_);
    finish_enqueue(ncclBroadcast(input, output, count, detail::nccl_data_type(dtype), root,
                                 comm_.get(), stream));
  }
  // In place: root's data to every rank.
  template <SupportedElement T>
  void broadcast(std::span<T> data, int root, cudaStream_t stream) {
    broadcast(data.data(), data.data(), data.size(), data_type_v<T>, root, stream);
  }

  // ---- allgather: output[i * count, (i + 1) * count) = rank i's input; output has size() * count
  void allgather(const void* input, void* output, std::size_t count, DataType dtype,
                 cudaStream_t stream) override {
    start(Collective::kAllgather, count, dtype);
    require_buffer("input", input, count);
    require_buffer("output", output, count * group_size());
    if (count == 0) return;
    const detail::CurrentDevice current(device_);
    finish_enqueue(
        ncclAllGather(input, output, count, detail::nccl_data_type(dtype), comm_.get(), stream));
  }
  template <SupportedElement T>
  void allgather(std::span<const T> input, std::span<T> output, cudaStream_t stream) {
    require_size(Collective::kAllgather, "output", output.size(), input.size() * group_size());
    allgather(input.data(), output.data(), input.size(), data_type_v<T>, stream);
  }

  // ---- reduce_scatter: rank i's output (count elements) is block i of the reduction of all
  // ranks' input (size() * count elements) ----
  void reduce_scatter(const void* input, void* output, std::size_t count, DataType dtype,
                      cudaStream_t stream, ReduceOp op = ReduceOp::kSum) override {
    start(Collective::kReduceScatter, count, dtype);
    const ncclRedOp_t nccl_op = detail::nccl_reduce_op(op);
    require_buffer("input", input, count * group_size());
    require_buffer("output", output, count);
    if (count == 0) return;
    const detail::CurrentDevice current(device_);
    if (average_of_one_rank(op, input, output, count, dtype, stream)) return;
    finish_enqueue(ncclReduceScatter(input, output, count, detail::nccl_data_type(dtype), nccl_op,
                                     comm_.get(), stream));
  }
  template <SupportedElement T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, cudaStream_t stream,
                      ReduceOp op = ReduceOp::kSum) {
    require_size(Collective::kReduceScatter, "input", input.size(), output.size() * group_size());
    reduce_scatter(input.data(), output.data(), output.size(), data_type_v<T>, stream, op);
  }

  // ---- reduce: the root's output is the reduction (written and checked on the root only) ----
  void reduce(const void* input, void* output, std::size_t count, DataType dtype, int root,
              cudaStream_t stream, ReduceOp op = ReduceOp::kSum) override {
    start(Collective::kReduce, count, dtype);
    const ncclRedOp_t nccl_op = detail::nccl_reduce_op(op);
    require_root(root);
    require_buffer("input", input, count);
    if (rank_ == root) require_buffer("output", output, count);
    if (count == 0) return;
    const detail::CurrentDevice current(device_);
    if (average_of_one_rank(op, input, output, count, dtype, stream)) return;
    finish_enqueue(ncclReduce(input, output, count, detail::nccl_data_type(dtype), nccl_op, root,
                              comm_.get(), stream));
  }
  template <SupportedElement T>
  void reduce(std::span<const T> input, std::span<T> output, int root, cudaStream_t stream,
              ReduceOp op = ReduceOp::kSum) {
    if (rank_ == root) require_size(Collective::kReduce, "output", output.size(), input.size());
    reduce(input.data(), output.data(), input.size(), data_type_v<T>, root, stream, op);
  }

  // ---- exchange: the sends and receives as one NCCL group (ncclSend/ncclRecv of bytes); a send
  // to this rank meets this rank's receive from itself in the same group. Empty transfers are
  // left out. NCCL does not compare the two ends' sizes: a receive that waits for more than its
  // peer sends never completes, and synchronize() times out naming this call. ----
  void exchange(Collective collective, std::size_t count, DataType dtype,
                std::span<const PeerSend> sends, std::span<const PeerReceive> receives,
                cudaStream_t stream) override {
    start(collective, count, dtype);
    const std::size_t element = size_of(dtype);
    bool any = false;
    for (const PeerSend& send : sends) {
      require_peer(send.peer);
      require_buffer("input", send.data, send.bytes / element);
      any = any || send.bytes > 0;
    }
    for (const PeerReceive& receive : receives) {
      require_peer(receive.peer);
      require_buffer("output", receive.data, receive.bytes / element);
      any = any || receive.bytes > 0;
    }
    if (!any) return;
    const detail::CurrentDevice current(device_);
    finish_enqueue(ncclGroupStart());
    for (const PeerSend& send : sends) {
      if (send.bytes == 0) continue;
      finish_enqueue(ncclSend(send.data, send.bytes, ncclUint8, send.peer, comm_.get(), stream));
    }
    for (const PeerReceive& receive : receives) {
      if (receive.bytes == 0) continue;
      finish_enqueue(
          ncclRecv(receive.data, receive.bytes, ncclUint8, receive.peer, comm_.get(), stream));
    }
    finish_enqueue(ncclGroupEnd());
  }

  // ---- split: ncclCommSplit, with this communicator's options; null for a negative color ----
  std::unique_ptr<DeviceCollectives> split(int color, int key) override {
    require_usable();
    last_call_ = {};
    last_call_.operation = "NCCL split";
    const detail::CurrentDevice current(device_);
    std::unique_ptr<NcclBackend> child(new NcclBackend(device_, options_));
    child->last_call_.operation = "NCCL split";
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t result = ncclCommSplit(comm_.get(), color < 0 ? NCCL_SPLIT_NOCOLOR : color,
                                              key, child->comm_.receive(), &config);
    // NCCL runs the split as a job of this communicator, which stays busy until the job ends,
    // even where the call returned ncclSuccess (NCCL 2.28 on an H200: the next split was refused
    // as "before the previous operation returned ncclSuccess"), and hands out the new one only
    // then: the child is polled once its handle appears.
    finish_enqueue(result == ncclSuccess ? ncclInProgress : result);
    if (color < 0) return nullptr;
    child->finish_enqueue(ncclInProgress);
    if (ncclCommUserRank(child->comm_.get(), &child->rank_) != ncclSuccess ||
        ncclCommCount(child->comm_.get(), &child->size_) != ncclSuccess) {
      child->fail_nccl(ncclInternalError);
    }
    child->device_reduction_ = device_reduction_;
    return child;
  }

  // ---- barrier: returns once every rank has entered it and `stream`'s earlier work is done.
  // NCCL has none: a one-element allreduce, then synchronize(stream).
  void barrier(cudaStream_t stream) {
    start(Collective::kBarrier, 1, DataType::kInt32);
    const detail::CurrentDevice current(device_);
    {
      const detail::StreamAllocation word(sizeof(std::int32_t), stream);
      COLTRAIN_CHECK_CUDA(cudaMemsetAsync(word.get(), 0, sizeof(std::int32_t), stream));
      finish_enqueue(
          ncclAllReduce(word.get(), word.get(), 1, ncclInt32, ncclSum, comm_.get(), stream));
    }
    synchronize(stream);
  }

  // Returns once the work enqueued on `stream` has completed. Throws, after aborting the
  // communicator: BackendError when NCCL reports an asynchronous error or the stream a CUDA error,
  // TimeoutError when `deadline` passes first.
  void wait(cudaStream_t stream, Deadline deadline) {
    require_usable();
    for (unsigned polls = 0;; ++polls) {
      const cudaError_t query = cudaStreamQuery(stream);
      check_async_error();
      if (query == cudaSuccess) return;
      if (query != cudaErrorNotReady) fail_cuda(query);
      if (deadline.expired()) fail_timeout();
      detail::poll_backoff(polls);
    }
  }
  // wait() with the communicator's timeout (COLTRAIN_TIMEOUT).
  void synchronize(cudaStream_t stream) override { wait(stream, Deadline(options_.timeout)); }

 private:
  // On one rank every reduction is a copy. NCCL 2.28's one-rank average of floating types left the
  // last count % 4 elements of an out-of-place output unwritten (seen on an H100), so an average on
  // one rank is done here as the copy it is. True when it was.
  bool average_of_one_rank(ReduceOp op, const void* input, void* output, std::size_t count,
                           DataType dtype, cudaStream_t stream) const {
    if (group_size() != 1 || op != ReduceOp::kAvg) return false;
    copy_input(input, output, count, dtype, stream);
    return true;
  }

  // output = input on `stream` (nothing to do in place): a collective's result on one rank.
  static void copy_input(const void* input, void* output, std::size_t count, DataType dtype,
                         cudaStream_t stream) {
    if (input == output) return;
    COLTRAIN_CHECK_CUDA(
        cudaMemcpyAsync(output, input, count * size_of(dtype), cudaMemcpyDeviceToDevice, stream));
  }

  std::size_t group_size() const { return static_cast<std::size_t>(size_); }

  ErrorContext context_of(std::string operation) const {
    ErrorContext context;
    context.rank = rank_;
    context.operation = std::move(operation);
    if (last_call_.operation == context.operation) context.sequence = last_call_.sequence;
    return context;
  }
  InvalidArgument invalid(const std::string& message) const {
    return InvalidArgument(last_call_.operation + " " + message, context_of(last_call_.operation));
  }

  void require_device_exists() const {
    int devices = 0;
    COLTRAIN_CHECK_CUDA(cudaGetDeviceCount(&devices));
    if (device_ < 0 || device_ >= devices) {
      throw ConfigError("CUDA device " + std::to_string(device_) +
                            " does not exist: this node has " + std::to_string(devices) +
                            " (NCCL runs one rank per GPU and the device is LOCAL_RANK unless "
                            "given, so run at most that many ranks per node)",
                        context_of("NCCL init"));
    }
  }

  // Checks that the communicator works and numbers the call.
  void start(Collective collective, std::size_t count, DataType dtype) {
    require_usable();
    last_call_ = {std::string(name_of(collective)), count, dtype, sequence_++};
    static_cast<void>(detail::nccl_data_type(dtype));  // rejects a value that is no DataType
  }

  void require_usable() const {
    if (comm_.get() != nullptr) return;
    throw CommError(broken_.empty()
                        ? std::string("this NCCL communicator was moved from")
                        : "this NCCL communicator was aborted after an earlier error: " + broken_,
                    context_of(last_call_.operation));
  }

  void require_root(int root) const {
    if (root < 0 || root >= size_) {
      throw invalid("root " + std::to_string(root) + " is not a rank of this " +
                    std::to_string(size_) + "-rank communicator");
    }
  }

  void require_peer(int peer) const {
    if (peer < 0 || peer >= size_) {
      throw invalid("peer " + std::to_string(peer) + " is not a rank of this " +
                    std::to_string(size_) + "-rank communicator");
    }
  }

  void require_size(Collective collective, const char* what, std::size_t actual,
                    std::size_t expected) const {
    if (actual != expected) {
      ErrorContext context = context_of(std::string(name_of(collective)));
      context.sequence.reset();
      throw InvalidArgument(std::string(what) + " has " + std::to_string(actual) +
                                " elements, expected " + std::to_string(expected),
                            context);
    }
  }

  // A buffer of `elements` elements must be memory this communicator's GPU can use.
  void require_buffer(const char* what, const void* pointer, std::size_t elements) const {
    if (elements == 0) return;
    const std::string where = std::string(what) + " (" + std::to_string(elements) + " " +
                              std::string(name_of(last_call_.dtype)) + ")";
    if (pointer == nullptr) throw invalid("got a null " + where);
    cudaPointerAttributes attributes{};
    if (const cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
        status != cudaSuccess) {
      cudaGetLastError();  // clears the error, which is the caller's argument, not a fault
      throw invalid(where + " is no pointer CUDA knows (" + cudaGetErrorName(status) + ")");
    }
    if (attributes.type == cudaMemoryTypeUnregistered) {
      throw invalid(where +
                    " is pageable host memory; NCCL needs device memory (cudaMalloc). Host "
                    "buffers go through coltrain::comm::Communicator");
    }
    if (attributes.type == cudaMemoryTypeDevice && attributes.device != device_) {
      throw invalid(where + " is on CUDA device " + std::to_string(attributes.device) +
                    ", but this communicator runs on device " + std::to_string(device_));
    }
  }

  // Completes an enqueueing call: a non-blocking communicator may still be working on it
  // (ncclInProgress), and no other NCCL call may come before it is done.
  // Polls until the communicator is done with what was enqueued, within the timeout. A
  // communicator that a split is still making has no handle yet: it appears when the job ends.
  void finish_enqueue(ncclResult_t result) {
    const Deadline deadline(options_.timeout);
    for (unsigned polls = 0; result == ncclInProgress; ++polls) {
      if (deadline.expired()) fail_timeout();
      detail::poll_backoff(polls);
      if (comm_.get() == nullptr) continue;
      if (const ncclResult_t got = ncclCommGetAsyncError(comm_.get(), &result);
          got != ncclSuccess) {
        fail_nccl(got);
      }
    }
    if (result != ncclSuccess) fail_nccl(result);
  }

  void check_async_error() {
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t got = ncclCommGetAsyncError(comm_.get(), &state); got != ncclSuccess) {
      fail_nccl(got);
    }
    if (state != ncclSuccess && state != ncclInProgress) fail_nccl(state);
  }

  std::string where_failed() const {
    return last_call_.describe() + " on rank " + std::to_string(rank_) + " of " +
           std::to_string(size_) + " (device " + std::to_string(device_) + ")";
  }

  // The failures below abort the communicator, so that its kernels return and later calls throw.
  [[noreturn]] void fail_nccl(ncclResult_t code) {
    std::string reason = ncclGetErrorString(code);
    if (comm_.get() != nullptr) {
      const char* detail = ncclGetLastError(comm_.get());
      if (detail != nullptr && *detail != '\0') reason += " (" + std::string(detail) + ")";
    }
    abort_after(where_failed() + " failed: " + reason);
    throw BackendError("NCCL", static_cast<long>(code), broken_, context_of(last_call_.operation));
  }

  [[noreturn]] void fail_cuda(cudaError_t code) {
    abort_after(where_failed() + " failed on its stream: " + cudaGetErrorName(code) + " (" +
                cudaGetErrorString(code) + ")");
    throw BackendError("CUDA", static_cast<long>(code), broken_, context_of(last_call_.operation));
  }

  [[noreturn]] void fail_timeout() {
    std::ostringstream timeout;
    timeout << std::chrono::duration<double>(options_.timeout).count();
    const bool init = !last_call_.count;
    abort_after(where_failed() + " did not complete before its deadline (timeout " + timeout.str() +
                " s, COLTRAIN_TIMEOUT): " +
                (init ? "not all " + std::to_string(size_) +
                            " ranks joined (one did not start, failed, or got another unique id)"
                      : std::string("a peer failed, stalled, or called a different collective, "
                                    "count or dtype (NCCL does not check that ranks agree)")));
    throw TimeoutError(broken_, context_of(last_call_.operation));
  }

  void abort_after(std::string reason) {
    comm_.abort();
    broken_ = std::move(reason) + "; the NCCL communicator was aborted";
  }

  // Algorithm::kRing (see ring_allreduce_plan), on 2 ranks or more. Each round is one NCCL group
  // on `stream`; its reduction runs on the lane's stream once the group is done, while the next
  // round's group travels, and a round's group waits only for the reductions its plan names.
  // `stream` joins the lane at the end, so later work on it sees the result.
  void ring_allreduce(const void* input, void* output, std::size_t count, DataType dtype,
                      ReduceOp op, cudaStream_t stream) {
    const std::size_t element = size_of(dtype);
    const ncclDataType_t type = detail::nccl_data_type(dtype);
    const detail::Blocks segments(count, group_size());
    const int chunks = detail::ring_chunks(segments.size(0), element);
    const auto range = [&](int segment, int chunk) {
      return detail::chunk_of(segments, static_cast<std::size_t>(segment),
                              static_cast<std::size_t>(chunks), static_cast<std::size_t>(chunk));
    };
    const std::size_t slot_bytes = (segments.size(0) + chunks - 1) / chunks * element;
    const DeviceReduction reduction = device_reduction();
    const char* const in = static_cast<const char*>(input);
    char* const out = static_cast<char*>(output);
    const int right = (rank_ + 1) % size_;
    const int left = (rank_ + size_ - 1) % size_;
    if (!lane_) lane_ = std::make_unique<detail::ReductionLane>();
    const detail::ReductionLane& lane = *lane_;
    const detail::StreamAllocation scratch(detail::kRingSlots * slot_bytes, stream);
    const auto slot = [&](int s) {
      return static_cast<char*>(scratch.get()) + static_cast<std::size_t>(s) * slot_bytes;
    };
    std::vector<int> reduced;  // rounds whose reduction was enqueued, in order
    std::size_t waited = 0;    // reduced[0, waited) are behind `stream` already
    try {
      const std::vector<detail::RingRound> plan = detail::ring_allreduce_plan(size_, rank_, chunks);
      for (std::size_t t = 0; t < plan.size(); ++t) {
        const detail::RingRound& round = plan[t];
        const detail::Range sent = range(round.send_segment, round.chunk);
        const detail::Range arriving = range(round.receive_segment, round.chunk);
        if (sent.size == 0 && arriving.size == 0) continue;  // every rank skips the same ones
        // Waiting on the latest reduction the round needs covers the earlier ones: the lane runs
        // them in order.
        std::size_t needed = waited;
        while (needed < reduced.size() && reduced[needed] <= round.after_reductions) ++needed;
        if (needed > waited) {
          COLTRAIN_CHECK_CUDA(cudaStreamWaitEvent(stream, lane.reduced(needed - 1), 0));
          waited = needed;
        }
        void* const landing = round.reduce ? slot(round.slot) : out + arriving.begin * element;
        finish_enqueue(ncclGroupStart());
        if (sent.size > 0) {
          const char* source = (round.send_from_input ? in : out) + sent.begin * element;
          finish_enqueue(ncclSend(source, sent.size, type, right, comm_.get(), stream));
        }
        if (arriving.size > 0) {
          finish_enqueue(ncclRecv(landing, arriving.size, type, left, comm_.get(), stream));
        }
        finish_enqueue(ncclGroupEnd());
        if (round.reduce && arriving.size > 0) {
          COLTRAIN_CHECK_CUDA(cudaEventRecord(lane.transferred(), stream));
          COLTRAIN_CHECK_CUDA(cudaStreamWaitEvent(lane.stream(), lane.transferred(), 0));
          const int divisor = op == ReduceOp::kAvg && round.completes_segment ? size_ : 1;
          const std::size_t at = arriving.begin * element;
          reduction(out + at, in + at, slot(round.slot), arriving.size, dtype, op, divisor,
                    lane.stream());
          COLTRAIN_CHECK_CUDA(cudaEventRecord(lane.reduced(reduced.size()), lane.stream()));
          reduced.push_back(static_cast<int>(t));
        }
      }
      if (waited < reduced.size()) {
        COLTRAIN_CHECK_CUDA(cudaStreamWaitEvent(stream, lane.reduced(reduced.size() - 1), 0));
      }
    } catch (const Error&) {
      // A failed NCCL call has aborted already; a failed kernel leaves the ring half done.
      if (comm_.get() != nullptr) abort_after(where_failed() + " failed in the reduction kernel");
      throw;
    }
  }

  // Algorithm::kTree on 2 ranks or more: detail::tree_allreduce_plan's rounds, one NCCL group each,
  // then the round's reductions of what the children sent up. Chunks of up to
  // detail::kTreeChunkBytes.
  void tree_allreduce(const void* input, void* output, std::size_t count, DataType dtype,
                      ReduceOp op, cudaStream_t stream) {
    const std::size_t element = size_of(dtype);
    const ncclDataType_t type = detail::nccl_data_type(dtype);
    const detail::Blocks halves(count, 2);
    const std::size_t chunk_elements = std::max<std::size_t>(1, detail::kTreeChunkBytes / element);
    const std::size_t chunks =
        std::max<std::size_t>(1, (halves.size(0) + chunk_elements - 1) / chunk_elements);
    const std::array<detail::Blocks, 2> pieces{detail::Blocks(halves.size(0), chunks),
                                               detail::Blocks(halves.size(1), chunks)};
    const auto offset = [&](int tree, int chunk) {
      const auto t = static_cast<std::size_t>(tree);
      return (halves.begin(t) + pieces[t].begin(static_cast<std::size_t>(chunk))) * element;
    };
    const auto length = [&](int tree, int chunk) {
      return pieces[static_cast<std::size_t>(tree)].size(static_cast<std::size_t>(chunk));
    };
    const std::size_t slot_bytes = pieces[0].size(0) * element;      // the largest chunk
    const detail::StreamAllocation scratch(4 * slot_bytes, stream);  // 2 trees x 2 children
    const auto slot = [&](int tree, int child) {
      return static_cast<char*>(scratch.get()) +
             static_cast<std::size_t>(2 * tree + child) * slot_bytes;
    };
    const char* const in = static_cast<const char*>(input);
    char* const out = static_cast<char*>(output);
    const DeviceReduction reduce = device_reduction();
    using Buffer = detail::TreeTransfer::Buffer;
    try {
      for (const detail::TreeRoundPlan& round :
           detail::tree_allreduce_plan(size_, rank_, static_cast<int>(chunks))) {
        finish_enqueue(ncclGroupStart());
        for (const detail::TreeTransfer& transfer : round.transfers) {
          const std::size_t n = length(transfer.tree, transfer.chunk);
          if (n == 0) continue;  // both ends skip the same empty chunks
          const std::size_t at = offset(transfer.tree, transfer.chunk);
          if (transfer.send) {
            const char* source = (transfer.buffer == Buffer::kInput ? in : out) + at;
            finish_enqueue(ncclSend(source, n, type, transfer.peer, comm_.get(), stream));
          } else {
            void* target =
                transfer.buffer == Buffer::kScratch ? slot(transfer.tree, transfer.slot) : out + at;
            finish_enqueue(ncclRecv(target, n, type, transfer.peer, comm_.get(), stream));
          }
        }
        finish_enqueue(ncclGroupEnd());
        for (const detail::TreeReduction& reduction : round.reductions) {
          const std::size_t n = length(reduction.tree, reduction.chunk);
          if (n == 0) continue;
          const std::size_t at = offset(reduction.tree, reduction.chunk);
          const int divisor = op == ReduceOp::kAvg && reduction.completes ? size_ : 1;
          reduce(out + at, (reduction.first ? in : out) + at, slot(reduction.tree, reduction.slot),
                 n, dtype, op, divisor, stream);
        }
      }
    } catch (const Error&) {
      if (comm_.get() != nullptr) abort_after(where_failed() + " failed in the reduction kernel");
      throw;
    }
  }

  // An empty communicator on `device`, which split() fills.
  NcclBackend(int device, CommOptions options)
      : device_(device), options_(std::move(options)), comm_(device, options_.timeout) {}

  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  CommOptions options_;
  detail::NcclHandle comm_;
  std::unique_ptr<detail::ReductionLane> lane_;  // the ring's; made at its first call
  DeviceReduction device_reduction_ = nullptr;
  std::uint64_t sequence_ = 0;
  detail::NcclCall last_call_;
  std::string broken_;  // why the communicator was aborted
};

namespace detail {

// The NcclFactory that Communicator::nccl calls: rank 0 draws the unique id, `broadcast` hands it
// to every rank.
inline std::unique_ptr<DeviceCollectives> make_nccl_backend(int rank, int size,
                                                            const BroadcastWords& broadcast,
                                                            const CommOptions& options) {
  int device = 0;
  COLTRAIN_CHECK_CUDA(cudaGetDevice(&device));
  ncclUniqueId id{};
  if (rank == 0) COLTRAIN_CHECK_NCCL(ncclGetUniqueId(&id));
  UniqueIdWords words = unique_id_words(id);
  broadcast(std::span<std::int64_t>(words));
  return std::make_unique<NcclBackend>(rank, size, unique_id_from_words(words), device, options);
}

// Registered while this translation unit is initialised, before main.
[[maybe_unused]] static const bool kNcclBackendRegistered =
    (registered_nccl_factory() = &make_nccl_backend, true);

}  // namespace detail
}  // namespace coltrain::comm
