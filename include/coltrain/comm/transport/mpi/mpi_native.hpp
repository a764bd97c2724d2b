#pragma once
// The `native` algorithm of the MPI backend: MPI's own collectives (MPI_Allreduce...) on the
// transport's private communicator. MPI has no standard fp16/bf16 type, so the communicator widens
// those to f32 before it calls these, like every other algorithm. kAvg is MPI_SUM followed by the
// division. Native collectives carry no coltrain header: mismatched calls behave as MPI defines.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_MPI
#error "coltrain/comm/transport/mpi/mpi_native.hpp needs MPI: compile with mpicxx or link MPI"
#endif

#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/transport/mpi/mpi_transport.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace coltrain::comm {
namespace detail {

// The types an ElementReduction reduces.
inline MPI_Datatype mpi_datatype(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    default:
      throw InvalidArgument("MPI's native collectives do not reduce " +
                            std::string(name_of(dtype)));
  }
}

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kProd:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
  }
  throw InvalidArgument("unknown reduction op " + std::to_string(static_cast<int>(op)));
}

inline int mpi_count(std::size_t count) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw InvalidArgument("count " + std::to_string(count) +
                          " exceeds what MPI's native collectives take (INT_MAX); use another "
                          "algorithm");
  }
  return static_cast<int>(count);
}

// mpi_count of each.
inline std::vector<int> mpi_counts(std::span<const std::size_t> counts) {
  std::vector<int> result;
  result.reserve(counts.size());
  for (std::size_t count : counts) result.push_back(mpi_count(count));
  return result;
}

// MPI_IN_PLACE where the caller reduces in place.
inline const void* mpi_send_buffer(const void* input, const void* output) {
  return input == output ? MPI_IN_PLACE : input;
}

}  // namespace detail

inline void native_allreduce(MpiTransport& transport, const std::byte* input, std::byte* output,
                             std::size_t count, const ElementReduction& reduction) {
  COLTRAIN_CHECK_MPI(MPI_Allreduce(detail::mpi_send_buffer(input, output), output,
                                   detail::mpi_count(count), detail::mpi_datatype(reduction.dtype),
                                   detail::mpi_op(reduction.op), transport.comm()));
  reduction.finish(output, count * reduction.element_bytes(), transport.size());
}

inline void native_broadcast(MpiTransport& transport, std::byte* data, std::size_t bytes,
                             int root) {
  COLTRAIN_CHECK_MPI(MPI_Bcast(data, detail::mpi_count(bytes), MPI_BYTE, root, transport.comm()));
}

// `bytes` from every rank.
inline void native_allgather(MpiTransport& transport, const std::byte* input, std::byte* output,
                             std::size_t bytes) {
  const std::size_t mine = bytes * static_cast<std::size_t>(transport.rank());
  const void* send = input == output + mine ? MPI_IN_PLACE : static_cast<const void*>(input);
  COLTRAIN_CHECK_MPI(MPI_Allgather(send, detail::mpi_count(bytes), MPI_BYTE, output,
                                   detail::mpi_count(bytes), MPI_BYTE, transport.comm()));
}

// In place when output is this rank's block of input. MPI's in-place form leaves the result at the
// start of the buffer, so it is moved to this rank's block afterwards.
inline void native_reduce_scatter(MpiTransport& transport, const std::byte* input,
                                  std::byte* output, std::size_t count,
                                  const ElementReduction& reduction) {
  const std::size_t block_bytes = count * reduction.element_bytes();
  const std::size_t mine = block_bytes * static_cast<std::size_t>(transport.rank());
  if (output == input + mine) {
    std::byte* buffer = output - mine;  // the caller's writable buffer, which input views
    COLTRAIN_CHECK_MPI(MPI_Reduce_scatter_block(MPI_IN_PLACE, buffer, detail::mpi_count(count),
                                                detail::mpi_datatype(reduction.dtype),
                                                detail::mpi_op(reduction.op), transport.comm()));
    if (mine != 0 && count != 0) std::memmove(output, buffer, block_bytes);
  } else {
    COLTRAIN_CHECK_MPI(MPI_Reduce_scatter_block(input, output, detail::mpi_count(count),
                                                detail::mpi_datatype(reduction.dtype),
                                                detail::mpi_op(reduction.op), transport.comm()));
  }
  reduction.finish(output, block_bytes, transport.size());
}

inline void native_reduce(MpiTransport& transport, const std::byte* input, std::byte* output,
                          std::size_t count, int root, const ElementReduction& reduction) {
  const bool is_root = transport.rank() == root;
  // In place, the root reduces from a copy rather than with MPI_IN_PLACE: MPICH 4.0.2's
  // shared-memory MPI_Reduce crashes on MPI_IN_PLACE once the root has changed between calls.
  std::vector<std::byte> copy;
  if (is_root && input == output) {
    copy.assign(input, input + count * reduction.element_bytes());
    input = copy.data();
  }
  // Elsewhere the receive buffer is not MPI's to touch (an in-place caller's output is its input).
  COLTRAIN_CHECK_MPI(MPI_Reduce(input, is_root ? output : nullptr, detail::mpi_count(count),
                                detail::mpi_datatype(reduction.dtype), detail::mpi_op(reduction.op),
                                root, transport.comm()));
  if (is_root) reduction.finish(output, count * reduction.element_bytes(), transport.size());
}

inline void native_barrier(MpiTransport& transport) {
  COLTRAIN_CHECK_MPI(MPI_Barrier(transport.comm()));
}

// `block_bytes` from every rank to every rank; input and output are distinct.
inline void native_alltoall(MpiTransport& transport, const std::byte* input, std::byte* output,
                            std::size_t block_bytes) {
  const int count = detail::mpi_count(block_bytes);
  COLTRAIN_CHECK_MPI(
      MPI_Alltoall(input, count, MPI_BYTE, output, count, MPI_BYTE, transport.comm()));
}

// Blocks of any size: rank i's `block_bytes[i]` at output + offsets[i] on every rank.
inline void native_allgatherv(MpiTransport& transport, const std::byte* input, std::byte* output,
                              std::span<const std::size_t> block_bytes,
                              std::span<const std::size_t> offsets) {
  const std::vector<int> counts = detail::mpi_counts(block_bytes);
  const std::vector<int> displacements = detail::mpi_counts(offsets);
  const int mine = counts[static_cast<std::size_t>(transport.rank())];
  COLTRAIN_CHECK_MPI(MPI_Allgatherv(input, mine, MPI_BYTE, output, counts.data(),
                                    displacements.data(), MPI_BYTE, transport.comm()));
}

// Blocks of any size, anywhere in the buffers (MPI_Alltoallv in bytes).
inline void native_alltoallv(MpiTransport& transport, const std::byte* input,
                             std::span<const std::size_t> send_bytes,
                             std::span<const std::size_t> send_offsets, std::byte* output,
                             std::span<const std::size_t> recv_bytes,
                             std::span<const std::size_t> recv_offsets) {
  const std::vector<int> send_counts = detail::mpi_counts(send_bytes);
  const std::vector<int> send_displacements = detail::mpi_counts(send_offsets);
  const std::vector<int> recv_counts = detail::mpi_counts(recv_bytes);
  const std::vector<int> recv_displacements = detail::mpi_counts(recv_offsets);
  COLTRAIN_CHECK_MPI(MPI_Alltoallv(input, send_counts.data(), send_displacements.data(), MPI_BYTE,
                                   output, recv_counts.data(), recv_displacements.data(), MPI_BYTE,
                                   transport.comm()));
}

// The root's output holds every rank's `block_bytes`; other ranks' output is not touched.
inline void native_gather(MpiTransport& transport, const std::byte* input, std::byte* output,
                          std::size_t block_bytes, int root) {
  const int count = detail::mpi_count(block_bytes);
  const bool is_root = transport.rank() == root;
  COLTRAIN_CHECK_MPI(MPI_Gather(input, count, MPI_BYTE, is_root ? output : nullptr, count, MPI_BYTE,
                                root, transport.comm()));
}

// The root's input holds every rank's `block_bytes`; other ranks' input is not read.
inline void native_scatter(MpiTransport& transport, const std::byte* input, std::byte* output,
                           std::size_t block_bytes, int root) {
  const int count = detail::mpi_count(block_bytes);
  const bool is_root = transport.rank() == root;
  COLTRAIN_CHECK_MPI(MPI_Scatter(is_root ? input : nullptr, count, MPI_BYTE, output, count,
                                 MPI_BYTE, root, transport.comm()));
}

}  // namespace coltrain::comm
