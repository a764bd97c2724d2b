// DeterministicDataParallel on 1, 2, 4 and 8 TCP ranks run as threads: three SGD steps (fp32, and
// bf16 with f32 master weights) of a network with BatchNorm and dropout end with the same bits of
// every parameter, running statistic and loss on every world size and every rank; inputs that
// plain data-parallel training on 1 and 2 ranks turns into different bits, so that the comparison
// can fail; and the shard arithmetic and its errors.
#include <catch2/catch.hpp>

#include "../support/thread_ranks.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/data_parallel.hpp>
#include <coltrain/train/deterministic_data_parallel.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace coltrain;
using coltrain::testing::joined;
using coltrain::testing::run_thread_ranks;

namespace {

// BatchNorm (ghost batches of the shards) and dropout (masks keyed by step and shard).
using ShardNet =
    nn::Sequential<nn::Input<3, 6, 6>, nn::Conv2d<4, 3, 1, 1, false>, nn::BatchNorm2d<>, nn::ReLU,
                   nn::Dropout<0.25>, nn::Flatten, nn::Linear<5>>;
// The same without them, for plain DataParallel, whose semantics then do not depend on the
// world size either: only its order of additions does.
using PlainNet = nn::Sequential<nn::Input<3, 6, 6>, nn::Conv2d<4, 3, 1, 1>, nn::ReLU, nn::Flatten,
                                nn::Linear<5>>;

constexpr std::int64_t kGlobalBatch = 16;
constexpr int kSteps = 3;

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

std::vector<std::int32_t> labels_of(std::int64_t first, std::int64_t count) {
  std::vector<std::int32_t> labels;
  for (std::int64_t s = first; s < first + count; ++s)
    labels.push_back(static_cast<std::int32_t>(s % 5));
  return labels;
}

// Forward, cross-entropy, backward on samples [first, first + count); the mean loss.
template <class Net>
double forward_backward(Net& net, std::int64_t first, std::int64_t count) {
  using T = typename Net::value_type;
  const tensor::Tensor<T> inputs = inputs_of<Net>(first, count);
  const auto logits = net.forward(inputs.view());
  tensor::Tensor<T> grad(logits.shape());
  const double loss =
      nn::SoftmaxCrossEntropy().loss_and_grad<T>(logits, labels_of(first, count), grad.view());
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

// Three SGD steps under `Policy`: fp32, or bf16 with f32 master weights.
template <class Policy>
Outcome deterministic_run(comm::Communicator& comm, int micro_shards) {
  nn::Network<ShardNet, typename Policy::Storage> net({.seed = 5});
  net.train();
  train::DeterministicDataParallel ddp(net, comm, {.micro_shards = micro_shards});
  const auto params = optim::parameters_of(net);
  optim::PrecisionOptimizer<Policy, optim::Sgd> sgd(params,
                                                    optim::Sgd({.lr = 0.1, .momentum = 0.9}));
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    losses.push_back(ddp.compute_gradients(static_cast<std::uint64_t>(step), [&](int shard) {
      const auto [begin, end] = ddp.shard_samples(kGlobalBatch, shard);
      return forward_backward(net, step * kGlobalBatch + begin, end - begin);
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

void require_all_passed(const std::vector<std::string>& failures) {
  const std::string text = joined(failures);
  INFO(text);
  REQUIRE(text.empty());
}

}  // namespace

TEMPLATE_TEST_CASE("DeterministicDataParallel: 1, 2, 4 and 8 ranks end with the same bits",
                   "[train][deterministic]", optim::Fp32, optim::MixedBf16) {
  Outcomes outcomes;
  for (const int world_size : {1, 2, 4, 8}) {
    require_all_passed(run_thread_ranks(world_size, [&](comm::Communicator& comm) {
      outcomes.put(comm.size(), comm.rank(), deterministic_run<TestType>(comm, 8));
    }));
  }
  const Outcome& reference = outcomes.by_world_size[1][0];
  REQUIRE(reference.bytes.size() > 600);
  for (const auto& [world_size, ranks] : outcomes.by_world_size) {
    for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
      INFO(world_size << " ranks, rank " << rank << ", of " << reference.bytes.size() << " bytes");
      CHECK(ranks[rank].first_difference(reference) == -1);
    }
  }
  // Four shards of four samples are another computation (other ghost batches, other masks): the
  // outcome depends on the shards, not merely on the data.
  Outcomes four;
  require_all_passed(run_thread_ranks(2, [&](comm::Communicator& comm) {
    four.put(comm.size(), comm.rank(), deterministic_run<TestType>(comm, 4));
  }));
  CHECK(four.by_world_size[2][0].first_difference(reference) != -1);
  CHECK(four.by_world_size[2][1].first_difference(four.by_world_size[2][0]) == -1);
}

TEST_CASE("DeterministicDataParallel: these inputs tell plain data-parallel's world sizes apart",
          "[train][deterministic]") {
  // The same global batch of 16 on 1 rank and on 2 ranks of 8 samples (gradients averaged), from
  // the same weights: the same mathematics, summed in other orders. Without this, equal bits above
  // could come from data too tame to round differently.
  Outcomes outcomes;
  for (const int world_size : {1, 2}) {
    require_all_passed(run_thread_ranks(world_size, [&](comm::Communicator& comm) {
      nn::Network<PlainNet> net({.seed = 5});
      net.train();
      train::DataParallel ddp(net, comm);
      const auto params = optim::parameters_of(net);
      optim::PrecisionOptimizer<optim::Fp32, optim::Sgd> sgd(
          params, optim::Sgd({.lr = 0.1, .momentum = 0.9}));
      const std::int64_t local = kGlobalBatch / comm.size();
      for (int step = 0; step < kSteps; ++step) {
        net.zero_grad();
        forward_backward(net, step * kGlobalBatch + comm.rank() * local, local);
        ddp.finish_gradient_sync();
        sgd.step(0.1);
      }
      Outcome outcome;
      add_state(outcome, net);
      outcomes.put(comm.size(), comm.rank(), std::move(outcome));
    }));
  }
  CHECK(outcomes.by_world_size[1][0].first_difference(outcomes.by_world_size[2][0]) != -1);
}

TEST_CASE("DeterministicDataParallel: shards, and the world sizes it refuses",
          "[train][deterministic]") {
  require_all_passed(run_thread_ranks(2, [](comm::Communicator& comm) {
    nn::Network<ShardNet> net({.seed = 5});
    train::DeterministicDataParallel ddp(net, comm, {.micro_shards = 8});
    CHECK(ddp.local_shards() == 4);
    CHECK(ddp.first_shard() == 4 * comm.rank());
    CHECK(ddp.shard_samples(32, 5) == std::pair<std::int64_t, std::int64_t>{20, 24});
    CHECK_THROWS_WITH(ddp.shard_samples(12, 0),
                      Catch::Contains("global batch of 12 in 8 micro-shards"));
    // 2 ranks: 6 shards are 3 a rank, not a power of two; 3 shards do not divide.
    for (const int shards : {6, 3, 0}) {
      INFO(shards << " micro-shards");
      nn::Network<ShardNet> other({.seed = 5});
      CHECK_THROWS_WITH(train::DeterministicDataParallel<nn::Network<ShardNet>>(
                            other, comm, {.micro_shards = shards}),
                        Catch::Contains(std::to_string(shards) + " micro-shards over 2 ranks"));
    }
    // A pass that throws leaves the buffers as before the step, and the error reaches the caller.
    net.train();
    std::vector<float> before;
    net.visit_buffers([&](const std::string&, auto& buffer) {
      using U = typename std::remove_reference_t<decltype(buffer)>::value_type;
      if constexpr (std::is_same_v<U, float>)
        before.insert(before.end(), buffer.span().begin(), buffer.span().end());
    });
    CHECK_THROWS_WITH(ddp.compute_gradients(0,
                                            [&](int shard) -> double {
                                              forward_backward(net, shard * 2, 2);
                                              throw std::runtime_error("pass failed");
                                            }),
                      "pass failed");
    std::vector<float> after;
    net.visit_buffers([&](const std::string&, auto& buffer) {
      using U = typename std::remove_reference_t<decltype(buffer)>::value_type;
      if constexpr (std::is_same_v<U, float>)
        after.insert(after.end(), buffer.span().begin(), buffer.span().end());
    });
    CHECK(after == before);
  }));
}
