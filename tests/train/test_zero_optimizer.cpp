// ZeRO-1 (train/zero_optimizer.hpp) on the world size mpiexec gives (CTest runs 1 to 3 ranks), over
// the MPI and TCP backends: 100 steps equal the unsharded optimizer's (SGD with momentum, Adam,
// AdamW), the shards partition the optimizer state, the gathered state equals the unsharded one's,
// a full snapshot resumes into a sharded optimizer (another world size), mixed precision keeps the
// ranks identical, and errors.
#include <catch2/catch.hpp>

#include "../comm/collective_fixtures.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/arena_shards.hpp>
#include <coltrain/train/data_parallel.hpp>
#include <coltrain/train/zero_optimizer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

using namespace coltrain;
using Catch::Contains;
using coltrain::testing::shared_communicator;
using comm::Backend;
using comm::Communicator;

namespace {

constexpr Backend kBackends[] = {Backend::kMpi, Backend::kTcp};

// Parameters of 5 x 3 x 3 x 3, 5, 7 x 20, 7, 3 x 7 and 3 elements (311): each padded to a multiple
// of 16 floats, the arena holds 368 elements, which 3 and 5 ranks do not divide (a tail) and 2
// does.
using Net = nn::Sequential<nn::Input<3, 5, 5>, nn::Named<"conv", nn::Conv2d<5, 3, 1, 1>>, nn::ReLU,
                           nn::MaxPool2d<2>, nn::Flatten, nn::Named<"fc1", nn::Linear<7>>, nn::ReLU,
                           nn::Named<"fc2", nn::Linear<3>>>;

template <class T>
struct Batch {
  tensor::Tensor<T> inputs;
  std::vector<std::int32_t> labels;
};

// Samples [first, first + count), each a function of its index only.
template <class T>
Batch<T> samples(std::int64_t first, std::int64_t count) {
  Batch<T> batch{tensor::Tensor<T>(tensor::Shape{count, 3, 5, 5}), {}};
  const std::int64_t size = 75;
  for (std::int64_t s = 0; s < count; ++s) {
    nn::Rng rng(500 + static_cast<std::uint64_t>(first + s));
    for (std::int64_t i = 0; i < size; ++i)
      batch.inputs.data()[s * size + i] = T(static_cast<float>(rng.uniform(-1.0, 1.0)));
    batch.labels.push_back(static_cast<std::int32_t>((first + s) % 3));
  }
  return batch;
}

// After ZeRO-1's reduce-scatter, every rank's shard of the averaged gradients to every rank: the
// gradients an unsharded optimizer gets from the same reduction.
template <class Network>
void allgather_gradients(train::DataParallel<Network>& ddp) {
  auto& arena = ddp.network().parameter_arena();
  const train::ArenaShards shards = ddp.shards();
  const std::span<typename Network::value_type> gradients(arena.gradients(), arena.size());
  if (ddp.world_size() > 1) ddp.communicator().allgather(gradients.first(shards.even_end()));
}

template <class O>
inline constexpr bool kIsZero = false;
template <class N, class P, class O>
inline constexpr bool kIsZero<train::ZeroOptimizer<N, P, O>> = true;

template <class Network, class Optimizer>
void train_steps(Network& net, train::DataParallel<Network>& ddp, Optimizer& optimizer, int first,
                 int steps) {
  using T = typename Network::value_type;
  constexpr std::int64_t kBatch = 4;
  for (int step = first; step < first + steps; ++step) {
    const Batch<T> batch = samples<T>((step * ddp.world_size() + ddp.rank()) * kBatch, kBatch);
    net.zero_grad();
    const auto logits = net.forward(batch.inputs.view());
    tensor::Tensor<T> grad(logits.shape());
    nn::SoftmaxCrossEntropy().loss_and_grad<T>(logits, batch.labels, grad.view(),
                                               optimizer.loss_scale());
    net.backward(grad.view());
    ddp.finish_gradient_sync();
    if (ddp.options().zero_stage == 1 && !kIsZero<Optimizer>) allgather_gradients(ddp);
    optimizer.apply(ddp.all_finite(optimizer.unscale_and_check()), 0.05);
  }
}

template <class Network>
std::vector<double> flat_values(Network& net) {
  std::vector<double> values;
  net.visit_parameters([&](const std::string&, auto& p) {
    for (auto v : p.value.span()) values.push_back(static_cast<double>(static_cast<float>(v)));
  });
  return values;
}

// Elements further apart than `absolute`.
std::size_t differences(const std::vector<double>& got, const std::vector<double>& expected,
                        double absolute) {
  double worst = 0;
  for (std::size_t i = 0; i < std::min(got.size(), expected.size()); ++i)
    worst = std::max(worst, std::abs(got[i] - expected[i]));
  UNSCOPED_INFO("largest difference " << worst);
  std::size_t wrong = got.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < std::min(got.size(), expected.size()); ++i)
    wrong += std::abs(got[i] - expected[i]) <= absolute ? 0 : 1;
  return wrong;
}

// Every state tensor of `got` against the one of the same name in `expected`.
void check_same_snapshot(const optim::OptimizerSnapshot& got,
                         const optim::OptimizerSnapshot& expected, double tolerance) {
  REQUIRE(got.state.size() == expected.state.size());
  for (std::size_t i = 0; i < got.state.size(); ++i) {
    INFO(expected.state[i].name);
    CHECK(got.state[i].name == expected.state[i].name);
    const std::vector<double> a(got.state[i].values.begin(), got.state[i].values.end());
    const std::vector<double> b(expected.state[i].values.begin(), expected.state[i].values.end());
    CHECK(differences(a, b, tolerance) == 0);
  }
  CHECK(got.step_counts == expected.step_counts);
  CHECK(got.masters.size() == expected.masters.size());
}

using Sgd = optim::Sgd;
using Adam = optim::Adam;
using AdamW = optim::AdamW;

template <class O>
O make_optimizer();
template <>
Sgd make_optimizer<Sgd>() {
  return Sgd({.momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
}
template <>
Adam make_optimizer<Adam>() {
  return Adam({.weight_decay = 1e-3});
}
template <>
AdamW make_optimizer<AdamW>() {
  return AdamW(AdamW::Options{});
}

}  // namespace

TEST_CASE("ZeRO shards: contiguous, the last rank holds the tail, together the whole arena",
          "[train][zero]") {
  for (const std::size_t elements : {0, 1, 5, 368, 369, 1000}) {
    for (const int ranks : {1, 2, 3, 5, 8}) {
      INFO(elements << " elements, " << ranks << " ranks");
      const train::ArenaShards shards(elements, ranks);
      std::size_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const auto [first, end] = shards.owned(r);
        CHECK(first == next);
        CHECK(end >= first);
        next = end;
      }
      CHECK(next == elements);
      CHECK(shards.tail() < static_cast<std::size_t>(ranks));
      CHECK(shards.even_end() + shards.tail() == elements);
    }
  }
  CHECK_THROWS_AS(train::ArenaShards(10, 0), InvalidArgument);
}

// Two references. An unsharded optimizer given the same averaged gradients (reduce-scatter, then
// allgather) must match bit for bit: the sharding itself changes nothing. One behind the default
// DataParallel (bucketed allreduces) sums each element's ranks in another order: on 1 and 2 ranks
// that is the same sum, on 3 the last bits differ, and 100 steps of Adam, whose update divides by
// the gradients' own scale, carry that to about 2e-6.
TEMPLATE_TEST_CASE("ZeRO-1: 100 steps equal the unsharded optimizer's, and so does its state",
                   "[train][zero]", Sgd, Adam, AdamW) {
  for (Backend backend : kBackends) {
    INFO(comm::name_of(backend));
    Communicator& comm = shared_communicator(backend);
    nn::Network<Net> same_sums_net({.seed = 3});
    train::DataParallel same_sums_ddp(same_sums_net, comm, {.zero_stage = 1});
    optim::PrecisionOptimizer<optim::Fp32, TestType> same_sums(optim::parameters_of(same_sums_net),
                                                               make_optimizer<TestType>());

    nn::Network<Net> replicated_net({.seed = 3});
    train::DataParallel replicated_ddp(replicated_net, comm);
    optim::PrecisionOptimizer<optim::Fp32, TestType> replicated(
        optim::parameters_of(replicated_net), make_optimizer<TestType>());

    nn::Network<Net> sharded_net({.seed = 3});
    train::DataParallel sharded_ddp(sharded_net, comm, {.zero_stage = 1});
    train::ZeroOptimizer<nn::Network<Net>, optim::Fp32, TestType> sharded(
        sharded_ddp, make_optimizer<TestType>());

    train_steps(same_sums_net, same_sums_ddp, same_sums, 0, 100);
    train_steps(replicated_net, replicated_ddp, replicated, 0, 100);
    train_steps(sharded_net, sharded_ddp, sharded, 0, 100);
    CHECK(flat_values(sharded_net) == flat_values(same_sums_net));
    check_same_snapshot(sharded.export_state(), same_sums.export_state(), 0.0);
    const double tolerance = comm.size() <= 2 ? 0.0 : 1e-5;
    CHECK(differences(flat_values(sharded_net), flat_values(replicated_net), tolerance) == 0);

    // The shards partition the state: together exactly the replicated bytes, each about 1/p.
    std::size_t replicated_bytes = 0;
    replicated.optimizer().for_each_state(
        [&](const std::string&, std::span<const float> v) { replicated_bytes += v.size_bytes(); });
    std::vector<std::int64_t> bytes = {static_cast<std::int64_t>(sharded.state_bytes())};
    std::int64_t most = bytes[0];
    comm.allreduce(std::span(bytes), comm::ReduceOp::kSum);
    comm.allreduce(std::span(&most, 1), comm::ReduceOp::kMax);
    CHECK(bytes[0] == static_cast<std::int64_t>(replicated_bytes));
    // A shard boundary falls inside the padding, so a rank may hold up to a parameter's padding
    // (16 floats per kind of state) less or more than 1/p of the arena.
    const double arena_share = static_cast<double>(sharded_net.parameter_arena().size()) /
                               comm.size() * static_cast<double>(replicated_bytes) /
                               static_cast<double>(nn::Network<Net>::kParameterCount);
    CHECK(static_cast<double>(most) <= arena_share + 2 * 16 * 4);
  }
}

TEST_CASE("ZeRO-1: a full snapshot of the unsharded optimizer resumes sharded, at any world size",
          "[train][zero]") {
  for (Backend backend : kBackends) {
    INFO(comm::name_of(backend));
    Communicator& comm = shared_communicator(backend);
    nn::Network<Net> net({.seed = 5});
    train::DataParallel ddp(net, comm);
    optim::PrecisionOptimizer<optim::Fp32, Adam> adam(optim::parameters_of(net),
                                                      make_optimizer<Adam>());
    train_steps(net, ddp, adam, 0, 30);

    // A checkpoint's content: the values and the full state, into a fresh sharded run.
    nn::Network<Net> resumed_net({.seed = 99});
    std::vector<std::vector<float>> values;
    net.visit_parameters([&](const std::string&, auto& p) {
      values.emplace_back(p.value.span().begin(), p.value.span().end());
    });
    std::size_t k = 0;
    resumed_net.visit_parameters([&](const std::string&, auto& p) {
      std::ranges::copy(values[k++], p.value.span().begin());
    });
    train::DataParallel resumed_ddp(resumed_net, comm, {.zero_stage = 1});
    train::ZeroOptimizer<nn::Network<Net>, optim::Fp32, Adam> resumed(resumed_ddp,
                                                                      make_optimizer<Adam>());
    resumed.import_state(adam.export_state());
    check_same_snapshot(resumed.export_state(), adam.export_state(), 0.0);

    // Both go on; the sums' order differs on 3 ranks (see above).
    train_steps(net, ddp, adam, 30, 30);
    train_steps(resumed_net, resumed_ddp, resumed, 30, 30);
    const double tolerance = comm.size() <= 2 ? 0.0 : 1e-5;
    CHECK(differences(flat_values(resumed_net), flat_values(net), tolerance) == 0);
  }
}

TEST_CASE("ZeRO-1 in mixed precision: ranks stay identical, masters gathered, scale agreed",
          "[train][zero]") {
  Communicator& comm = shared_communicator(Backend::kTcp);
  using HalfNet = nn::Network<Net, half>;
  HalfNet net({.seed = 7});
  train::DataParallel ddp(net, comm, {.zero_stage = 1});
  train::ZeroOptimizer<HalfNet, optim::MixedFp16, Sgd> sgd(ddp, make_optimizer<Sgd>());
  train_steps(net, ddp, sgd, 0, 20);

  std::vector<float> values;
  for (double v : flat_values(net)) values.push_back(static_cast<float>(v));
  std::vector<float> all(values.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(std::span<const float>(values), std::span<float>(all));
  for (std::size_t i = 0; i < all.size(); ++i) REQUIRE(all[i] == values[i % values.size()]);

  const optim::OptimizerSnapshot state = sgd.export_state();
  REQUIRE(state.masters.size() == 6);
  std::size_t k = 0;
  std::size_t wrong = 0;
  net.visit_parameters([&](const std::string& name, auto& p) {
    CHECK(state.masters[k].name == name);
    REQUIRE(state.masters[k].values.size() == p.value.span().size());
    for (std::size_t i = 0; i < p.value.span().size(); ++i)
      wrong += static_cast<float>(half(state.masters[k].values[i])) ==
                       static_cast<float>(p.value.span()[i])
                   ? 0
                   : 1;
    ++k;
  });
  CHECK(wrong == 0);  // the values are the rounded masters
  REQUIRE(state.loss_scale);
  float scale = sgd.loss_scale();
  float lowest = scale;
  comm.allreduce(std::span(&lowest, 1), comm::ReduceOp::kMin);
  CHECK(lowest == scale);
}

TEST_CASE("ZeRO-1: errors name what is wrong", "[train][zero][errors]") {
  Communicator& comm = shared_communicator(Backend::kTcp);
  nn::Network<Net> net({.seed = 1});
  {
    train::DataParallel plain(net, comm);
    using Zero = train::ZeroOptimizer<nn::Network<Net>, optim::Fp32, Adam>;
    CHECK_THROWS_WITH(Zero(plain, make_optimizer<Adam>()), Contains("zero_stage = 1"));
  }
  CHECK_THROWS_WITH(train::DataParallel(net, comm, {.zero_stage = 2}), Contains("ZeRO stage 2"));
  train::DataParallel ddp(net, comm, {.zero_stage = 1});
  train::ZeroOptimizer<nn::Network<Net>, optim::Fp32, Adam> adam(ddp, make_optimizer<Adam>());
  train_steps(net, ddp, adam, 0, 2);
  optim::OptimizerSnapshot state = adam.export_state();
  optim::OptimizerSnapshot short_tensor = state;
  short_tensor.state[0].values.pop_back();
  CHECK_THROWS_WITH(adam.import_state(short_tensor),
                    Contains("'" + state.state[0].name + "' has") && Contains("elements"));
  optim::OptimizerSnapshot stranger = state;
  stranger.state[0].name = "nothing.exp_avg";
  CHECK_THROWS_WITH(adam.import_state(stranger), Contains("'nothing.exp_avg'"));
  optim::OptimizerSnapshot momentum = state;
  momentum.state[0].name = "fc2.bias.momentum_buffer";
  CHECK_THROWS_WITH(adam.import_state(momentum), Contains("does not keep"));
  // Nothing changed: the exported state is the same as before the failed imports.
  check_same_snapshot(adam.export_state(), state, 0.0);
}
