// The doors of a TCP job (comm/rendezvous/tcp_handshake.hpp with the judges of tcp_rendezvous.hpp
// and elastic_membership.hpp): what a stranger sends to rank 0's rendezvous, a data listener or an
// elastic door. The input's first byte picks the door and whether the job has a secret; the rest is
// the stranger's byte stream, delivered in pieces whose sizes come from the input too. The acceptor
// must end every stream by admitting or dropping it with a reason, never crash or wait on; without
// the secret it must never admit a stream that claims to prove one, and it must never admit a hello
// its judge refuses.

#include <coltrain/comm/elastic/elastic_membership.hpp>
#include <coltrain/comm/rendezvous/auth.hpp>
#include <coltrain/comm/rendezvous/tcp_handshake.hpp>
#include <coltrain/comm/rendezvous/tcp_rendezvous.hpp>

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"

namespace {

namespace detail = coltrain::comm::detail;
using coltrain::fuzz::fuzz_check;

constexpr int kWorldSize = 4;
constexpr std::uint64_t kJobHash = 0x1234'5678'9abc'def0ull;
constexpr std::uint64_t kMeshNonce = 77;

const coltrain::comm::AuthSecret& job_secret() {
  static const coltrain::comm::AuthSecret secret("fuzz-secret-0123456789abcdef", "fuzz");
  return secret;
}

// Feeds `stream` to an acceptor in pieces of the sizes `pieces` names, then closes the stranger's
// end; returns how the acceptor ended.
template <class Hello, class Judge>
void feed(const std::uint8_t* stream, std::size_t size, const Judge& judge, bool with_secret,
          const detail::AcceptorFacts& facts) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) != 0) std::abort();
  detail::FileDescriptor stranger(fds[0]);
  detail::IncomingHandshake<Hello> acceptor{detail::FileDescriptor(fds[1])};
  const detail::HandshakeSecurity security{with_secret ? &job_secret() : nullptr, "fuzz", "job",
                                           facts};
  std::size_t sent = 0;
  std::size_t piece = 1;
  while (sent < size && acceptor.status() == detail::IncomingHandshake<Hello>::Status::kReading) {
    piece = 1 + (stream[sent] % 61);  // the stream's own bytes choose where it is cut
    const std::size_t length = std::min(piece, size - sent);
    if (::send(stranger.get(), stream + sent, length, MSG_NOSIGNAL) <= 0) break;
    sent += length;
    acceptor.advance(judge, security);
  }
  stranger.reset();  // the stranger leaves: the acceptor must come to an end
  for (int step = 0;
       step < 8 && acceptor.status() == detail::IncomingHandshake<Hello>::Status::kReading;
       ++step) {
    acceptor.advance(judge, security);
  }
  using Status = typename detail::IncomingHandshake<Hello>::Status;
  fuzz_check(acceptor.status() != Status::kReading, "the acceptor ended when the stream closed");
  if (acceptor.status() == Status::kDropped) {
    fuzz_check(!acceptor.reason().empty(), "a dropped connection says why");
    return;
  }
  fuzz_check(judge(acceptor.hello()).empty(), "only hellos the judge accepts are admitted");
  fuzz_check(!with_secret, "nobody proves the secret without knowing it");
  fuzz_check(acceptor.hello().auth == detail::kHelloUnauthenticated,
             "a job without a secret admits only hellos that offer none");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool with_secret = (data[0] & 1) != 0;
  const std::uint8_t* stream = data + 1;
  const std::size_t length = size - 1;
  try {
    switch ((data[0] >> 1) % 3) {
      case 0:
        feed<detail::RendezvousHello>(stream, length,
                                      [](const detail::RendezvousHello& hello) {
                                        return detail::judge_rendezvous_hello(hello, 1, kWorldSize,
                                                                              kJobHash);
                                      },
                                      with_secret, {});
        break;
      case 1:
        feed<detail::MeshHello>(stream, length,
                                [](const detail::MeshHello& hello) {
                                  return detail::judge_mesh_hello(hello, 2, kWorldSize, kJobHash,
                                                                  kMeshNonce);
                                },
                                with_secret, {1, kMeshNonce});
        break;
      default:
        feed<detail::ElasticHello>(stream, length,
                                   [](const detail::ElasticHello& hello) {
                                     return detail::judge_elastic_hello(hello, kJobHash);
                                   },
                                   with_secret, {});
        break;
    }
  } catch (const coltrain::CommError&) {
    // The socket pair itself failing is not the parser's doing.
  }
  return 0;
}
