#pragma once
// PointToPoint<Comm>: messages from one rank to another, Communicator's send, recv, isend and
// irecv (its base class; the communicator numbers and posts them, comm/protocol/message_book.hpp
// matches them).
//
// A message from this rank to `peer` is received there by recv with this rank and the same tag (0
// to kMaxTag). Messages between two ranks with one tag arrive in the order they were sent; with
// different tags, and against the collectives, in any order (MPI's rules): a message never meets a
// collective's receive. The receive's count and dtype must be the sender's, or both fail with
// MismatchError. A rank cannot send to itself. Device buffers over MPI and TCP travel through host
// memory; on NCCL they take tag 0 only, wait in one group that goes to NCCL when one of them is
// waited for or tested (or another device call comes), and are then ordered on stream() like the
// collectives: synchronize() waits for the data. isend/irecv post the message at once and return;
// it progresses whenever the communicator moves bytes (any call on it, or wait/test on any of its
// requests). The buffer must stay valid and untouched until the request completes.

#include <coltrain/comm/elements.hpp>
#include <coltrain/comm/request.hpp>
#include <coltrain/core/dtype.hpp>

#include <span>

namespace coltrain::comm {

template <class Comm>
class PointToPoint {
 public:
  static constexpr int kMaxTag = 16000;

  template <detail::CollectiveElement T>
  void send(std::span<const T> data, int peer, int tag = 0) {
    isend(data, peer, tag).wait();
  }
  template <detail::CollectiveElement T>
  void recv(std::span<T> data, int peer, int tag = 0) {
    irecv(data, peer, tag).wait();
  }
  template <detail::CollectiveElement T>
  Request isend(std::span<const T> data, int peer, int tag = 0) {
    return self().post_message(true, peer, tag, data_type_v<T>, data.size(), std::as_bytes(data),
                               {});
  }
  template <detail::CollectiveElement T>
  Request irecv(std::span<T> data, int peer, int tag = 0) {
    return self().post_message(false, peer, tag, data_type_v<T>, data.size(), {},
                               std::as_writable_bytes(data));
  }

 private:
  Comm& self() { return static_cast<Comm&>(*this); }
};

}  // namespace coltrain::comm
