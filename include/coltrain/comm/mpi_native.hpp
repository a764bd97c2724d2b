#pragma once
// The `native` algorithm of the MPI backend: MPI's own collectives (MPI_Allreduce...) on the
// transport's private communicator. MPI has no standard fp16/bf16 type, so the communicator widens
// those to f32 before it calls these, like every other algorithm. kAvg is MPI_SUM followed by the
// division. Native collectives carry no coltrain header: mismatched calls behave as MPI defines.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_MPI
#error "coltrain/comm/mpi_native.hpp needs MPI: compile with mpicxx or link MPI::MPI_CXX"
#endif

#include <coltrain/comm/mpi_transport.hpp>
#include <coltrain/comm/reduce_kernels.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/error.hpp>

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace coltrain::comm {
namespace detail {

template <class T>
MPI_Datatype mpi_datatype() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
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

// MPI_IN_PLACE where the caller reduces in place.
inline const void* mpi_send_buffer(const void* input, const void* output) {
  return input == output ? MPI_IN_PLACE : input;
}

}  // namespace detail

template <ReducibleElement T>
void native_allreduce(MpiTransport& transport, const T* input, T* output, std::size_t count,
                      ReduceOp op) {
  COLTRAIN_CHECK_MPI(MPI_Allreduce(detail::mpi_send_buffer(input, output), output,
                                   detail::mpi_count(count), detail::mpi_datatype<T>(),
                                   detail::mpi_op(op), transport.comm()));
  if (op == ReduceOp::kAvg) divide_by_ranks(output, count, transport.size());
}

template <class T>
void native_broadcast(MpiTransport& transport, T* data, std::size_t count, int root) {
  COLTRAIN_CHECK_MPI(
      MPI_Bcast(data, detail::mpi_count(count * sizeof(T)), MPI_BYTE, root, transport.comm()));
}

template <class T>
void native_allgather(MpiTransport& transport, const T* input, T* output, std::size_t count) {
  const std::size_t mine = count * static_cast<std::size_t>(transport.rank());
  const void* send = input == output + mine ? MPI_IN_PLACE : static_cast<const void*>(input);
  COLTRAIN_CHECK_MPI(MPI_Allgather(send, detail::mpi_count(count * sizeof(T)), MPI_BYTE, output,
                                   detail::mpi_count(count * sizeof(T)), MPI_BYTE,
                                   transport.comm()));
}

// In place when output is this rank's block of input. MPI's in-place form leaves the result at the
// start of the buffer, so it is moved to this rank's block afterwards.
template <ReducibleElement T>
void native_reduce_scatter(MpiTransport& transport, const T* input, T* output, std::size_t count,
                           ReduceOp op) {
  const std::size_t mine = count * static_cast<std::size_t>(transport.rank());
  if (output == input + mine) {
    T* buffer = output - mine;  // the caller's writable buffer, which input views
    COLTRAIN_CHECK_MPI(MPI_Reduce_scatter_block(MPI_IN_PLACE, buffer, detail::mpi_count(count),
                                                detail::mpi_datatype<T>(), detail::mpi_op(op),
                                                transport.comm()));
    if (mine != 0 && count != 0) std::memmove(output, buffer, count * sizeof(T));
  } else {
    COLTRAIN_CHECK_MPI(MPI_Reduce_scatter_block(input, output, detail::mpi_count(count),
                                                detail::mpi_datatype<T>(), detail::mpi_op(op),
                                                transport.comm()));
  }
  if (op == ReduceOp::kAvg) divide_by_ranks(output, count, transport.size());
}

template <ReducibleElement T>
void native_reduce(MpiTransport& transport, const T* input, T* output, std::size_t count, int root,
                   ReduceOp op) {
  const bool is_root = transport.rank() == root;
  // In place, the root reduces from a copy rather than with MPI_IN_PLACE: MPICH 4.0.2's
  // shared-memory MPI_Reduce crashes on MPI_IN_PLACE once the root has changed between calls.
  std::vector<T> copy;
  if (is_root && input == output) {
    copy.assign(input, input + count);
    input = copy.data();
  }
  // Elsewhere the receive buffer is not MPI's to touch (an in-place caller's output is its input).
  COLTRAIN_CHECK_MPI(MPI_Reduce(input, is_root ? output : nullptr, detail::mpi_count(count),
                                detail::mpi_datatype<T>(), detail::mpi_op(op), root,
                                transport.comm()));
  if (is_root && op == ReduceOp::kAvg) divide_by_ranks(output, count, transport.size());
}

inline void native_barrier(MpiTransport& transport) {
  COLTRAIN_CHECK_MPI(MPI_Barrier(transport.comm()));
}

}  // namespace coltrain::comm
