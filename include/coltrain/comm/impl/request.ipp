// Request's and ProgressThread's out-of-line members. Header-only builds include this file at the
// end of comm/request.hpp; with COLTRAIN_SEPARATE_COMPILATION only <coltrain/src.hpp> includes it.
#pragma once

#include <coltrain/comm/progress_worker.hpp>
#include <coltrain/comm/request.hpp>
#include <coltrain/core/config.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>

namespace coltrain::comm {

COLTRAIN_DECL void Request::wait() const {
  if (!state_) return;
  if (state_->advance) state_->advance(true);
  std::unique_lock lock(state_->mutex);
  state_->finished.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

COLTRAIN_DECL bool Request::test() const {
  if (!state_) return true;
  if (state_->advance) state_->advance(false);
  const std::lock_guard lock(state_->mutex);
  if (state_->done && state_->error) std::rethrow_exception(state_->error);
  return state_->done;
}

COLTRAIN_DECL void wait_all(std::span<const Request> requests) {
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

COLTRAIN_DECL Request ProgressThread::submit(std::function<void()> call) {
  if (!worker_) worker_ = std::make_shared<ProgressWorker>();
  return Request(worker_->submit(std::move(call)));
}

COLTRAIN_DECL void ProgressThread::drain() noexcept {
  if (worker_ && std::this_thread::get_id() != worker_->id()) worker_->drain();
}

COLTRAIN_DECL ProgressThread::Drainer ProgressThread::drainer() {
  if (!worker_) worker_ = std::make_shared<ProgressWorker>();
  return Drainer(worker_);
}

COLTRAIN_DECL void ProgressThread::Drainer::operator()() const noexcept {
  if (worker_ && std::this_thread::get_id() != worker_->id()) worker_->drain();
}

}  // namespace detail
}  // namespace coltrain::comm
