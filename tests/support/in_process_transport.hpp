#pragma once
// InProcessTransport: the Transport concept (comm/transport/transport.hpp) between threads of one
// process, so that an algorithm header can be tested alone, without sockets, MPI or a
// Communicator. One InProcessWorld holds a FIFO of messages per ordered pair of ranks; rank r's
// transport is InProcessTransport(world, r), used by one thread. A send copies its payload into
// the FIFO and is complete at once (a buffered send, which the contract allows); a receive is
// matched, in posting order per peer, when it or a later receive from that peer is waited on, and
// its header is checked as the real transports check it (check_header). A wait that sees no
// message for `timeout` throws TimeoutError naming both ranks, so a wrong schedule fails instead
// of hanging. run_in_process() runs a body per rank, each on a thread of its own.

#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/transport/transport.hpp>
#include <coltrain/core/error.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace coltrain::testing {

class InProcessWorld {
 public:
  explicit InProcessWorld(int size, std::chrono::milliseconds timeout = std::chrono::seconds(20))
      : size_(size), timeout_(timeout), queues_(static_cast<std::size_t>(size * size)) {}

  int size() const { return size_; }

  struct Message {
    comm::MessageHeader header;
    std::vector<std::byte> payload;
  };

  void push(int from, int to, Message message) {
    {
      std::lock_guard lock(mutex_);
      queue(from, to).push_back(std::move(message));
    }
    arrived_.notify_all();
  }

  // The next message from `from` to `to`; throws TimeoutError after the timeout.
  Message pop(int from, int to) {
    std::unique_lock lock(mutex_);
    if (!arrived_.wait_for(lock, timeout_, [&] { return !queue(from, to).empty(); })) {
      ErrorContext where;
      where.rank = to;
      where.peer = from;
      throw TimeoutError("in-process transport: rank " + std::to_string(to) +
                             " waited for a message from rank " + std::to_string(from) +
                             " that never came",
                         where);
    }
    Message message = std::move(queue(from, to).front());
    queue(from, to).pop_front();
    return message;
  }

  // Messages sent and not received, over every pair: 0 after a collective that matched up.
  std::size_t undelivered() {
    std::lock_guard lock(mutex_);
    std::size_t total = 0;
    for (const auto& q : queues_) total += q.size();
    return total;
  }

 private:
  std::deque<Message>& queue(int from, int to) {
    return queues_[static_cast<std::size_t>(from * size_ + to)];
  }

  int size_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::vector<std::deque<Message>> queues_;
};

class InProcessTransport {
 public:
  struct Request {
    int peer = -1;
    bool is_send = false;
    std::uint64_t ticket = 0;
  };

  InProcessTransport(InProcessWorld& world, int rank)
      : world_(&world), rank_(rank), posted_(static_cast<std::size_t>(world.size())) {}

  int rank() const { return rank_; }
  int size() const { return world_->size(); }

  Request isend(int peer, const comm::MessageHeader& header, std::span<const std::byte> payload) {
    require_peer(peer);
    if (header.bytes != payload.size())
      throw InvalidArgument("in-process transport: header.bytes differs from the payload size");
    world_->push(rank_, peer, {header, std::vector<std::byte>(payload.begin(), payload.end())});
    return {peer, true, 0};
  }

  Request irecv(int peer, const comm::MessageHeader& expected, std::span<std::byte> payload) {
    require_peer(peer);
    Posted& posted = posted_[static_cast<std::size_t>(peer)];
    posted.receives.push_back({expected, payload});
    return {peer, false, posted.begin + posted.receives.size() - 1};
  }

  void wait(Request request) {
    if (request.is_send || request.peer < 0) return;
    Posted& posted = posted_[static_cast<std::size_t>(request.peer)];
    while (posted.begin <= request.ticket) {
      const Receive receive = posted.receives.front();
      InProcessWorld::Message message = world_->pop(request.peer, rank_);
      comm::check_header(receive.expected, message.header, rank_, request.peer);
      if (!message.payload.empty())
        std::memcpy(receive.payload.data(), message.payload.data(), message.payload.size());
      posted.receives.pop_front();
      ++posted.begin;
    }
  }

 private:
  struct Receive {
    comm::MessageHeader expected;
    std::span<std::byte> payload;
  };
  struct Posted {
    std::deque<Receive> receives;
    std::uint64_t begin = 0;  // the ticket of receives.front()
  };

  void require_peer(int peer) const {
    if (peer < 0 || peer >= size() || peer == rank_)
      throw InvalidArgument("in-process transport: rank " + std::to_string(rank_) +
                            " addressed invalid peer " + std::to_string(peer));
  }

  InProcessWorld* world_;
  int rank_;
  std::vector<Posted> posted_;  // per peer: receives posted and not yet matched
};

static_assert(comm::Transport<InProcessTransport>);

// What run_in_process() saw: each rank's error (null for a rank that returned), and the messages
// sent and never received (0 after collectives that matched up).
struct InProcessOutcome {
  std::vector<std::exception_ptr> errors;
  std::size_t undelivered = 0;
};

// Runs body(transport) for ranks 0..p-1 of one InProcessWorld, one thread each, and joins them.
// The body must not use Catch assertions (Catch is not thread-safe): it reports by throwing.
inline InProcessOutcome run_in_process(
    int p, const std::function<void(InProcessTransport&)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  InProcessWorld world(p, timeout);
  InProcessOutcome outcome;
  outcome.errors.resize(static_cast<std::size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      InProcessTransport transport(world, r);
      try {
        body(transport);
      } catch (...) {
        outcome.errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  outcome.undelivered = world.undelivered();
  return outcome;
}

}  // namespace coltrain::testing
