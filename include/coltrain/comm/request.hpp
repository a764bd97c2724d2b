#pragma once
// Non-blocking collectives: the Request an i-call (Communicator::iallreduce and the others)
// returns, and the progress thread that runs those calls in the background, one per communicator.
//
// The progress thread takes calls in the order they were issued and runs each to completion
// before the next, so requests complete in issue order and every rank's calls still meet in the
// same order. A blocking call on the communicator first waits for the requests issued before it
// (issue, then wait), so it keeps its place in that order too. The thread starts with the first
// i-call: a program that never makes one has no extra thread.
//
// This header holds handles only; the state they share and the thread are in
// comm/progress_worker.hpp, which a file that calls collectives need not parse (separate
// compilation compiles them once, in impl/request.ipp).

#include <coltrain/core/config.hpp>

#include <functional>
#include <memory>
#include <span>
#include <utility>

namespace coltrain::comm {
namespace detail {
struct RequestState;   // comm/progress_worker.hpp
class ProgressWorker;  // comm/progress_worker.hpp
}  // namespace detail

// A handle on a non-blocking call. wait() returns once the call is complete, or throws what the
// blocking call would have thrown (MismatchError, TimeoutError, PeerLostError, ...), every time it
// is asked. test() says whether it is complete, and throws the same way once it is. The buffers
// handed to the call must stay valid, and untouched, until then. A default Request refers to no
// call and is complete.
class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<detail::RequestState> state) : state_(std::move(state)) {}

  void wait() const;
  bool test() const;

 private:
  std::shared_ptr<detail::RequestState> state_;
};

// Waits for every request, then throws the first one's error, if any failed.
COLTRAIN_DECL void wait_all(std::span<const Request> requests);

namespace detail {

// One thread that runs submitted calls in order. Moving one waits for the source's calls first,
// so a communicator can move (its calls hold its address) once nothing of it is in flight.
class ProgressThread {
 public:
  ProgressThread() = default;
  ProgressThread(ProgressThread&& other) noexcept {
    other.drain();
    worker_ = std::move(other.worker_);
  }
  ProgressThread& operator=(ProgressThread&& other) noexcept {
    if (this == &other) return *this;
    drain();
    other.drain();
    worker_ = std::move(other.worker_);
    return *this;
  }
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;
  ~ProgressThread() = default;  // the worker finishes what it was given, then joins

  // Queues `call`; the request completes when it has run.
  Request submit(std::function<void()> call);

  // Returns once every call submitted so far has run. A no-op on the progress thread itself, whose
  // calls are the ones being waited for.
  void drain() noexcept;

  // drain() that stays valid where this object moves (it holds the thread), for send/recv
  // requests, which drain before they drive the transport.
  class Drainer {
   public:
    Drainer() = default;
    explicit Drainer(std::shared_ptr<ProgressWorker> worker) : worker_(std::move(worker)) {}
    void operator()() const noexcept;

   private:
    std::shared_ptr<ProgressWorker> worker_;
  };

  // Starts the thread if it has not started.
  Drainer drainer();

 private:
  std::shared_ptr<ProgressWorker> worker_;
};

}  // namespace detail
}  // namespace coltrain::comm

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/comm/impl/request.ipp>
#endif
