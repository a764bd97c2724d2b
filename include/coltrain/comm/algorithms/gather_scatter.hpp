#pragma once
// Gather and scatter along a binomial tree rooted at `root` (Algorithm::kTree). Ranks are numbered
// relative to the root (v = rank - root mod p); rank v's subtree is v .. v + min(lowbit(v), p - v)
// - 1, whose blocks are contiguous in relative order. Gather: each rank collects its subtree's
// blocks from its children (v + 1, v + 2, v + 4, ... below its lowest set bit) and sends them to
// its parent (v - lowbit(v)) in one message. Scatter runs the same tree the other way. lg p
// messages on the longest path, and (p-1)/p of the root's buffer in or out of the root:
// lg(p) a + (p-1)/p n b.
// Buffers are bytes: the root's holds p blocks of `block_bytes` in rank order.

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/transport/transport.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <vector>

namespace coltrain::comm {

namespace detail {

// How many blocks the subtree of relative rank v holds, of p.
inline int binomial_subtree_blocks(int v, int p) {
  const int lowest = v == 0 ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(p))) : v & -v;
  return std::min(lowest, p - v);
}

}  // namespace detail

template <Transport Tr>
void binomial_gather(Tr& transport, const std::byte* input, std::byte* output,
                     std::size_t block_bytes, int root, const MessageHeader& call) {
  const int p = transport.size();
  const int v = (transport.rank() - root + p) % p;
  const auto blocks = [&](int n) { return static_cast<std::size_t>(n) * block_bytes; };
  const auto real = [&](int relative) { return (relative + root) % p; };
  // The subtree's blocks in relative order; this rank's own first.
  std::vector<std::byte> held(blocks(detail::binomial_subtree_blocks(v, p)));
  detail::copy_bytes(held.data(), input, block_bytes);
  int count = 1;
  for (int mask = 1; mask < p; mask <<= 1) {
    if ((v & mask) != 0) {
      auto request = transport.isend(real(v - mask), detail::message(call, blocks(count)),
                                     std::span<const std::byte>(held.data(), blocks(count)));
      transport.wait(request);
      return;
    }
    const int child = v + mask;
    if (child >= p) continue;
    const int n = std::min(mask, p - child);
    auto request = transport.irecv(real(child), detail::message(call, blocks(n)),
                                   std::span<std::byte>(held.data() + blocks(mask), blocks(n)));
    transport.wait(request);
    count = mask + n;
  }
  for (int j = 0; j < p; ++j)
    detail::copy_bytes(output + blocks(real(j)), held.data() + blocks(j), block_bytes);
}

template <Transport Tr>
void binomial_scatter(Tr& transport, const std::byte* input, std::byte* output,
                      std::size_t block_bytes, int root, const MessageHeader& call) {
  const int p = transport.size();
  const int v = (transport.rank() - root + p) % p;
  const auto blocks = [&](int n) { return static_cast<std::size_t>(n) * block_bytes; };
  const auto real = [&](int relative) { return (relative + root) % p; };
  const int subtree = detail::binomial_subtree_blocks(v, p);
  std::vector<std::byte> held(blocks(subtree));
  int mask = 0;
  if (v == 0) {
    for (int j = 0; j < p; ++j)
      detail::copy_bytes(held.data() + blocks(j), input + blocks(real(j)), block_bytes);
    mask = static_cast<int>(std::bit_ceil(static_cast<unsigned>(p)));
  } else {
    mask = v & -v;
    auto request = transport.irecv(real(v - mask), detail::message(call, blocks(subtree)),
                                   std::span<std::byte>(held.data(), blocks(subtree)));
    transport.wait(request);
  }
  std::vector<typename Tr::Request> sends;
  for (int m = mask >> 1; m > 0; m >>= 1) {
    const int child = v + m;
    if (child >= p) continue;
    const int n = std::min(m, p - child);
    sends.push_back(
        transport.isend(real(child), detail::message(call, blocks(n)),
                        std::span<const std::byte>(held.data() + blocks(m), blocks(n))));
  }
  wait_all(transport, std::span(sends));
  detail::copy_bytes(output, held.data(), block_bytes);
}

}  // namespace coltrain::comm
