#pragma once
// AnyTransport: any Transport (transport.hpp) behind one type, so that the host algorithms are
// compiled once, over AnyTransport, instead of once per transport (MPI, TCP) and again per
// subgroup of one (the hierarchical allreduce's phases). It refers to the transport (which must
// outlive it) through a table of functions, as a virtual call would, and carries the transport's
// own requests as bytes: a few nanoseconds a message, against microseconds for the message itself.
//
// subgroup(members) is the same transport seen by some of its ranks: rank i of the subgroup is
// members[i] of the whole.

#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/transport/transport.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

namespace coltrain::comm {

class AnyTransport {
 public:
  // The transport's own request, copied in as bytes. A default Request is the transport's
  // default request (TcpTransport's refers to nothing and is complete).
  struct Request {
    alignas(8) std::byte bytes[16] = {};
    bool engaged = false;
  };

  template <Transport Tr>
  requires(!std::same_as<Tr, AnyTransport>) explicit AnyTransport(Tr& transport)
      : transport_(&transport),
        operations_(&kOperations<Tr>),
        rank_(transport.rank()),
        size_(transport.size()) {}

  int rank() const { return rank_; }
  int size() const { return size_; }

  Request isend(int peer, const MessageHeader& header, std::span<const std::byte> payload) {
    return operations_->isend(transport_, whole_rank(peer), header, payload);
  }
  Request irecv(int peer, const MessageHeader& expected, std::span<std::byte> payload) {
    return operations_->irecv(transport_, whole_rank(peer), expected, payload);
  }
  void wait(const Request& request) { operations_->wait(transport_, request); }

  // The ranks `members` of this transport (this rank among them, each once) as a transport of
  // their own; `members` must outlive it. Throws InvalidArgument for a subgroup of a subgroup
  // (whose ranks would need a map of their own) and for members without this rank.
  AnyTransport subgroup(std::span<const int> members) const {
    if (!members_.empty())
      throw InvalidArgument("AnyTransport: a subgroup of a subgroup is not supported");
    const auto mine = std::find(members.begin(), members.end(), rank_);
    if (mine == members.end())
      throw InvalidArgument("AnyTransport: rank " + std::to_string(rank_) +
                            " is not among the subgroup's members");
    AnyTransport group = *this;
    group.members_ = members;
    group.rank_ = static_cast<int>(mine - members.begin());
    group.size_ = static_cast<int>(members.size());
    return group;
  }

 private:
  struct Operations {
    Request (*isend)(void* transport, int peer, const MessageHeader& header,
                     std::span<const std::byte> payload);
    Request (*irecv)(void* transport, int peer, const MessageHeader& expected,
                     std::span<std::byte> payload);
    void (*wait)(void* transport, const Request& request);
  };

  template <class Tr>
  static Request wrap(const typename Tr::Request& request) {
    using Own = typename Tr::Request;
    static_assert(std::is_trivially_copyable_v<Own> && sizeof(Own) <= sizeof(Request::bytes) &&
                      alignof(Own) <= alignof(Request),
                  "AnyTransport carries a transport's requests as up to 16 bytes");
    Request erased;
    std::memcpy(erased.bytes, &request, sizeof(Own));
    erased.engaged = true;
    return erased;
  }

  template <class Tr>
  static typename Tr::Request unwrap(const Request& erased) {
    typename Tr::Request request{};
    if (erased.engaged) std::memcpy(&request, erased.bytes, sizeof(request));
    return request;
  }

  template <class Tr>
  static constexpr Operations kOperations = {
      [](void* transport, int peer, const MessageHeader& header,
         std::span<const std::byte> payload) {
        return wrap<Tr>(static_cast<Tr*>(transport)->isend(peer, header, payload));
      },
      [](void* transport, int peer, const MessageHeader& expected, std::span<std::byte> payload) {
        return wrap<Tr>(static_cast<Tr*>(transport)->irecv(peer, expected, payload));
      },
      [](void* transport, const Request& request) {
        static_cast<Tr*>(transport)->wait(unwrap<Tr>(request));
      },
  };

  int whole_rank(int peer) const {
    return members_.empty() ? peer : members_[static_cast<std::size_t>(peer)];
  }

  void* transport_;
  const Operations* operations_;
  int rank_;
  int size_;
  std::span<const int> members_;  // empty: the whole transport
};

static_assert(Transport<AnyTransport>);

// `transport` as an AnyTransport: itself if it is one.
template <Transport Tr>
AnyTransport as_any_transport(Tr& transport) {
  if constexpr (std::same_as<Tr, AnyTransport>)
    return transport;
  else
    return AnyTransport(transport);
}

}  // namespace coltrain::comm
