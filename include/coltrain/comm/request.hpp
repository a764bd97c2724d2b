#pragma once
// Non-blocking collectives: the Request an i-call (Communicator::iallreduce and the others)
// returns, and the progress thread that runs those calls in the background, one per communicator.
//
// The progress thread takes calls in the order they were issued and runs each to completion
// before the next, so requests complete in issue order and every rank's calls still meet in the
// same order. A blocking call on the communicator first waits for the requests issued before it
// (issue, then wait), so it keeps its place in that order too. The thread starts with the first
// i-call: a program that never makes one has no extra thread.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>

namespace coltrain::comm {
namespace detail {

// What a request and the thread that completes it share.
struct RequestState {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
  // Set for a send/recv message, which progresses where it is waited for or tested (block true:
  // until it completes); set once, before the request is handed out.
  std::function<void(bool block)> advance;

  void complete(std::exception_ptr failure) {
    {
      const std::lock_guard lock(mutex);
      error = std::move(failure);
      done = true;
    }
    finished.notify_all();
  }
};

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

  void wait() const {
    if (!state_) return;
    if (state_->advance) state_->advance(true);
    std::unique_lock lock(state_->mutex);
    state_->finished.wait(lock, [&] { return state_->done; });
    if (state_->error) std::rethrow_exception(state_->error);
  }

  bool test() const {
    if (!state_) return true;
    if (state_->advance) state_->advance(false);
    const std::lock_guard lock(state_->mutex);
    if (state_->done && state_->error) std::rethrow_exception(state_->error);
    return state_->done;
  }

 private:
  std::shared_ptr<detail::RequestState> state_;
};

// Waits for every request, then throws the first one's error, if any failed.
inline void wait_all(std::span<const Request> requests) {
  std::exception_ptr first;
  for (const Request& request : requests) {
    try {
      request.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

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
  Request submit(std::function<void()> call) {
    if (!worker_) worker_ = std::make_shared<Worker>();
    return worker_->submit(std::move(call));
  }

  // Returns once every call submitted so far has run. A no-op on the progress thread itself, whose
  // calls are the ones being waited for.
  void drain() noexcept {
    if (worker_ && std::this_thread::get_id() != worker_->id()) worker_->drain();
  }

 private:
  class Worker;

 public:
  // drain() that stays valid where this object moves (it holds the thread), for send/recv
  // requests, which drain before they drive the transport.
  class Drainer {
   public:
    Drainer() = default;
    explicit Drainer(std::shared_ptr<Worker> worker) : worker_(std::move(worker)) {}
    void operator()() const noexcept {
      if (worker_ && std::this_thread::get_id() != worker_->id()) worker_->drain();
    }

   private:
    std::shared_ptr<Worker> worker_;
  };

  // Starts the thread if it has not started.
  Drainer drainer() {
    if (!worker_) worker_ = std::make_shared<Worker>();
    return Drainer(worker_);
  }

 private:
  class Worker {
   public:
    Worker() : thread_([this] { run(); }) {}
    Worker(const Worker&) = delete;
    Worker& operator=(const Worker&) = delete;
    ~Worker() {
      {
        const std::lock_guard lock(mutex_);
        stopping_ = true;
      }
      changed_.notify_all();
      thread_.join();
    }

    std::thread::id id() const { return thread_.get_id(); }

    Request submit(std::function<void()> call) {
      auto state = std::make_shared<RequestState>();
      {
        const std::lock_guard lock(mutex_);
        queue_.push_back({std::move(call), state});
      }
      changed_.notify_all();
      return Request(std::move(state));
    }

    void drain() noexcept {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return queue_.empty() && !busy_; });
    }

   private:
    struct Task {
      std::function<void()> call;
      std::shared_ptr<RequestState> state;
    };

    void run() {
      std::unique_lock lock(mutex_);
      while (true) {
        changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to run
        Task task = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
        lock.unlock();
        std::exception_ptr failure;
        try {
          task.call();
        } catch (...) {
          failure = std::current_exception();
        }
        task.state->complete(std::move(failure));
        lock.lock();
        busy_ = false;
        changed_.notify_all();
      }
    }

    std::mutex mutex_;
    std::condition_variable changed_;  // a call queued or finished, or stopping
    std::deque<Task> queue_;
    bool busy_ = false;
    bool stopping_ = false;
    std::thread thread_;  // last: starts once the members above exist
  };

  std::shared_ptr<Worker> worker_;
};

}  // namespace detail
}  // namespace coltrain::comm
