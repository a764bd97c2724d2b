// Optimizer steps on the network's thread pool (PrecisionOptimizer::use_threads): the elements are
// shared out once each, and every optimizer and precision policy gives the bits of a step on the
// calling thread, over parameters whose shares end mid-parameter and steps that create state.

#include <coltrain/core/dtype.hpp>
#include <coltrain/core/thread_pool.hpp>
#include <coltrain/optim/adam.hpp>
#include <coltrain/optim/element_shares.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/optim/sgd.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

using coltrain::bfloat16;
using coltrain::half;
using coltrain::ThreadPool;
using coltrain::optim::Adam;
using coltrain::optim::AdamW;
using coltrain::optim::Fp32;
using coltrain::optim::MixedBf16;
using coltrain::optim::MixedFp16;
using coltrain::optim::PrecisionOptimizer;
using coltrain::optim::Sgd;
using coltrain::optim::TypedParamRef;

// Sizes whose total passes the parallel threshold, cut by 3 threads inside the first and last
// parameter, with an empty one and a tiny one between.
const std::vector<std::size_t> kSizes = {20000, 0, 7, 30001};

// Values of many magnitudes and both signs, so that a wrong index or a lost update changes bits.
float pattern(std::uint64_t index, std::uint64_t salt) {
  std::uint64_t x = (index + 1) * 0x9E3779B97F4A7C15ull ^ (salt + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  const float unit = static_cast<float>(x % 2000001) / 1000000.0f - 1.0f;  // [-1, 1]
  return unit * static_cast<float>(1 << (x >> 61));                        // up to 128
}

template <class T>
struct Model {
  std::vector<std::string> names;
  std::vector<std::vector<T>> values, grads;

  Model() {
    for (std::size_t p = 0; p < kSizes.size(); ++p) {
      names.push_back("p" + std::to_string(p));
      values.emplace_back(kSizes[p]);
      grads.emplace_back(kSizes[p]);
      for (std::size_t i = 0; i < kSizes[p]; ++i) values[p][i] = T(pattern(i, p));
    }
  }
  void set_grads(int step) {
    for (std::size_t p = 0; p < kSizes.size(); ++p)
      for (std::size_t i = 0; i < kSizes[p]; ++i) grads[p][i] = T(pattern(i, 100 * step + p) / 8);
  }
  std::vector<TypedParamRef<T>> refs() {
    std::vector<TypedParamRef<T>> result;
    for (std::size_t p = 0; p < kSizes.size(); ++p)
      result.push_back({names[p], values[p], grads[p], /*weight_decay=*/p != 2});
    return result;
  }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  // An empty parameter's data() may be null, which memcmp must not see.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class Optimizer>
std::map<std::string, std::vector<float>> state_of(const Optimizer& optimizer) {
  std::map<std::string, std::vector<float>> state;
  optimizer.optimizer().for_each_state([&](const std::string& name, std::span<const float> values) {
    state[name] = std::vector<float>(values.begin(), values.end());
  });
  return state;
}

// Three steps of the same optimizer on one thread and on a pool of 3, from the same model.
template <class Policy, class Optimizer>
void check_same_bits(const Optimizer& optimizer) {
  using T = typename Policy::Storage;
  Model<T> alone, shared;
  PrecisionOptimizer<Policy, Optimizer> serial(alone.refs(), optimizer);
  PrecisionOptimizer<Policy, Optimizer> threaded(shared.refs(), optimizer);
  ThreadPool pool(3);
  threaded.use_threads(&pool);
  for (int step = 0; step < 3; ++step) {
    alone.set_grads(step);
    shared.set_grads(step);
    const bool taken = serial.step(0.01);
    CHECK(threaded.step(0.01) == taken);
    for (std::size_t p = 0; p < kSizes.size(); ++p) {
      INFO("step " << step << ", parameter " << p);
      CHECK(same_bits(alone.values[p], shared.values[p]));
      CHECK(same_bits(alone.grads[p], shared.grads[p]));  // unscaled in place, or not touched
    }
    const auto serial_state = state_of(serial);
    const auto threaded_state = state_of(threaded);
    REQUIRE(serial_state.size() == threaded_state.size());
    for (const auto& [name, values] : serial_state) {
      INFO("state " << name << " after step " << step);
      CHECK(same_bits(values, threaded_state.at(name)));
    }
  }
}

}  // namespace

TEST_CASE("element shares cover every element once, on several threads", "[optim][threads]") {
  std::vector<std::vector<float>> storage;
  std::vector<coltrain::optim::ParamRef> params;
  for (std::size_t n : kSizes) storage.emplace_back(n);
  for (auto& values : storage) params.push_back({"", values, values});
  std::vector<std::vector<int>> visits;
  for (std::size_t n : kSizes) visits.emplace_back(n, 0);
  std::set<std::thread::id> threads;
  std::mutex mutex;
  std::vector<std::string> bad_ranges;  // Catch's assertions are for the test's thread only
  auto visit = [&](std::size_t p, std::size_t begin, std::size_t end) {
    const std::lock_guard lock(mutex);
    threads.insert(std::this_thread::get_id());
    if (begin >= end || end > kSizes[p]) {
      bad_ranges.push_back(std::to_string(p) + ": [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ")");
      return;
    }
    for (std::size_t i = begin; i < end; ++i) ++visits[p][i];
  };

  SECTION("on a pool") {
    ThreadPool pool(3);
    coltrain::optim::detail::for_each_element_share(
        std::span<const coltrain::optim::ParamRef>(params), &pool, visit);
    CHECK(threads.size() == 3);
  }
  SECTION("without one") {
    coltrain::optim::detail::for_each_element_share(
        std::span<const coltrain::optim::ParamRef>(params), nullptr, visit);
    CHECK(threads.size() == 1);
  }
  SECTION("few elements stay on the calling thread") {
    ThreadPool pool(3);
    params.resize(3);  // 20007 elements, under the threshold
    visits.resize(3);
    coltrain::optim::detail::for_each_element_share(
        std::span<const coltrain::optim::ParamRef>(params), &pool, visit);
    CHECK(threads == std::set{std::this_thread::get_id()});
  }
  CHECK(bad_ranges.empty());
  for (std::size_t p = 0; p < visits.size(); ++p)
    for (std::size_t i = 0; i < visits[p].size(); ++i) {
      INFO("parameter " << p << ", element " << i);
      REQUIRE(visits[p][i] == 1);
    }
}

TEST_CASE("a step on the network's threads gives the bits of a step on one", "[optim][threads]") {
  SECTION("SGD without momentum, with weight decay") {
    check_same_bits<Fp32>(Sgd({.lr = 0.01, .weight_decay = 0.1}));
  }
  SECTION("SGD with momentum and dampening, creating its buffers") {
    check_same_bits<Fp32>(
        Sgd({.lr = 0.01, .momentum = 0.9, .dampening = 0.25, .weight_decay = 1e-3}));
  }
  SECTION("SGD with Nesterov momentum") {
    check_same_bits<Fp32>(Sgd({.lr = 0.01, .momentum = 0.9, .nesterov = true}));
  }
  SECTION("Adam with L2 decay") { check_same_bits<Fp32>(Adam({.weight_decay = 0.01})); }
  SECTION("AdamW") { check_same_bits<Fp32>(AdamW()); }
  SECTION("bf16 master weights rounded into the model") {
    check_same_bits<MixedBf16>(Sgd({.lr = 0.01, .momentum = 0.9}));
  }
  SECTION("fp16 with loss scaling") { check_same_bits<MixedFp16>(Adam()); }
}

TEST_CASE("a non-finite gradient in any share skips the threaded step", "[optim][threads]") {
  // Where each of the 3 shares lies: the first parameter, the middle, the last element.
  for (const auto& [p, i] : {std::pair<std::size_t, std::size_t>{0, 5}, {3, 100}, {3, 30000}}) {
    INFO("Inf at parameter " << p << ", element " << i);
    Model<half> model;
    PrecisionOptimizer<MixedFp16, Sgd> optimizer(model.refs(), Sgd({.lr = 0.01}));
    ThreadPool pool(3);
    optimizer.use_threads(&pool);
    const std::vector<half> before = model.values[0];
    const float scale = optimizer.loss_scale();
    model.set_grads(0);
    model.grads[p][i] = half(std::numeric_limits<float>::infinity());
    CHECK_FALSE(optimizer.step(0.01));
    CHECK(same_bits(model.values[0], before));
    CHECK(optimizer.loss_scale() == scale / 2);
  }
}
