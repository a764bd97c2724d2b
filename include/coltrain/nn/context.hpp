#pragma once
// What a layer needs besides its tensors: the threads to run on, whether it is training (BatchNorm
// and Dropout behave differently), a seed and step counter for reproducible random masks, and the
// hook through which containers report gradients that a backward pass has finished.

#include <coltrain/core/config.hpp>
#include <coltrain/core/thread_pool.hpp>
#include <coltrain/tensor/device.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>

namespace coltrain::nn {

enum class Mode { kTrain, kEval };

template <class Device>
class Context;

// What a context holds on every device: whether the network is training, the seed and step of
// random masks, and the gradient-ready hook. Context<Device> derives from it.
class ContextState {
 public:
  Mode mode() const { return mode_; }
  bool training() const { return mode_ == Mode::kTrain; }
  void set_mode(Mode mode) { mode_ = mode; }

  // Random masks are a function of (seed, step, layer, element), so a run is reproducible and a
  // resumed run draws the same masks as an uninterrupted one.
  std::uint64_t seed() const { return seed_; }
  std::uint64_t step() const { return step_; }
  void set_step(std::uint64_t step) { step_ = step; }

  // Called once per parameter and backward pass, on the thread running backward(), as soon as the
  // parameter's gradient is final, with the address of its Parameter<T, Device> (the protocol is in
  // nn/layer.hpp). Data-parallel training starts reducing gradients from here while the backward
  // pass goes on. Unset by default: containers then skip reporting after one test per child.
  using GradientReadyHook = std::function<void(const void* parameter)>;
  const GradientReadyHook& gradient_ready_hook() const { return gradient_ready_hook_; }
  void set_gradient_ready_hook(GradientReadyHook hook) { gradient_ready_hook_ = std::move(hook); }

 protected:
  explicit ContextState(std::uint64_t seed) : seed_(seed) {}

 private:
  Mode mode_ = Mode::kTrain;
  std::uint64_t seed_ = 0;
  std::uint64_t step_ = 0;
  GradientReadyHook gradient_ready_hook_;
};

template <>
class Context<tensor::Cpu> : public ContextState {
 public:
  explicit Context(int threads = 1, std::uint64_t seed = 0) : ContextState(seed), pool_(threads) {}

  ThreadPool& pool() { return pool_; }
  int threads() const { return pool_.size(); }

  // Copies and clears in the context's memory (the CUDA context queues them on its stream).
  template <class T>
  void copy(const T* from, T* to, std::int64_t count) {
    std::copy_n(from, count, to);
  }
  template <class T>
  void zero(T* data, std::int64_t count) {
    std::fill_n(data, count, T{});
  }

 private:
  ThreadPool pool_;
};

namespace detail {

// Loops that touch fewer elements than this run on the calling thread: waking the pool costs more.
inline constexpr std::int64_t kParallelWorkMin = 1 << 15;

// Runs f(begin, end) over [0, n): on the calling thread when `work` (the elements the loop touches)
// is below kParallelWorkMin, else split across the pool into contiguous ranges.
template <class Device, class F>
void parallel_range(Context<Device>& ctx, std::int64_t n, std::int64_t work, F&& f) {
  if (work < kParallelWorkMin) {
    f(std::int64_t{0}, n);
    return;
  }
  ctx.pool().parallel_for(n, [&](std::int64_t begin, std::int64_t end, int) { f(begin, end); });
}

}  // namespace detail
}  // namespace coltrain::nn
