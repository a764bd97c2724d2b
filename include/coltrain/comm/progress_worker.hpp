#pragma once
// What a Request (comm/request.hpp, which holds the handles) and the thread that completes it
// share, and that thread: the worker behind a communicator's ProgressThread, which runs the
// submitted calls one after another in issue order.

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace coltrain::comm::detail {

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

class ProgressWorker {
 public:
  ProgressWorker() : thread_([this] { run(); }) {}
  ProgressWorker(const ProgressWorker&) = delete;
  ProgressWorker& operator=(const ProgressWorker&) = delete;
  ~ProgressWorker() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  std::thread::id id() const { return thread_.get_id(); }

  // Queues `call`; the state completes when it has run.
  std::shared_ptr<RequestState> submit(std::function<void()> call) {
    auto state = std::make_shared<RequestState>();
    {
      const std::lock_guard lock(mutex_);
      queue_.push_back({std::move(call), state});
    }
    changed_.notify_all();
    return state;
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

}  // namespace coltrain::comm::detail
