#pragma once
// The send/recv messages of one communicator that are posted and not yet known to be complete
// (Communicator::isend/irecv), and the requests handed out for them.
//
// A message is posted to the transport at once, on the caller's thread, and progresses whenever
// the transport moves bytes: in any call on the communicator, and in Request::wait() and test()
// on it. Those first let the progress thread finish the calls issued before them, so that the
// transport is driven by one thread at a time. A communicator destroyed with messages pending
// fails their requests instead of leaving them to wait for a transport that is gone.

#include <coltrain/comm/progress_worker.hpp>
#include <coltrain/comm/request.hpp>
#include <coltrain/core/error.hpp>

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace coltrain::comm::detail {

class MessageBook : public std::enable_shared_from_this<MessageBook> {
 public:
  // Waits for the message (block) or tests it once; returns true once it is complete, throws
  // what the transport throws.
  using Advance = std::function<bool(bool block)>;

  explicit MessageBook(ProgressThread::Drainer drain) : drain_(std::move(drain)) {}

  Request add(Advance advance) {
    auto state = std::make_shared<RequestState>();
    const std::lock_guard lock(mutex_);
    const std::uint64_t id = next_id_++;
    // The entry holds the state until the message completes; the state's hook holds this book.
    state->advance = [book = shared_from_this(), id](bool block) { book->advance(id, block); };
    entries_.emplace(id, Entry{std::move(advance), state});
    return Request(std::move(state));
  }

  // The communicator goes: every pending message fails, naming why.
  void close() noexcept {
    std::map<std::uint64_t, Entry> pending;
    {
      const std::lock_guard lock(mutex_);
      pending.swap(entries_);
      drain_ = {};
    }
    for (auto& [id, entry] : pending) {
      entry.state->complete(std::make_exception_ptr(
          CommError("the communicator was destroyed before this send/recv completed")));
    }
  }

 private:
  struct Entry {
    Advance advance;
    std::shared_ptr<RequestState> state;
  };

  void advance(std::uint64_t id, bool block) {
    std::shared_ptr<RequestState> finished;
    std::exception_ptr failure;
    {
      const std::lock_guard lock(mutex_);
      const auto entry = entries_.find(id);
      if (entry == entries_.end()) return;  // complete already, or the communicator is gone
      drain_();
      bool done = true;
      try {
        done = entry->second.advance(block);
      } catch (...) {
        failure = std::current_exception();
      }
      if (!done) return;
      finished = std::move(entry->second.state);
      entries_.erase(entry);  // breaks the state -> hook -> book -> entry cycle
    }
    finished->complete(std::move(failure));
  }

  std::mutex mutex_;  // one thread drives the transport for the book at a time
  ProgressThread::Drainer drain_;
  std::map<std::uint64_t, Entry> entries_;
  std::uint64_t next_id_ = 0;
};

}  // namespace coltrain::comm::detail
