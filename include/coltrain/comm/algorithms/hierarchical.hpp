#pragma once
// Hierarchical allreduce, for jobs of several hosts with several ranks on each (as NCCL's and
// Horovod's): ranks on one host talk through shared memory, which is much faster than the network
// between hosts, so the data crosses the network once per host instead of once per rank.
//
// With H hosts of L ranks each (HostLayout::uniform), on n bytes:
//   1. reduce-scatter inside each host (ring): local rank i holds the host's sum of segment i of L;
//   2. allreduce of segment i across hosts (ring) among the ranks that are local rank i of their
//      host: L rings of H ranks run at once, each on n/L bytes, over their own connections;
//   3. allgather inside each host (ring).
// Each host sends 2(H-1)/H n bytes over the network in all (a flat ring over the p = HL ranks sends
// 2(p-1)/p n through each of the links between hosts), and 2(L-1)/L n through shared memory.
// When hosts hold different numbers of ranks, segments cannot pair up across hosts: each host
// reduces to its first rank (a pipelined chain), the first ranks allreduce across hosts (ring), and
// each broadcasts the result inside its host (chain).
//
// The phases run the ring algorithms on subgroups of the communicator (AnyTransport::subgroup, so
// that the rings are compiled once for every phase and transport), over its existing connections;
// a phase's messages between two ranks follow the previous phase's in the order both sides post
// them, so they need no tags.

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/algorithms/ring.hpp>
#include <coltrain/comm/host_layout.hpp>
#include <coltrain/comm/transport/any_transport.hpp>
#include <coltrain/comm/transport/transport.hpp>

#include <cstddef>
#include <vector>

namespace coltrain::comm {

namespace detail {

// The ranks that hold position `index` on their host, one per host, in host order.
inline std::vector<int> ranks_at_local_index(const HostLayout& hosts, int index) {
  std::vector<int> ranks;
  for (int host = 0; host < hosts.hosts(); ++host)
    ranks.push_back(hosts.ranks_on(host).at(static_cast<std::size_t>(index)));
  return ranks;
}

}  // namespace detail

template <Transport Tr>
void hierarchical_allreduce(Tr& transport, const HostLayout& hosts, const std::byte* input,
                            std::byte* output, std::size_t count, const ElementReduction& reduction,
                            const MessageHeader& call, const AlgorithmTuning& tuning,
                            AlgorithmScratch& scratch) {
  const int p = transport.size();
  const std::size_t element_bytes = reduction.element_bytes();
  // The phases sum; an average is divided once, by p, at the end.
  ElementReduction partial = reduction;
  if (partial.op == ReduceOp::kAvg) partial.op = ReduceOp::kSum;
  const std::vector<int>& on_my_host = hosts.ranks_on(hosts.host_of(transport.rank()));
  const AnyTransport whole = as_any_transport(transport);
  AnyTransport local = whole.subgroup(on_my_host);
  const int local_ranks = local.size();

  if (!hosts.uniform()) {
    ring_reduce(local, input, output, count, 0, partial, call, tuning, scratch);
    if (local.rank() == 0) {
      const std::vector<int> first_ranks = detail::ranks_at_local_index(hosts, 0);
      AnyTransport across = whole.subgroup(first_ranks);
      ring_allreduce(across, output, output, count, partial, call, tuning, scratch);
      reduction.finish(output, count * element_bytes, p);
    }
    ring_broadcast(local, output, count, element_bytes, 0, call, tuning);
    return;
  }

  if (local_ranks == 1) {
    // One rank a host: nothing to do inside the hosts, so the ring between them takes the whole
    // vector out of place, without copying it into the output first (a 64 MiB copy was 8% of the
    // allreduce on a 10 Gbit/s link).
    const std::vector<int> peers = detail::ranks_at_local_index(hosts, 0);
    AnyTransport across = whole.subgroup(peers);
    ring_allreduce(across, input, output, count, partial, call, tuning, scratch);
    reduction.finish(output, count * element_bytes, p);
    return;
  }
  const detail::RingLayout ring(local_ranks, local.rank(), count, element_bytes, tuning);
  ring_reduce_scatter_phase(local, input, output, count, partial, call, tuning, scratch.slots);
  const auto segment = static_cast<std::size_t>(local.rank());
  const detail::ByteRange mine =
      detail::to_bytes({ring.segments.begin(segment), ring.segments.size(segment)}, element_bytes);
  const std::vector<int> peers = detail::ranks_at_local_index(hosts, local.rank());
  AnyTransport across = whole.subgroup(peers);
  ring_allreduce(across, output + mine.begin, output + mine.begin, mine.size / element_bytes,
                 partial, call, tuning, scratch);
  reduction.finish(output + mine.begin, mine.size, p);
  ring_allgather_segments(local, ring, output, call);
}

}  // namespace coltrain::comm
