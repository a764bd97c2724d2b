#pragma once
// Deterministic data-parallel runs for the tests of DataParallel's deterministic mode
// (test_deterministic_training.cpp, test_deterministic_resnet.cpp): a fixed data set, a few SGD
// steps on the ranks of a communicator, and everything a run ends with as bytes, to compare
// across world sizes.

#include <catch2/catch.hpp>

#include "../support/thread_ranks.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/data_parallel.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::testing {

// Samples [first, first + count) of a fixed data set: random inputs, labels i % 5.
template <class Net>
tensor::Tensor<typename Net::value_type> inputs_of(std::int64_t first, std::int64_t count) {
  using T = typename Net::value_type;
  tensor::Tensor<T> inputs(Net::Input::batch(count));
  const std::int64_t size = inputs.numel() / count;
  for (std::int64_t s = 0; s < count; ++s) {
    nn::Rng rng(500 + static_cast<std::uint64_t>(first + s));
    for (std::int64_t i = 0; i < size; ++i)
      inputs.data()[s * size + i] = static_cast<T>(static_cast<float>(rng.uniform(-1.0, 1.0)));
  }
  return inputs;
}

inline std::vector<std::int32_t> labels_of(std::int64_t first, std::int64_t count) {
  std::vector<std::int32_t> labels;
  for (std::int64_t s = first; s < first + count; ++s)
    labels.push_back(static_cast<std::int32_t>(s % 5));
  return labels;
}

// Forward, cross-entropy, backward on samples [first, first + count), the loss's gradient
// multiplied by `loss_scale` (fp16's loss scaling); the mean loss.
template <class Net>
double forward_backward(Net& net, std::int64_t first, std::int64_t count, float loss_scale = 1) {
  using T = typename Net::value_type;
  const tensor::Tensor<T> inputs = inputs_of<Net>(first, count);
  const auto logits = net.forward(inputs.view());
  tensor::Tensor<T> grad(logits.shape());
  const double loss = nn::SoftmaxCrossEntropy().loss_and_grad<T>(logits, labels_of(first, count),
                                                                 grad.view(), loss_scale);
  net.backward(grad.view());
  return loss;
}

// Everything a run ends with, as bytes: parameters, buffers, and the loss of every step.
struct Outcome {
  std::vector<unsigned char> bytes;
  // The first byte where `other` differs, or -1: a failure says where, not every byte.
  std::ptrdiff_t first_difference(const Outcome& other) const {
    if (bytes.size() != other.bytes.size()) return 0;
    const auto at = std::mismatch(bytes.begin(), bytes.end(), other.bytes.begin());
    return at.first == bytes.end() ? -1 : at.first - bytes.begin();
  }
  template <class U>
  void add(std::span<const U> values) {
    const auto* begin = reinterpret_cast<const unsigned char*>(values.data());
    bytes.insert(bytes.end(), begin, begin + values.size_bytes());
  }
};

template <class Net>
void add_state(Outcome& outcome, Net& net) {
  using T = typename Net::value_type;
  net.visit_parameters(
      [&](const std::string&, auto& p) { outcome.add(std::span<const T>(p.value.span())); });
  net.visit_buffers([&](const std::string&, auto& buffer) {
    using U = typename std::remove_reference_t<decltype(buffer)>::value_type;
    outcome.add(std::span<const U>(buffer.span()));
  });
}

// `steps` SGD steps (rate 0.1, momentum 0.9) of Spec under `Policy` (fp32, bf16 with f32 master
// weights, or fp16 with f32 master weights and loss scaling) in deterministic mode with
// `micro_shards`, in global batches of `global_batch` samples: every parameter, running statistic
// and loss.
template <class Spec, class Policy>
Outcome deterministic_run(comm::Communicator& comm, int micro_shards, std::int64_t global_batch,
                          int steps) {
  nn::Network<Spec, typename Policy::Storage> net({.seed = 5});
  net.train();
  train::DataParallel ddp(net, comm, {.micro_shards = micro_shards});
  const auto params = optim::parameters_of(net);
  optim::PrecisionOptimizer<Policy, optim::Sgd> sgd(params,
                                                    optim::Sgd({.lr = 0.1, .momentum = 0.9}));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    losses.push_back(ddp.compute_gradients(static_cast<std::uint64_t>(step), [&](int shard) {
      const auto [begin, end] = ddp.shard_samples(global_batch, shard);
      return forward_backward(net, step * global_batch + begin, end - begin, sgd.loss_scale());
    }));
    sgd.step(0.1);
  }
  Outcome outcome;
  add_state(outcome, net);
  outcome.add(std::span<const double>(losses));
  return outcome;
}

// Every rank's outcome for each world size, under a lock (the ranks are threads).
struct Outcomes {
  std::mutex mutex;
  std::map<int, std::vector<Outcome>> by_world_size;
  void put(int world_size, int rank, Outcome outcome) {
    const std::lock_guard lock(mutex);
    auto& ranks = by_world_size[world_size];
    ranks.resize(static_cast<std::size_t>(world_size));
    ranks[static_cast<std::size_t>(rank)] = std::move(outcome);
  }
};

inline void require_all_passed(const std::vector<std::string>& failures) {
  const std::string text = joined(failures);
  INFO(text);
  REQUIRE(text.empty());
}

// `run(comm, micro_shards)` (an Outcome) on 1, 2, 4 and 8 ranks with 8 micro-shards: every rank
// of every world size must end with one rank's bytes, at least `min_bytes` of them. Then on 2
// ranks with 4 micro-shards, another computation (other ghost batches and masks), which must give
// other bytes, the same on both ranks: the comparison can fail. Returns one rank's outcome.
template <class Run>
Outcome require_same_bits_on_world_sizes(Run run, std::size_t min_bytes) {
  Outcomes outcomes;
  for (const int world_size : {1, 2, 4, 8}) {
    require_all_passed(run_thread_ranks(world_size, [&](comm::Communicator& comm) {
      outcomes.put(comm.size(), comm.rank(), run(comm, 8));
    }));
  }
  const Outcome reference = outcomes.by_world_size[1][0];
  REQUIRE(reference.bytes.size() > min_bytes);
  for (const auto& [world_size, ranks] : outcomes.by_world_size) {
    for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
      INFO(world_size << " ranks, rank " << rank << ", of " << reference.bytes.size() << " bytes");
      CHECK(ranks[rank].first_difference(reference) == -1);
    }
  }
  Outcomes four;
  require_all_passed(run_thread_ranks(
      2, [&](comm::Communicator& comm) { four.put(comm.size(), comm.rank(), run(comm, 4)); }));
  CHECK(four.by_world_size[2][0].first_difference(reference) != -1);
  CHECK(four.by_world_size[2][1].first_difference(four.by_world_size[2][0]) == -1);
  return reference;
}

}  // namespace coltrain::testing
