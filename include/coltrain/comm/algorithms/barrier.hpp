#pragma once
// Dissemination barrier: in round k every rank signals rank r + 2^k and waits for rank r - 2^k, so
// after ceil(lg p) rounds every rank has heard, directly or not, from every other. Messages are
// headers only.

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/transport/transport.hpp>

namespace coltrain::comm {

template <Transport Tr>
void dissemination_barrier(Tr& transport, const MessageHeader& call) {
  const int p = transport.size();
  const int r = transport.rank();
  for (int distance = 1; distance < p; distance *= 2) {
    auto receive = transport.irecv(detail::modulo(r - distance, p), call, {});
    auto send = transport.isend((r + distance) % p, call, {});
    transport.wait(receive);
    transport.wait(send);
  }
}

}  // namespace coltrain::comm
