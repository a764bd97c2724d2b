#pragma once
// The `gloo` backend of allreduce_bench: Gloo's own allreduce_ring_chunked and
// allreduce_halving_doubling over Gloo's TCP transport, measured by the same harness as coltrain's
// algorithms so that the reference implementation stands next to ours.
//
// Ranks find each other over MPI, which launched them anyway: each rank creates one transport pair
// per peer, the pairs' addresses are exchanged with MPI_Allgather, and every pair connects. This
// needs no store, no shared folder and no MPI support in Gloo (Debian's libgloo is built without
// it). GLOO_SOCKET_IFNAME picks the network interface, as in PyTorch; otherwise Gloo uses the
// address the host name resolves to.

#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <gloo/algorithm.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/context.h>
#include <gloo/transport/address.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace coltrain::bench {

enum class GlooAllreduce { kRingChunked, kHalvingDoubling };

// Gloo's allreduce that stands for one of coltrain's algorithms, or nothing where Gloo has none.
inline std::optional<GlooAllreduce> gloo_allreduce_for(comm::Algorithm algorithm) {
  if (algorithm == comm::Algorithm::kRing) return GlooAllreduce::kRingChunked;
  if (algorithm == comm::Algorithm::kHalvingDoubling) return GlooAllreduce::kHalvingDoubling;
  return std::nullopt;
}

inline const char* name_of(GlooAllreduce algorithm) {
  return algorithm == GlooAllreduce::kRingChunked ? "allreduce_ring_chunked"
                                                  : "allreduce_halving_doubling";
}

// Why Gloo's allreduce cannot reduce this dtype with this op, or empty. Gloo's float16 is its own
// type and it has no average, so those are left to the other backends.
inline std::string gloo_unsupported(DataType dtype, comm::ReduceOp op) {
  if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) {
    return "the harness runs Gloo on f32, f64, i32 and i64 only";
  }
  if (op == comm::ReduceOp::kAvg) return "Gloo's allreduce has no average";
  return {};
}

// A gloo::Context whose pairs are connected through an MPI address exchange.
class GlooMpiContext : public gloo::Context {
 public:
  GlooMpiContext(MPI_Comm comm, std::chrono::milliseconds timeout)
      : gloo::Context(rank_in(comm), world_size_of(comm)) {
    setTimeout(timeout);
    gloo::transport::tcp::attr attr;
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
      attr.iface = ifname;
    }
    device_ = gloo::transport::tcp::CreateDevice(attr);
    transportContext_ = device_->createContext(rank, size);
    transportContext_->setTimeout(timeout);

    // Row `peer` of a rank's table holds the address of its pair with `peer`; addresses are
    // fixed-size records, their true lengths travel alongside.
    constexpr int kSlot = gloo::transport::Address::kMaxByteSize;
    std::vector<char> mine(static_cast<std::size_t>(size) * kSlot, 0);
    std::vector<int> my_lengths(static_cast<std::size_t>(size), 0);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const std::vector<char> address = transportContext_->createPair(peer)->address().bytes();
      std::copy(address.begin(), address.end(), mine.begin() + peer * kSlot);
      my_lengths[static_cast<std::size_t>(peer)] = static_cast<int>(address.size());
    }
    std::vector<char> all(mine.size() * static_cast<std::size_t>(size));
    std::vector<int> all_lengths(my_lengths.size() * static_cast<std::size_t>(size));
    COLTRAIN_CHECK_MPI(MPI_Allgather(mine.data(), size * kSlot, MPI_CHAR, all.data(), size * kSlot,
                                     MPI_CHAR, comm));
    COLTRAIN_CHECK_MPI(
        MPI_Allgather(my_lengths.data(), size, MPI_INT, all_lengths.data(), size, MPI_INT, comm));
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const std::size_t entry = static_cast<std::size_t>(peer) * size + rank;
      const auto first = all.begin() + static_cast<std::ptrdiff_t>(entry * kSlot);
      transportContext_->getPair(peer)->connect(
          std::vector<char>(first, first + all_lengths[entry]));
    }
  }

 private:
  static int rank_in(MPI_Comm comm) {
    int rank = 0;
    COLTRAIN_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    return rank;
  }
  static int world_size_of(MPI_Comm comm) {
    int size = 0;
    COLTRAIN_CHECK_MPI(MPI_Comm_size(comm, &size));
    return size;
  }
};

namespace detail {

template <class T>
const gloo::ReductionFunction<T>* gloo_reduction(comm::ReduceOp op) {
  switch (op) {
    case comm::ReduceOp::kSum:
      return gloo::ReductionFunction<T>::sum;
    case comm::ReduceOp::kProd:
      return gloo::ReductionFunction<T>::product;
    case comm::ReduceOp::kMin:
      return gloo::ReductionFunction<T>::min;
    case comm::ReduceOp::kMax:
      return gloo::ReductionFunction<T>::max;
    case comm::ReduceOp::kAvg:
      break;
  }
  throw InvalidArgument("Gloo's allreduce has no " + std::string(comm::name_of(op)));
}

}  // namespace detail

// Gloo's allreduce of `count` elements at `data`, in place, set up once (Gloo registers the buffer
// with every pair when the algorithm is built): each call of the result runs one allreduce.
template <class T>
std::function<void()> make_gloo_allreduce(const std::shared_ptr<gloo::Context>& context,
                                          GlooAllreduce algorithm, T* data, std::size_t count,
                                          comm::ReduceOp op) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw InvalidArgument("Gloo's allreduce takes at most INT_MAX elements, not " +
                          std::to_string(count));
  }
  const std::vector<T*> buffers{data};
  const int elements = static_cast<int>(count);
  std::shared_ptr<gloo::Algorithm> run;
  if (algorithm == GlooAllreduce::kRingChunked) {
    run = std::make_shared<gloo::AllreduceRingChunked<T>>(context, buffers, elements,
                                                          detail::gloo_reduction<T>(op));
  } else {
    run = std::make_shared<gloo::AllreduceHalvingDoubling<T>>(context, buffers, elements,
                                                              detail::gloo_reduction<T>(op));
  }
  return [run] { run->run(); };
}

// Gloo's alltoall of `count` elements per rank (p blocks) from `input` to `output`, set up once.
template <class T>
std::function<void()> make_gloo_alltoall(const std::shared_ptr<gloo::Context>& context, T* input,
                                         T* output, std::size_t count) {
  auto options = std::make_shared<gloo::AlltoallOptions>(context);
  options->setInput(input, count);
  options->setOutput(output, count);
  return [options] { gloo::alltoall(*options); };
}

}  // namespace coltrain::bench
