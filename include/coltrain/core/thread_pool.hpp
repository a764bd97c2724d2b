#pragma once
// A fork-join pool for the CPU kernels. The calling thread does the first share of the work, so a
// pool of size 1 starts no thread at all. Workers spin briefly before they sleep on an atomic
// (futex) wait: a training step issues thousands of short parallel loops, and a wake-up through the
// kernel costs more than many of them. Workers flush subnormal floats to zero (see denormals.hpp).

#include <coltrain/core/config.hpp>
#include <coltrain/core/denormals.hpp>
#include <coltrain/core/error.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain {

class ThreadPool {
 public:
  // `threads` counts the caller: ThreadPool(2) starts one worker.
  explicit ThreadPool(int threads = 1) {
    if (threads < 1)
      throw InvalidArgument("a thread pool needs at least 1 thread, got " + std::to_string(threads));
    workers_.reserve(static_cast<std::size_t>(threads - 1));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    stopping_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(thread_index) once on every thread of the pool and returns when all have returned.
  // An exception from any of them is rethrown here (the first one).
  template <class F>
  void run_on_all(F&& fn) {
    if (workers_.empty()) {
      fn(0);
      return;
    }
    task_ = [](void* context, int index) { (*static_cast<std::remove_reference_t<F>*>(context))(index); };
    context_ = static_cast<void*>(&fn);
    pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    run_task(0);
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins < kSpinIterations) {
        pause();
      } else {
        const int left = pending_.load(std::memory_order_acquire);
        if (left != 0) pending_.wait(left, std::memory_order_acquire);
      }
    }
    if (error_) {
      std::exception_ptr error = std::exchange(error_, nullptr);
      std::rethrow_exception(error);
    }
  }

  // Splits [0, n) into size() contiguous ranges of nearly equal length and calls
  // fn(begin, end, thread_index) for each non-empty one.
  template <class F>
  void parallel_for(std::int64_t n, F&& fn) {
    const std::int64_t parts = std::min<std::int64_t>(size(), n);
    if (parts <= 1) {
      if (n > 0) fn(std::int64_t{0}, n, 0);
      return;
    }
    run_on_all([&](int index) {
      if (index >= parts) return;
      const std::int64_t begin = n * index / parts;
      const std::int64_t end = n * (index + 1) / parts;
      fn(begin, end, index);
    });
  }

 private:
  static constexpr int kSpinIterations = 20000;  // roughly 50-100 us of pause instructions

  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }

  void run_task(int index) {
    try {
      task_(context_, index);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }

  void work(int index) {
    const FlushDenormalsScope flush;  // workers run only coltrain's kernels
    std::uint64_t seen = 0;
    for (;;) {
      for (int spins = 0; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        if (spins < kSpinIterations)
          pause();
        else
          generation_.wait(seen, std::memory_order_acquire);
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stopping_.load(std::memory_order_relaxed)) return;
      run_task(index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stopping_{false};
  void (*task_)(void*, int) = nullptr;
  void* context_ = nullptr;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace coltrain
