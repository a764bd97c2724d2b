#pragma once
// The device side of an NCCL communicator as Communicator sees it. nccl.h stays out of the files
// that include the communicator: its cuda_fp16.h declares a global `half`, which clashes with
// coltrain::half wherever code says `using namespace coltrain`. So Communicator holds an NCCL
// backend through this interface, and makes one with the factory that
// <coltrain/comm/device/nccl/nccl_backend.hpp> registers when a translation unit includes it
// (communicator.hpp includes it where nvcc compiles it).

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/comm/device/device_collectives.hpp needs CUDA: build with COLTRAIN_WITH_CUDA=1"
#endif

#include <coltrain/comm/algorithms/peer_transfers.hpp>
#include <coltrain/comm/device/nccl/device_reduction.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

namespace coltrain::comm {

// Collectives on device pointers, enqueued on `stream` (NcclBackend has the rules).
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;

  virtual int device() const = 0;
  // The kernel of coltrain's own ring and tree; null when the program has none.
  virtual DeviceReduction device_reduction() const = 0;
  virtual void allreduce(const void* input, void* output, std::size_t count, DataType dtype,
                         cudaStream_t stream, ReduceOp op, Algorithm algorithm) = 0;
  virtual void broadcast(const void* input, void* output, std::size_t count, DataType dtype,
                         int root, cudaStream_t stream) = 0;
  virtual void allgather(const void* input, void* output, std::size_t count, DataType dtype,
                         cudaStream_t stream) = 0;
  virtual void reduce_scatter(const void* input, void* output, std::size_t count, DataType dtype,
                              cudaStream_t stream, ReduceOp op) = 0;
  virtual void reduce(const void* input, void* output, std::size_t count, DataType dtype, int root,
                      cudaStream_t stream, ReduceOp op) = 0;
  // The sends and receives as one group on `stream` (alltoall(v), gather, scatter, allgatherv,
  // send and recv are such groups); `collective`, `count` and `dtype` name the call in errors.
  virtual void exchange(Collective collective, std::size_t count, DataType dtype,
                        std::span<const PeerSend> sends, std::span<const PeerReceive> receives,
                        cudaStream_t stream) = 0;
  // Returns once `stream`'s work is done; throws TimeoutError or BackendError at the deadline or on
  // an error.
  virtual void synchronize(cudaStream_t stream) = 0;
  // The ranks that pass the same color, ordered by key (ncclCommSplit); null for a negative color.
  // Collective over this communicator's ranks.
  virtual std::unique_ptr<DeviceCollectives> split(int color, int key) = 0;
};

// Carries rank 0's words to every rank (the bootstrap's broadcast).
using BroadcastWords = std::function<void(std::span<std::int64_t>)>;
// Rank `rank` of `size` on the current CUDA device.
using NcclFactory = std::unique_ptr<DeviceCollectives> (*)(int rank, int size,
                                                           const BroadcastWords& broadcast,
                                                           const CommOptions& options);

// Null until a translation unit that includes <coltrain/comm/device/nccl/nccl_backend.hpp> is
// initialised.
inline NcclFactory& registered_nccl_factory() {
  static NcclFactory factory = nullptr;
  return factory;
}

}  // namespace coltrain::comm
