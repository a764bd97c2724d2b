#pragma once
// A TCP communicator whose ranks find each other through a key-value store they all reach, as
// Gloo's rendezvous does: PyTorch's c10d::Store (the coltrain_torch backend), a file on a shared
// file system, a key-value service. For launchers that already run such a store (torchrun,
// torch.distributed.init_process_group) and hold MASTER_PORT themselves.
//
// Every rank opens a data listener on a port the kernel picks (nothing can take it between pick
// and bind) and writes its address under "coltrain/address/<rank>"; rank 0 also writes the mesh's
// nonce under "coltrain/nonce". Each rank then reads every address and the nonce and connects the
// full mesh as the launcher rendezvous does (tcp_rendezvous.hpp: the same hellos and, with a
// secret, the same proofs), so a stranger who can write to the store still cannot join without
// the secret. The listener's address is COLTRAIN_SOCKET_IFNAME's; else the one this host uses to
// reach MASTER_ADDR, when set; else an address other hosts can reach, loopback if it has none.
//
// The keys are fixed: give each communicator a store (or key prefix) of its own, as PyTorch's
// PrefixStore does for every process group. Collective over the `size` ranks: every rank calls it.

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/core/config.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace coltrain::comm {

// What the rendezvous needs of a store. get() waits until the key exists, bounded by the store's
// own timeout, and throws if it never does.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual void set(const std::string& key, std::span<const std::byte> value) = 0;
  virtual std::vector<std::byte> get(const std::string& key) = 0;
};

COLTRAIN_DECL Communicator tcp_over_store(RendezvousStore& store, int rank, int size,
                                          CommOptions options = comm_options_from_env());

}  // namespace coltrain::comm

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/comm/impl/store_rendezvous.ipp>
#endif
