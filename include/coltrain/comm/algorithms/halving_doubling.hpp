#pragma once
// Rabenseifner's allreduce: a reduce-scatter by recursive halving (lg p exchanges, each with the
// partner whose rank differs in one bit, halving the data each time) and an allgather by recursive
// doubling (the same exchanges in reverse). With p = 2^k ranks and n bytes: 2 lg(p) steps, each
// rank sends 2(p-1)/p n bytes and reduces (p-1)/p n bytes: bandwidth-optimal like ring, with lg p
// instead of p latencies.
//
// Other p: with q the largest power of two below p and e = p - q, the first 2e ranks pair up; each
// even one hands its whole vector to the odd one after it (which reduces) and sits out while q
// ranks run the algorithm, then receives the result: 2 extra steps of n bytes on those ranks.

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/transport/transport.hpp>

#include <bit>
#include <cstddef>
#include <vector>

namespace coltrain::comm {
namespace detail {

// Sends `sent` to and receives `received` from `peer` at the same time.
template <Transport Tr>
void exchange(Tr& transport, int peer, const MessageHeader& sent_header,
              std::span<const std::byte> sent, const MessageHeader& received_header,
              std::span<std::byte> received) {
  auto receive = transport.irecv(peer, received_header, received);
  auto send = transport.isend(peer, sent_header, sent);
  transport.wait(receive);
  transport.wait(send);
}

}  // namespace detail

template <Transport Tr>
void halving_doubling_allreduce(Tr& transport, const std::byte* input, std::byte* output,
                                std::size_t count, const ElementReduction& reduction,
                                const MessageHeader& call, std::vector<std::byte>& scratch) {
  const int p = transport.size();
  const int r = transport.rank();
  const std::size_t bytes = count * reduction.element_bytes();
  detail::copy_bytes(output, input, bytes);
  if (p == 1) return;
  const int q = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
  const int extra = p - q;
  const detail::ByteRange everything{0, bytes};
  const MessageHeader whole = detail::message(call, bytes);

  // Fold: ranks below 2e pair up; the even rank of each pair sits out.
  int virtual_rank = r - extra;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      auto send = transport.isend(r + 1, whole, detail::bytes_of(output, everything));
      transport.wait(send);
      virtual_rank = -1;
    } else {
      scratch.resize(bytes);
      auto receive =
          transport.irecv(r - 1, whole, detail::writable_bytes_of(scratch.data(), everything));
      transport.wait(receive);
      reduction.reduce(output, output, scratch.data(), bytes);
      virtual_rank = r / 2;
    }
  }

  if (virtual_rank >= 0) {
    auto real_rank = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
    const detail::Blocks blocks(count, static_cast<std::size_t>(q));
    auto range_of = [&](std::size_t first, std::size_t last) {
      return detail::ByteRange{
          blocks.begin(first) * reduction.element_bytes(),
          (blocks.begin(last) - blocks.begin(first)) * reduction.element_bytes()};
    };
    scratch.resize(bytes);
    // Recursive halving: keep the half of the window on this rank's side of the bit.
    std::size_t low = 0;
    std::size_t high = static_cast<std::size_t>(q);
    for (int mask = q / 2; mask >= 1; mask /= 2) {
      const int peer = real_rank(virtual_rank ^ mask);
      const std::size_t middle = (low + high) / 2;
      const bool keep_low = (virtual_rank & mask) == 0;
      const detail::ByteRange kept = keep_low ? range_of(low, middle) : range_of(middle, high);
      const detail::ByteRange given = keep_low ? range_of(middle, high) : range_of(low, middle);
      detail::exchange(transport, peer, detail::message(call, given.size),
                       detail::bytes_of(output, given), detail::message(call, kept.size),
                       detail::writable_bytes_of(scratch.data(), detail::ByteRange{0, kept.size}));
      reduction.reduce(output + kept.begin, output + kept.begin, scratch.data(), kept.size);
      (keep_low ? high : low) = middle;
    }
    const detail::ByteRange reduced = range_of(low, high);  // this rank's block of the result
    reduction.finish(output + reduced.begin, reduced.size, p);
    // Recursive doubling: swap windows with the same partners in reverse order.
    for (int mask = 1; mask < q; mask *= 2) {
      const int peer = real_rank(virtual_rank ^ mask);
      const std::size_t width = high - low;
      const bool window_is_low = (virtual_rank & mask) == 0;
      const std::size_t peer_low = window_is_low ? high : low - width;
      const detail::ByteRange mine = range_of(low, high);
      const detail::ByteRange theirs = range_of(peer_low, peer_low + width);
      detail::exchange(transport, peer, detail::message(call, mine.size),
                       detail::bytes_of(output, mine), detail::message(call, theirs.size),
                       detail::writable_bytes_of(output, theirs));
      low = std::min(low, peer_low);
      high = low + 2 * width;
    }
  }

  // Unfold: the ranks that sat out get the result from their partner.
  if (r < 2 * extra) {
    if (r % 2 == 1) {
      auto send = transport.isend(r - 1, whole, detail::bytes_of(output, everything));
      transport.wait(send);
    } else {
      auto receive = transport.irecv(r + 1, whole, detail::writable_bytes_of(output, everything));
      transport.wait(receive);
    }
  }
}

}  // namespace coltrain::comm
