#pragma once
// Shared pieces of the collective tests, which run under mpiexec: communicators for both backends
// (the TCP one through comm/rendezvous/tcp_over_mpi.hpp, so no other test can take its port),
// inputs that are exact by construction, and their references.

#include <coltrain/comm.hpp>
#include <coltrain/comm/rendezvous/tcp_over_mpi.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/env.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace coltrain::testing {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// A new communicator on `backend` over all of MPI_COMM_WORLD's ranks.
inline comm::Communicator make_communicator(comm::Backend backend, comm::CommOptions options = {}) {
  if (backend == comm::Backend::kMpi) return comm::Communicator::mpi(MPI_COMM_WORLD, options);
  return comm::tcp_over_mpi(MPI_COMM_WORLD, options);
}

// One communicator per backend for the whole test program; error tests make their own.
inline comm::Communicator& shared_communicator(comm::Backend backend) {
  static comm::Communicator mpi = make_communicator(comm::Backend::kMpi);
  static comm::Communicator tcp = make_communicator(comm::Backend::kTcp);
  return backend == comm::Backend::kMpi ? mpi : tcp;
}

// Rank r's value at index i: 1, 2 or 3, so sums over five ranks, products (at most 3^5 = 243) and
// minima are exact in every element type, bf16 included, and in any order of reduction.
inline int input_value(int rank, std::size_t i) { return 1 + static_cast<int>((rank + i) % 3); }

template <class T>
T to_element(double value) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return T(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

template <class T>
std::vector<T> inputs(int rank, std::size_t count, std::size_t offset = 0) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = to_element<T>(input_value(rank, offset + i));
  return values;
}

// The exact reduction over `ranks` ranks at index i, rounded as coltrain defines it: integers
// and f32/f64 in their own type; f16/bf16 reduced in f32 and rounded once.
template <class T>
T reference(comm::ReduceOp op, int ranks, std::size_t i) {
  double result = input_value(0, i);
  for (int r = 1; r < ranks; ++r) {
    const double v = input_value(r, i);
    switch (op) {
      case comm::ReduceOp::kSum:
      case comm::ReduceOp::kAvg:
        result += v;
        break;
      case comm::ReduceOp::kProd:
        result *= v;
        break;
      case comm::ReduceOp::kMin:
        result = std::min(result, v);
        break;
      case comm::ReduceOp::kMax:
        result = std::max(result, v);
        break;
    }
  }
  if (op != comm::ReduceOp::kAvg) return to_element<T>(result);
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<T>(result) / static_cast<T>(ranks));
  } else if constexpr (std::is_same_v<T, double>) {
    return result / ranks;
  } else {
    return to_element<T>(static_cast<float>(result) / static_cast<float>(ranks));
  }
}

template <class T>
bool same_bits(T a, T b) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return a.bits() == b.bits();
  } else {
    return a == b;
  }
}

}  // namespace coltrain::testing
