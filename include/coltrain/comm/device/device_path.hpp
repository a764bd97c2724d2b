#pragma once
// DevicePath<Comm>: where a Communicator's calls on device buffers go, once the communicator has
// checked their arguments. With an NCCL backend attached they are enqueued on stream() and return
// at once; otherwise (MPI, TCP) they are staged through pinned host memory by a
// StagedCommunicator over the communicator itself, and return with the result in device memory.
// This class translates a call for its path: NCCL's algorithm choice, blocks as peer transfers, the
// group NCCL's sends and receives wait in, the host copies of staged messages.
//
// Keeps a pointer to its communicator, which must rebind() it after moving.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/comm/device/device_path.hpp needs CUDA: build with COLTRAIN_WITH_CUDA=1"
#endif

#include <coltrain/comm/algorithms/peer_transfers.hpp>
#include <coltrain/comm/call_checks.hpp>
#include <coltrain/comm/device/device_collectives.hpp>
#include <coltrain/comm/device/device_staging.hpp>
#include <coltrain/comm/device/staged_collectives.hpp>
#include <coltrain/comm/elements.hpp>
#include <coltrain/comm/request.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::comm {

namespace detail {

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

// A blocking copy between host and device memory, after the work queued on `stream`.
inline void copy_after_stream(void* to, const void* from, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, stream));
  COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace detail

template <class Comm>
class DevicePath {
 public:
  using Staging = StagedCommunicator<CudaStager, Comm>;

  // The communicator this path serves; called before every use, as the communicator may have moved.
  void rebind(Comm& comm) {
    comm_ = &comm;
    if (staged_) staged_->rebind(comm);
  }

  // NCCL's device side, which from then on takes every device call; null when staging.
  void attach_nccl(std::unique_ptr<DeviceCollectives> nccl) { nccl_ = std::move(nccl); }
  DeviceCollectives* nccl() const { return nccl_.get(); }

  void set_stream(cudaStream_t stream) {
    if (nccl_ && stream != stream_ &&
        std::find(earlier_streams_.begin(), earlier_streams_.end(), stream_) ==
            earlier_streams_.end()) {
      earlier_streams_.push_back(stream_);  // synchronize() still waits for what it holds
    }
    stream_ = stream;
    if (staged_) staged_->stager().set_caller_stream(stream);
  }
  cudaStream_t stream() const { return stream_; }

  // Staged calls have finished when they return; NCCL's are waited for here, on every stream
  // they went to.
  void synchronize() {
    if (!nccl_) return;
    flush_messages();
    for (cudaStream_t earlier : earlier_streams_) nccl_->synchronize(earlier);
    earlier_streams_.clear();
    nccl_->synchronize(stream_);
  }

  void set_staging_options(const StagingOptions& options) {
    if (staged_) staged_->set_options(options);
  }

  template <detail::CollectiveElement T>
  void allreduce(std::span<const T> input, std::span<T> output, ReduceOp op, Algorithm algorithm) {
    if (!nccl_) return staging().allreduce(input, output, op, algorithm);
    refuse_in_deterministic_mode(Collective::kAllreduce);
    const Algorithm chosen =
        algorithm == Algorithm::kAutomatic
            ? comm_->choose(Collective::kAllreduce, input.size_bytes(), Memory::kDevice)
            : algorithm;
    nccl_call().allreduce(input.data(), output.data(), input.size(), data_type_v<T>, stream_, op,
                          chosen);
  }

  template <detail::CollectiveElement T>
  void broadcast(std::span<T> data, int root, Algorithm algorithm) {
    if (!nccl_) return staging().broadcast(data, root, algorithm);
    require_native(Collective::kBroadcast, algorithm);
    nccl_call().broadcast(data.data(), data.data(), data.size(), data_type_v<T>, root, stream_);
  }

  template <detail::CollectiveElement T>
  void allgather(std::span<const T> input, std::span<T> output, Algorithm algorithm) {
    if (!nccl_) return staging().allgather(input, output, algorithm);
    require_native(Collective::kAllgather, algorithm);
    nccl_call().allgather(input.data(), output.data(), input.size(), data_type_v<T>, stream_);
  }

  template <detail::CollectiveElement T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op,
                      Algorithm algorithm) {
    if (!nccl_) return staging().reduce_scatter(input, output, op, algorithm);
    refuse_in_deterministic_mode(Collective::kReduceScatter);
    require_native(Collective::kReduceScatter, algorithm);
    nccl_call().reduce_scatter(input.data(), output.data(), output.size(), data_type_v<T>, stream_,
                               op);
  }

  template <detail::CollectiveElement T>
  void reduce(std::span<const T> input, std::span<T> output, int root, ReduceOp op,
              Algorithm algorithm) {
    if (!nccl_) return staging().reduce(input, output, root, op, algorithm);
    refuse_in_deterministic_mode(Collective::kReduce);
    require_native(Collective::kReduce, algorithm);
    nccl_call().reduce(input.data(), output.data(), input.size(), data_type_v<T>, root, stream_,
                       op);
  }

  template <detail::CollectiveElement T>
  void alltoall(std::span<const T> input, std::span<T> output, Algorithm algorithm) {
    if (!nccl_) return staging().alltoall(input, output, algorithm);
    require_native(Collective::kAlltoall, algorithm);
    const std::size_t ranks = checks().group_size();
    const std::size_t count = input.size() / ranks;
    const std::vector<std::size_t> bytes(ranks, count * sizeof(T));
    std::vector<std::size_t> offsets(ranks);
    for (std::size_t j = 0; j < offsets.size(); ++j) offsets[j] = j * count * sizeof(T);
    exchange(Collective::kAlltoall, input.size(), data_type_v<T>,
             pairwise_transfers(input.data(), bytes, offsets, output.data(), bytes, offsets));
  }

  // In place: staged, the input slot holds the copy; on NCCL, a copy on the device, made and freed
  // on stream().
  template <detail::CollectiveElement T>
  void alltoall(std::span<T> data, Algorithm algorithm) {
    if (!nccl_) return staging().alltoall(data, algorithm);
    if (data.empty()) return alltoall(std::span<const T>(), data, algorithm);
    void* copy = nullptr;
    COLTRAIN_CHECK_CUDA(cudaMallocAsync(&copy, data.size_bytes(), stream_));
    try {
      COLTRAIN_CHECK_CUDA(
          cudaMemcpyAsync(copy, data.data(), data.size_bytes(), cudaMemcpyDeviceToDevice, stream_));
      alltoall(std::span<const T>(static_cast<const T*>(copy), data.size()), data, algorithm);
    } catch (...) {
      cudaFreeAsync(copy, stream_);
      throw;
    }
    COLTRAIN_CHECK_CUDA(cudaFreeAsync(copy, stream_));
  }

  template <detail::CollectiveElement T>
  void gather(std::span<const T> input, std::span<T> output, int root, Algorithm algorithm) {
    if (!nccl_) return staging().gather(input, output, root, algorithm);
    require_native(Collective::kGather, algorithm);
    T* received = comm_->rank() == root ? output.data() : nullptr;
    exchange(Collective::kGather, input.size(), data_type_v<T>,
             gather_transfers(comm_->rank(), comm_->size(), root, input.data(), received,
                              input.size_bytes()));
  }

  template <detail::CollectiveElement T>
  void scatter(std::span<const T> input, std::span<T> output, int root, Algorithm algorithm) {
    if (!nccl_) return staging().scatter(input, output, root, algorithm);
    require_native(Collective::kScatter, algorithm);
    const T* sent = comm_->rank() == root ? input.data() : nullptr;
    exchange(Collective::kScatter, output.size(), data_type_v<T>,
             scatter_transfers(comm_->rank(), comm_->size(), root, sent, output.data(),
                               output.size_bytes()));
  }

  // `bytes` and `offsets`: each rank's block in output, as the communicator computed them from
  // counts.
  template <detail::CollectiveElement T>
  void allgatherv(std::span<const T> input, std::span<T> output,
                  std::span<const std::size_t> counts, std::span<const std::size_t> bytes,
                  std::span<const std::size_t> offsets, Algorithm algorithm) {
    if (!nccl_) return staging().allgatherv(input, output, counts, algorithm);
    require_native(Collective::kAllgatherv, algorithm);
    exchange(Collective::kAllgatherv, output.size(), data_type_v<T>,
             allgatherv_transfers(input.data(), input.size_bytes(), output.data(), bytes, offsets));
  }

  // The blocks in bytes (sent_bytes, sent_offsets...) as the communicator checked them, beside the
  // caller's counts and displacements, which staging takes.
  template <detail::CollectiveElement T>
  void alltoallv(std::span<const T> input, std::span<const std::size_t> send_counts,
                 std::span<const std::size_t> send_displacements, std::span<T> output,
                 std::span<const std::size_t> recv_counts,
                 std::span<const std::size_t> recv_displacements,
                 std::span<const std::size_t> sent_bytes, std::span<const std::size_t> sent_offsets,
                 std::span<const std::size_t> received_bytes,
                 std::span<const std::size_t> received_offsets, Algorithm algorithm) {
    if (!nccl_) {
      return staging().alltoallv(input, send_counts, send_displacements, output, recv_counts,
                                 recv_displacements, algorithm);
    }
    require_native(Collective::kAlltoallv, algorithm);
    exchange(Collective::kAlltoallv, input.size(), data_type_v<T>,
             pairwise_transfers(input.data(), sent_bytes, sent_offsets, output.data(),
                                received_bytes, received_offsets));
  }

  // A staged call queued on `progress`: it starts after the work stream() held when it was issued
  // (an event recorded now), not after what the stream holds when the progress thread reaches it,
  // so work the caller enqueues meanwhile neither delays it nor races it. The stager is made here,
  // on the caller's device.
  template <class F>
  Request issue_staged(detail::ProgressThread& progress, F&& call) {
    Staging& staged = staging();
    const auto issued = std::make_shared<detail::IssuedEvent>(stream_);
    return progress.submit([&staged, issued, call = std::forward<F>(call)]() mutable {
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

  // A message of device memory on NCCL, added to the group that waits for the next device call or
  // for a wait on one of its requests; returns what flushes the group (for the request to call).
  std::function<bool(bool)> queue_nccl_message(bool sending, int peer, int tag,
                                               std::span<const std::byte> outgoing,
                                               std::span<std::byte> incoming,
                                               const ErrorContext& context) {
    if (tag != 0) {
      throw InvalidArgument(std::string(sending ? "send" : "recv") + ": tag " +
                                std::to_string(tag) +
                                " on NCCL device buffers; NCCL has no tags and matches a pair of "
                                "ranks' messages in the order they are posted: use tag 0",
                            context);
    }
    if (!messages_) messages_ = std::make_shared<MessageGroup>();
    MessageGroup& group = *messages_;
    if (group.stream != stream_) group.flush();
    group.nccl = nccl_.get();
    group.stream = stream_;
    if (sending) {
      group.transfers.sends.push_back({peer, outgoing.data(), outgoing.size()});
    } else {
      group.transfers.receives.push_back({peer, incoming.data(), incoming.size()});
    }
    group.bytes += sending ? outgoing.size() : incoming.size();
    return [group = messages_](bool) {
      group->flush();
      return true;
    };
  }

  // A staged message travels through host memory of its own: a send's is filled now, a receive's
  // copied into device memory once the message is in. Points outgoing or incoming at that memory
  // and returns what runs on arrival.
  std::function<void()> bounce_message(bool sending, std::span<const std::byte>& outgoing,
                                       std::span<std::byte>& incoming) const {
    auto bounce =
        std::make_shared<std::vector<std::byte>>(sending ? outgoing.size() : incoming.size());
    if (sending) {
      detail::copy_after_stream(bounce->data(), outgoing.data(), outgoing.size(), stream_);
      outgoing = *bounce;
      return [bounce] {};  // keeps the copy until the message is out
    }
    const auto target = incoming.data();
    incoming = *bounce;
    return [bounce, target, stream = stream_] {
      detail::copy_after_stream(target, bounce->data(), bounce->size(), stream);
    };
  }

 private:
  // Device messages on NCCL wait in one group, which goes to NCCL as one ncclGroupStart ...
  // ncclGroupEnd when one of its requests is waited for or tested, and before any other device
  // call: two ranks that each isend and then irecv do not deadlock, as two separate NCCL calls
  // would.
  struct MessageGroup {
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

  void flush_messages() {
    if (messages_) messages_->flush();
  }

  // NCCL, after the messages queued before this call.
  DeviceCollectives& nccl_call() {
    flush_messages();
    return *nccl_;
  }

  void exchange(Collective collective, std::size_t count, DataType dtype,
                const PeerTransfers& transfers) {
    nccl_call().exchange(collective, count, dtype, transfers.sends, transfers.receives, stream_);
  }

  // The stager, made at the first staged call on the device current then.
  Staging& staging() {
    if (!staged_) {
      staged_ = std::make_unique<Staging>(*comm_, comm_->staging_options(), stream_);
    }
    return *staged_;
  }

  // NCCL runs only its own collectives, except allreduce (which has ring and tree too).
  // NCCL's reductions, and coltrain's ring and tree over NCCL, add in orders of their own.
  void refuse_in_deterministic_mode(Collective collective) const {
    if (!comm_->deterministic()) return;
    throw InvalidArgument(std::string(name_of(collective)) +
                              " on NCCL device buffers has no fixed-order reduction, which "
                              "deterministic mode (COLTRAIN_DETERMINISTIC=1) needs: stage the "
                              "device buffers through a host backend (a communicator without NCCL)",
                          checks().context(collective));
  }

  void require_native(Collective collective, Algorithm algorithm) const {
    if (algorithm == Algorithm::kAutomatic || algorithm == Algorithm::kNative) return;
    throw InvalidArgument(std::string(name_of(collective)) + " on NCCL device buffers has no " +
                              "algorithm '" + std::string(name_of(algorithm)) +
                              "' (it has: native, automatic)",
                          checks().context(collective));
  }

  detail::CallChecks checks() const { return {comm_->rank(), comm_->size()}; }

  Comm* comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Staging> staged_;
  std::vector<cudaStream_t> earlier_streams_;  // NCCL calls went there before set_stream
  std::shared_ptr<MessageGroup> messages_;     // NCCL isend/irecv not yet given to NCCL
  std::unique_ptr<DeviceCollectives> nccl_;    // declared last: goes first
};

}  // namespace coltrain::comm
