#pragma once
// The GPU side of allreduce_bench, in builds with CUDA: pinned and device memory for --mem, and,
// with NCCL too, the `nccl` backend (NCCL's own collectives on device buffers). NCCL runs one rank
// per GPU: rank i of a node uses device i, so a machine with one GPU runs the nccl backend with one
// rank. The unique id that joins the ranks travels over MPI.

#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <cuda_runtime.h>
#include <mpi.h>
#if COLTRAIN_WITH_NCCL
#include <coltrain/comm/device/nccl/nccl_backend.hpp>

#include <nccl.h>
#endif

#include <cstddef>
#include <optional>
#include <string>
#include <utility>

namespace coltrain::bench {

// Why no CUDA device can be used by `local_ranks` ranks on this node, or nothing.
inline std::optional<std::string> cuda_unavailable(int local_ranks) {
  int devices = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&devices); status != cudaSuccess) {
    return std::string("no usable CUDA device (") + cudaGetErrorName(status) + ": " +
           cudaGetErrorString(status) + ")";
  }
  if (devices < local_ranks) {
    return std::to_string(local_ranks) + " ranks on this node but " + std::to_string(devices) +
           " GPU(s); one rank per GPU (launch with -n " + std::to_string(devices) + ")";
  }
  return std::nullopt;
}

// Page-locked host memory (cudaMallocHost) or device memory (cudaMalloc), freed on destruction.
class CudaMemory {
 public:
  static CudaMemory pinned(std::size_t bytes) {
    void* data = nullptr;
    COLTRAIN_CHECK_CUDA(cudaMallocHost(&data, bytes));
    return CudaMemory(data, true);
  }
  static CudaMemory device(std::size_t bytes) {
    void* data = nullptr;
    COLTRAIN_CHECK_CUDA(cudaMalloc(&data, bytes));
    return CudaMemory(data, false);
  }

  CudaMemory(CudaMemory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), pinned_(other.pinned_) {}
  CudaMemory& operator=(CudaMemory&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(pinned_, other.pinned_);
    return *this;
  }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  ~CudaMemory() {
    if (data_ == nullptr) return;
    if (pinned_) {
      cudaFreeHost(data_);
    } else {
      cudaFree(data_);
    }
  }

  void* get() const { return data_; }

  // Blocking copies, ordered after the work of every blocking stream (the legacy default stream).
  void copy_from_host(const void* source, std::size_t bytes) {
    COLTRAIN_CHECK_CUDA(cudaMemcpy(data_, source, bytes, cudaMemcpyHostToDevice));
  }
  void copy_to_host(void* destination, std::size_t bytes) const {
    COLTRAIN_CHECK_CUDA(cudaMemcpy(destination, data_, bytes, cudaMemcpyDeviceToHost));
  }

 private:
  CudaMemory(void* data, bool pinned) : data_(data), pinned_(pinned) {}

  void* data_;
  bool pinned_;
};

#if COLTRAIN_WITH_NCCL

// An NCCL communicator over the ranks of an MPI communicator, one GPU each, with its own stream.
class NcclCommunicator {
 public:
  NcclCommunicator(MPI_Comm comm, int device) {
    int rank = 0;
    int size = 0;
    COLTRAIN_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    COLTRAIN_CHECK_MPI(MPI_Comm_size(comm, &size));
    ncclUniqueId id{};
    if (rank == 0) COLTRAIN_CHECK_NCCL(ncclGetUniqueId(&id));
    COLTRAIN_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
    COLTRAIN_CHECK_CUDA(cudaSetDevice(device));
    COLTRAIN_CHECK_CUDA(cudaStreamCreate(&stream_));
    COLTRAIN_CHECK_NCCL(ncclCommInitRank(&comm_, size, id, rank));
    size_ = size;
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Enqueues one collective on the stream. `count` is the full array in elements; allgather and
  // reduce_scatter move `block` elements per rank.
  void launch(comm::Collective collective, const void* input, void* output, std::size_t count,
              std::size_t block, DataType dtype, comm::ReduceOp op, int root) {
    const ncclDataType_t type = comm::detail::nccl_data_type(dtype);
    switch (collective) {
      case comm::Collective::kAllreduce:
        COLTRAIN_CHECK_NCCL(ncclAllReduce(input, output, count, type,
                                          comm::detail::nccl_reduce_op(op), comm_, stream_));
        return;
      case comm::Collective::kBroadcast:
        COLTRAIN_CHECK_NCCL(ncclBroadcast(input, output, count, type, root, comm_, stream_));
        return;
      case comm::Collective::kAllgather:
        COLTRAIN_CHECK_NCCL(ncclAllGather(input, output, block, type, comm_, stream_));
        return;
      case comm::Collective::kReduceScatter:
        COLTRAIN_CHECK_NCCL(ncclReduceScatter(input, output, block, type,
                                              comm::detail::nccl_reduce_op(op), comm_, stream_));
        return;
      case comm::Collective::kReduce:
        COLTRAIN_CHECK_NCCL(ncclReduce(input, output, count, type, comm::detail::nccl_reduce_op(op),
                                       root, comm_, stream_));
        return;
      case comm::Collective::kAlltoall: {
        // NCCL's own pattern for alltoall: one send and one receive per peer in a group.
        const std::size_t bytes = block * size_of(dtype);
        COLTRAIN_CHECK_NCCL(ncclGroupStart());
        for (int peer = 0; peer < size_; ++peer) {
          const auto offset = static_cast<std::size_t>(peer) * bytes;
          COLTRAIN_CHECK_NCCL(ncclSend(static_cast<const std::byte*>(input) + offset, block, type,
                                       peer, comm_, stream_));
          COLTRAIN_CHECK_NCCL(ncclRecv(static_cast<std::byte*>(output) + offset, block, type, peer,
                                       comm_, stream_));
        }
        COLTRAIN_CHECK_NCCL(ncclGroupEnd());
        return;
      }
      default:
        break;
    }
    throw InvalidArgument("the nccl backend has no " + std::string(comm::name_of(collective)));
  }

  // Waits for everything launched so far.
  void synchronize() { COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream_)); }

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int size_ = 1;
};

#endif  // COLTRAIN_WITH_NCCL

}  // namespace coltrain::bench
