// DataParallel on the world size mpiexec gives (CTest runs 1 to 3 ranks), over the MPI and TCP
// backends: the gradient-ready reports it relies on, rank 0's state at construction, gradients
// equal to one network's on the whole batch (many buckets and one), buckets launched during the
// backward pass, accumulation under no_sync(), ranks that stay bitwise identical while training,
// agreement on skipping a step, bucket assignment, and errors.
#include <catch2/catch.hpp>

#include "../comm/collective_fixtures.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/data_parallel.hpp>

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

using namespace coltrain;
using Catch::Contains;
using coltrain::testing::shared_communicator;
using comm::Backend;
using comm::Communicator;

namespace {

constexpr Backend kBackends[] = {Backend::kMpi, Backend::kTcp};

// Convolutions, ReLU, Linear, and Residuals whose shortcut or body is a single layer (reported by
// the Residual itself) or a Sequential (which reports its own). No BatchNorm, so that per-rank
// batch statistics do not matter.
using ConvNet = nn::Sequential<
    nn::Input<3, 8, 8>, nn::Named<"conv1", nn::Conv2d<4, 3, 1, 1>>, nn::ReLU,
    nn::Named<"block1",
              nn::Residual<nn::Sequential<nn::Conv2d<6, 3, 2, 1>, nn::ReLU, nn::Conv2d<6, 3, 1, 1>>,
                           nn::Conv2d<6, 1, 2, 0, false>, nn::ReLU>>,
    nn::Named<"block2",
              nn::Residual<nn::Sequential<nn::Conv2d<6, 3, 1, 1>, nn::ReLU, nn::Conv2d<6, 3, 1, 1>>,
                           nn::Sequential<nn::Conv2d<6, 1, 1, 0>>, nn::ReLU>>,
    nn::Named<"stage", nn::Sequential<nn::Conv2d<4, 3, 1, 1>, nn::ReLU>>,
    nn::Named<"block3", nn::Residual<nn::Conv2d<4, 3, 1, 1>>>, nn::Flatten,
    nn::Named<"fc", nn::Linear<5>>>;

// With BatchNorm (buffers of float and int64) and a projection shortcut.
using BatchNormNet = nn::Sequential<
    nn::Input<3, 8, 8>, nn::Named<"conv1", nn::Conv2d<4, 3, 1, 1, false>>,
    nn::Named<"bn1", nn::BatchNorm2d<>>, nn::ReLU,
    nn::Named<"block", nn::Residual<nn::Sequential<nn::Conv2d<6, 3, 2, 1, false>, nn::BatchNorm2d<>,
                                                   nn::ReLU, nn::Conv2d<6, 3, 1, 1, false>,
                                                   nn::BatchNorm2d<>>,
                                    nn::Projection<6, 2>, nn::ReLU>>,
    nn::Flatten, nn::Named<"fc", nn::Linear<5>>>;

// Parameters 0.weight [3, 4], 0.bias [3], 2.weight [2, 3], 2.bias [2].
using Mlp = nn::Sequential<nn::Input<4>, nn::Linear<3>, nn::ReLU, nn::Linear<2>>;

template <class T>
T to(double value) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    return T(static_cast<float>(value));
  else
    return static_cast<T>(value);
}

template <class T>
double to_double(T value) {
  return static_cast<double>(
      static_cast<std::conditional_t<std::is_same_v<T, double>, double, float>>(value));
}

// Samples [first, first + count) of a data set where sample i depends only on i, so that any split
// across ranks and micro-batches covers the same samples.
template <class Net>
struct Batch {
  tensor::Tensor<typename Net::value_type> inputs;
  std::vector<std::int32_t> labels;
};

template <class Net>
Batch<Net> samples(std::int64_t first, std::int64_t count) {
  using T = typename Net::value_type;
  Batch<Net> batch{tensor::Tensor<T>(Net::Input::batch(count)), {}};
  const std::int64_t size = batch.inputs.numel() / count;
  for (std::int64_t s = 0; s < count; ++s) {
    nn::Rng rng(1000 + static_cast<std::uint64_t>(first + s));
    for (std::int64_t i = 0; i < size; ++i)
      batch.inputs.data()[s * size + i] = to<T>(rng.uniform(-1.0, 1.0));
    batch.labels.push_back(static_cast<std::int32_t>((first + s) % 5 % Net::Output::kDims[0]));
  }
  return batch;
}

// Forward, softmax cross-entropy (its gradient times `scale`), backward.
template <class Net>
void forward_backward(Net& net, const Batch<Net>& batch, double scale = 1.0) {
  using T = typename Net::value_type;
  const auto logits = net.forward(batch.inputs.view());
  tensor::Tensor<T> grad(logits.shape());
  nn::SoftmaxCrossEntropy().loss_and_grad<T>(logits, batch.labels, grad.view(), scale);
  net.backward(grad.view());
}

template <class Net>
std::vector<std::vector<double>> gradients(Net& net) {
  std::vector<std::vector<double>> result;
  net.visit_parameters([&](const std::string&, auto& p) {
    result.emplace_back();
    for (auto g : p.grad.span()) result.back().push_back(to_double(g));
  });
  return result;
}

template <class Net>
std::vector<std::string> parameter_names(Net& net) {
  std::vector<std::string> names;
  net.visit_parameters([&](const std::string& name, auto&) { names.push_back(name); });
  return names;
}

// Elements further apart than `relative` of the reference (plus a floor for values that cancel to
// nearly zero), over all parameters.
std::size_t count_differences(const std::vector<std::vector<double>>& got,
                              const std::vector<std::vector<double>>& expected, double relative) {
  std::size_t wrong = got.size() == expected.size() ? 0 : 1;
  for (std::size_t p = 0; p < std::min(got.size(), expected.size()); ++p) {
    wrong += got[p].size() == expected[p].size() ? 0 : 1;
    for (std::size_t i = 0; i < std::min(got[p].size(), expected[p].size()); ++i)
      wrong += std::abs(got[p][i] - expected[p][i]) <= relative * std::abs(expected[p][i]) + 1e-12
                   ? 0
                   : 1;
  }
  return wrong;
}

// Elements of `values` that differ in any bit from rank 0's, gathered over `comm`.
template <class T>
std::size_t differences_from_rank0(Communicator& comm, const std::vector<T>& values) {
  std::vector<T> all(values.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(std::span<const T>(values), std::span<T>(all));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < all.size(); ++i)
    wrong += coltrain::testing::same_bits(all[i], all[i % values.size()]) ? 0 : 1;
  return wrong;
}

template <class Net>
std::vector<typename Net::value_type> flat_parameters(Net& net) {
  std::vector<typename Net::value_type> values;
  net.visit_parameters([&](const std::string&, auto& p) {
    values.insert(values.end(), p.value.span().begin(), p.value.span().end());
  });
  return values;
}

train::DataParallelOptions bucket_caps(std::size_t first, std::size_t later) {
  train::DataParallelOptions options;
  options.first_bucket_bytes = first;
  options.bucket_bytes = later;
  return options;
}

// Many one-parameter buckets, a few buckets of several parameters, and DDP's defaults (one bucket
// for these small models).
std::vector<train::DataParallelOptions> bucket_settings() {
  return {bucket_caps(1, 1), bucket_caps(256, 2048), train::DataParallelOptions{}};
}

}  // namespace

TEST_CASE("containers report every parameter once, when its gradient is final, last layer first",
          "[train][data_parallel][hook]") {
  using Param = nn::Parameter<double, tensor::Cpu>;
  nn::Network<ConvNet, double> net({.seed = 3});
  std::map<const void*, std::string> name_of;
  net.visit_parameters([&](const std::string& name, Param& p) { name_of[&p] = name; });

  std::vector<std::string> reported;
  std::vector<std::vector<double>> at_report;  // the gradient as it was when reported
  net.context().set_gradient_ready_hook([&](const void* parameter) {
    reported.push_back(name_of.at(parameter));
    at_report.emplace_back(static_cast<const Param*>(parameter)->grad.span().begin(),
                           static_cast<const Param*>(parameter)->grad.span().end());
  });
  forward_backward(net, samples<nn::Network<ConvNet, double>>(0, 2));

  // Layer by layer from the last; in a Residual the shortcut first (its parameters come last in
  // state_dict order), then the body.
  const std::vector<std::string> expected = {"fc.weight",
                                             "fc.bias",
                                             "block3.weight",
                                             "block3.bias",
                                             "stage.0.weight",
                                             "stage.0.bias",
                                             "block2.shortcut.0.weight",
                                             "block2.shortcut.0.bias",
                                             "block2.2.weight",
                                             "block2.2.bias",
                                             "block2.0.weight",
                                             "block2.0.bias",
                                             "block1.shortcut.weight",
                                             "block1.2.weight",
                                             "block1.2.bias",
                                             "block1.0.weight",
                                             "block1.0.bias",
                                             "conv1.weight",
                                             "conv1.bias"};
  CHECK(reported == expected);
  std::map<std::string, std::vector<double>> final_gradients;
  net.visit_parameters([&](const std::string& name, Param& p) {
    final_gradients[name].assign(p.grad.span().begin(), p.grad.span().end());
  });
  for (std::size_t i = 0; i < std::min(reported.size(), at_report.size()); ++i) {
    INFO(reported[i]);
    CHECK(at_report[i] == final_gradients[reported[i]]);
  }

  // Again on the next backward pass; and nothing without a hook.
  reported.clear();
  forward_backward(net, samples<nn::Network<ConvNet, double>>(2, 2));
  CHECK(reported == expected);
  net.context().set_gradient_ready_hook(nullptr);
  reported.clear();
  forward_backward(net, samples<nn::Network<ConvNet, double>>(0, 2));
  CHECK(reported.empty());
}

TEST_CASE("buckets hold whole parameters in reverse state_dict order, closing at their caps",
          "[train][data_parallel][buckets]") {
  const auto layout = [](const std::vector<train::GradientBucket>& buckets) {
    std::vector<std::pair<std::vector<std::size_t>, std::size_t>> result;
    for (const auto& b : buckets) result.emplace_back(b.parameters, b.bytes);
    return result;
  };
  using Layout = std::vector<std::pair<std::vector<std::size_t>, std::size_t>>;
  const std::vector<std::size_t> bytes = {48, 12, 24, 8};  // Mlp's parameters in f32

  CHECK(layout(train::assign_gradient_buckets(bytes, 16, 40)) ==
        Layout{{{3, 2}, 32}, {{1, 0}, 60}});
  CHECK(layout(train::assign_gradient_buckets(bytes, 1, 1)) ==
        Layout{{{3}, 8}, {{2}, 24}, {{1}, 12}, {{0}, 48}});
  CHECK(layout(train::assign_gradient_buckets(bytes, 8, 1000)) ==
        Layout{{{3}, 8}, {{2, 1, 0}, 84}});
  CHECK(layout(train::assign_gradient_buckets(bytes, 1 << 20, 25 << 20)) ==
        Layout{{{3, 2, 1, 0}, 92}});
  // A parameter above the cap gets a bucket of its own; an exact fit closes the bucket.
  CHECK(layout(train::assign_gradient_buckets(std::vector<std::size_t>{10, 100, 10}, 10, 50)) ==
        Layout{{{2}, 10}, {{1}, 100}, {{0}, 10}});
  CHECK(train::assign_gradient_buckets(std::vector<std::size_t>{}, 1, 1).empty());

  for (Backend backend : kBackends) {
    INFO(comm::name_of(backend));
    Communicator& comm = shared_communicator(backend);
    {
      nn::Network<Mlp> net;
      train::DataParallel ddp(net, comm, bucket_caps(16, 40));
      CHECK(layout(ddp.buckets()) == Layout{{{3, 2}, 32}, {{1, 0}, 60}});
    }
    {
      // 16-bit gradients travel as f32: the same bytes, so the same buckets.
      nn::Network<Mlp, half> net;
      train::DataParallel ddp(net, comm, bucket_caps(16, 40));
      CHECK(layout(ddp.buckets()) == Layout{{{3, 2}, 32}, {{1, 0}, 60}});
    }
    {
      nn::Network<ConvNet, double> net;
      train::DataParallel defaults(net, comm);
      REQUIRE(defaults.buckets().size() == 1);
      std::vector<std::size_t> reversed(parameter_names(net).size());
      for (std::size_t i = 0; i < reversed.size(); ++i) reversed[i] = reversed.size() - 1 - i;
      CHECK(defaults.buckets()[0].parameters == reversed);
      CHECK(defaults.buckets()[0].bytes == nn::Network<ConvNet, double>::kParameterCount * 8);
    }
  }
}

TEST_CASE("construction gives every rank rank 0's parameters and buffers",
          "[train][data_parallel][broadcast]") {
  using Net = nn::Network<BatchNormNet>;
  for (Backend backend : kBackends) {
    INFO(comm::name_of(backend));
    Communicator& comm = shared_communicator(backend);
    // Each rank starts from its own seed and its own buffer values.
    const auto distinct_buffers = [](Net& net, int rank) {
      net.visit_buffers([rank](const std::string&, auto& buffer) {
        using U = typename std::remove_reference_t<decltype(buffer)>::value_type;
        for (std::size_t i = 0; i < buffer.span().size(); ++i)
          buffer.span()[i] = static_cast<U>(10 * rank + static_cast<int>(i) + 1);
      });
    };
    Net net({.seed = 100 + static_cast<std::uint64_t>(comm.rank())});
    distinct_buffers(net, comm.rank());
    train::DataParallel ddp(net, comm);

    Net expected({.seed = 100});
    distinct_buffers(expected, 0);
    CHECK(flat_parameters(net) == flat_parameters(expected));
    std::vector<std::string> got_buffers, expected_buffers;
    const auto print = [](std::vector<std::string>& out) {
      return [&out](const std::string& name, auto& buffer) {
        std::string text = name + ":";
        for (auto v : buffer.span()) text += " " + std::to_string(v);
        out.push_back(text);
      };
    };
    net.visit_buffers(print(got_buffers));
    expected.visit_buffers(print(expected_buffers));
    CHECK(got_buffers.size() == 12);  // four BatchNorms
    CHECK(got_buffers == expected_buffers);
  }
}

TEST_CASE(
    "one step on R ranks gives the gradients of one network on the whole batch, with the "
    "buckets launched during the backward pass",
    "[train][data_parallel][gradients]") {
  using Net = nn::Network<ConvNet, double>;
  constexpr std::int64_t kGlobalBatch = 6;  // divisible by 1, 2 and 3 ranks
  Net reference({.seed = 7});
  forward_backward(reference, samples<Net>(0, kGlobalBatch));
  const auto expected = gradients(reference);

  for (Backend backend : kBackends) {
    Communicator& comm = shared_communicator(backend);
    const std::int64_t share = kGlobalBatch / comm.size();
    for (const train::DataParallelOptions& options : bucket_settings()) {
      INFO(comm::name_of(backend) << ", buckets of " << options.first_bucket_bytes << " then "
                                  << options.bucket_bytes << " bytes");
      Net net({.seed = 7 + static_cast<std::uint64_t>(comm.rank())});
      train::DataParallel ddp(net, comm, options);
      for (int step = 0; step < 2; ++step) {  // the per-step state resets
        net.zero_grad();
        forward_backward(net, samples<Net>(comm.rank() * share, share));
        CHECK(ddp.finish_gradient_sync() >= 0.0);
        CHECK(count_differences(gradients(net), expected, 1e-6) == 0);
        const train::GradientSyncStats& stats = ddp.last_sync();
        CHECK(stats.buckets == ddp.buckets().size());
        CHECK(stats.launched_during_backward == ddp.buckets().size() - 1);  // the last: by the caller
        CHECK(stats.reduced_before_wait <= stats.buckets);
      }
      if (options.bucket_bytes == 1) CHECK(ddp.buckets().size() == parameter_names(net).size());
    }
  }
}

TEMPLATE_TEST_CASE("16-bit gradients are the ranks' average taken in f32 and rounded once",
                   "[train][data_parallel][precision]", half, bfloat16) {
  using Net = nn::Network<Mlp, TestType>;
  for (Backend backend : kBackends) {
    INFO(comm::name_of(backend));
    Communicator& comm = shared_communicator(backend);
    const int ranks = comm.size();
    // This rank's local gradients, from a network that starts where DataParallel puts every rank.
    Net local({.seed = 9});
    forward_backward(local, samples<Net>(4 * comm.rank(), 4));
    std::vector<float> mine;
    for (const auto& g : gradients(local)) mine.insert(mine.end(), g.begin(), g.end());
    std::vector<float> all(mine.size() * static_cast<std::size_t>(ranks));
    comm.allgather(std::span<const float>(mine), std::span<float>(all));

    Net net({.seed = 9 + static_cast<std::uint64_t>(comm.rank())});
    train::DataParallel ddp(net, comm, bucket_caps(1, 16));
    forward_backward(net, samples<Net>(4 * comm.rank(), 4));
    ddp.finish_gradient_sync();
    std::vector<double> got;
    for (const auto& g : gradients(net)) got.insert(got.end(), g.begin(), g.end());
    REQUIRE(got.size() == mine.size());
    // The sum of a few 16-bit values is exact in double; f32 may round it (values far apart in
    // magnitude), which moves the result by at most one 16-bit step.
    const double step = std::is_same_v<TestType, half> ? 0x1p-10 : 0x1p-7;
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      double sum = 0;
      for (int r = 0; r < ranks; ++r) sum += all[static_cast<std::size_t>(r) * mine.size() + i];
      const double expected = to_double(to<TestType>(static_cast<float>(sum / ranks)));
      wrong += std::abs(got[i] - expected) <= step * std::abs(expected) ? 0 : 1;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE(
    "wire-compressed gradients are the same on every rank and within a 16-bit step of the "
    "average",
    "[train][data_parallel][compression]") {
  using Net = nn::Network<Mlp, float>;
  for (Backend backend : kBackends) {
    for (comm::WireCompression wire :
         {comm::WireCompression::kBFloat16, comm::WireCompression::kFloat16}) {
      INFO(comm::name_of(backend) << ", " << comm::name_of(wire));
      Communicator& comm = shared_communicator(backend);
      Net plain({.seed = 5 + static_cast<std::uint64_t>(comm.rank())});
      Net compressed({.seed = 5 + static_cast<std::uint64_t>(comm.rank())});
      train::DataParallelOptions options = bucket_caps(256, 2048);
      train::DataParallel plain_ddp(plain, comm, options);
      options.compression = wire;
      train::DataParallel compressed_ddp(compressed, comm, options);
      forward_backward(plain, samples<Net>(4 * comm.rank(), 4));
      plain_ddp.finish_gradient_sync();
      forward_backward(compressed, samples<Net>(4 * comm.rank(), 4));
      compressed_ddp.finish_gradient_sync();
      std::vector<float> flat;
      for (const auto& g : gradients(compressed))
        for (double v : g) flat.push_back(static_cast<float>(v));
      CHECK(differences_from_rank0(comm, flat) == 0);
      // Each rank's gradient is rounded once, and so is the average: within a 16-bit step of the
      // ranks' mean magnitude plus one of the average's, and in f16 a few subnormal steps (2^-24).
      Net local({.seed = 5});  // where DataParallel put every rank: rank 0's weights
      forward_backward(local, samples<Net>(4 * comm.rank(), 4));
      std::vector<float> magnitudes;
      for (const auto& g : gradients(local))
        for (double v : g) magnitudes.push_back(static_cast<float>(std::abs(v)));
      comm.allreduce(std::span(magnitudes), comm::ReduceOp::kAvg);
      const bool f16 = wire == comm::WireCompression::kFloat16;
      const double step = f16 ? 0x1p-10 : 0x1p-7;
      const double subnormal_steps = f16 ? 4 * 0x1p-24 : 0.0;
      const auto expected = gradients(plain);
      const auto got = gradients(compressed);
      std::size_t wrong = 0;
      std::size_t at = 0;
      for (std::size_t p = 0; p < expected.size(); ++p) {
        for (std::size_t i = 0; i < expected[p].size(); ++i, ++at) {
          const double bound = step * (magnitudes[at] + std::abs(expected[p][i])) + subnormal_steps;
          wrong += std::abs(got[p][i] - expected[p][i]) <= bound ? 0 : 1;
        }
      }
      CHECK(wrong == 0);
    }
  }
  nn::Network<Mlp, double> wide({.seed = 1});
  train::DataParallelOptions options;
  options.compression = comm::WireCompression::kBFloat16;
  CHECK_THROWS_AS(train::DataParallel(wide, shared_communicator(kBackends[0]), options),
                  InvalidArgument);
}

TEST_CASE("two micro-batches under no_sync and a synchronised one equal one step on all of them",
          "[train][data_parallel][no_sync]") {
  using Net = nn::Network<ConvNet, double>;
  constexpr std::int64_t kMicro = 2;
  constexpr int kMicroBatches = 3;
  for (Backend backend : kBackends) {
    INFO(comm::name_of(backend));
    Communicator& comm = shared_communicator(backend);
    const int ranks = comm.size();
    Net reference({.seed = 11});
    forward_backward(reference, samples<Net>(0, kMicro * kMicroBatches * ranks));

    Net net({.seed = 11 + static_cast<std::uint64_t>(comm.rank())});
    train::DataParallel ddp(net, comm, bucket_caps(1, 1024));
    const auto micro_batch = [&](int k) {
      return samples<Net>((k * ranks + comm.rank()) * kMicro, kMicro);
    };
    Net local({.seed = 11});  // this rank's micro-batches alone, from the same parameters
    {
      const auto scope = ddp.no_sync();
      for (int k = 0; k + 1 < kMicroBatches; ++k) {
        forward_backward(net, micro_batch(k), 1.0 / kMicroBatches);
        forward_backward(local, micro_batch(k), 1.0 / kMicroBatches);
      }
      CHECK(ddp.finish_gradient_sync() == 0.0);  // nothing to wait for
      ddp.barrier();  // allowed: no step is in flight, so nothing was launched
      CHECK(gradients(net) == gradients(local));  // not reduced
    }
    forward_backward(net, micro_batch(kMicroBatches - 1), 1.0 / kMicroBatches);
    ddp.finish_gradient_sync();
    CHECK(ddp.last_sync().launched_during_backward == ddp.buckets().size() - 1);
    CHECK(count_differences(gradients(net), gradients(reference), 1e-6) == 0);
  }
}

TEMPLATE_TEST_CASE("SGD steps keep every rank's parameters bitwise identical",
                   "[train][data_parallel][training]", optim::Fp32, optim::MixedFp16) {
  using T = typename TestType::Storage;
  using Net = nn::Network<BatchNormNet, T>;
  for (Backend backend : kBackends) {
    for (const std::size_t cap : {std::size_t{512}, std::size_t{25} << 20}) {
      INFO(comm::name_of(backend) << ", " << cap << "-byte buckets");
      Communicator& comm = shared_communicator(backend);
      Net net({.seed = 21 + static_cast<std::uint64_t>(comm.rank())});
      train::DataParallel ddp(net, comm, bucket_caps(1, cap));
      const auto params = optim::parameters_of(net);
      // A loss scale low enough that these gradients never overflow fp16: every step is taken.
      optim::PrecisionOptimizer<TestType, optim::Sgd> sgd(
          params, optim::Sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4}),
          {.init_scale = 256.0f});
      for (int step = 0; step < 3; ++step) {
        net.zero_grad();
        // Different data on every rank, so the local gradients differ.
        forward_backward(net, samples<Net>(10 * step + 3 * comm.rank(), 3), sgd.loss_scale());
        ddp.finish_gradient_sync();
        const bool finite = ddp.all_finite(sgd.unscale_and_check());
        CHECK(sgd.apply(finite, 0.1));
        CHECK(differences_from_rank0(comm, flat_parameters(net)) == 0);
      }
    }
  }
}

TEST_CASE("all ranks skip a mixed-precision step when one rank's gradients are not finite",
          "[train][data_parallel][precision]") {
  using Net = nn::Network<Mlp, half>;
  for (Backend backend : kBackends) {
    INFO(comm::name_of(backend));
    Communicator& comm = shared_communicator(backend);
    const bool last = comm.rank() == comm.size() - 1;
    Net net({.seed = 5});
    train::DataParallel ddp(net, comm);
    CHECK(ddp.all_finite(true));
    CHECK_FALSE(ddp.all_finite(!last));

    const auto params = optim::parameters_of(net);
    optim::PrecisionOptimizer<optim::MixedFp16, optim::Sgd> sgd(params, optim::Sgd({.lr = 0.1}),
                                                                {.init_scale = 1024.0f});
    const std::vector<half> before = flat_parameters(net);
    net.zero_grad();
    forward_backward(net, samples<Net>(comm.rank(), 2), sgd.loss_scale());
    ddp.finish_gradient_sync();
    // An overflow that only the last rank sees (after the reduction, as a local fault would be).
    if (last) params[0].grad[0] = half(std::numeric_limits<float>::infinity());
    const bool local = sgd.unscale_and_check();
    CHECK(local == !last);
    const bool finite = ddp.all_finite(local);
    CHECK_FALSE(finite);
    CHECK_FALSE(sgd.apply(finite, 0.1));
    CHECK(sgd.loss_scale() == 512.0f);  // every rank backed off
    CHECK(differences_from_rank0(comm, flat_parameters(net)) == 0);
    CHECK(flat_parameters(net) == before);
  }
}

TEST_CASE("the local finite check agrees on every rank where averaged gradients are identical",
          "[train][data_parallel][precision]") {
  using Net = nn::Network<Mlp, half>;
  for (Backend backend : kBackends) {
    INFO(comm::name_of(backend));
    Communicator& comm = shared_communicator(backend);
    const bool last = comm.rank() == comm.size() - 1;
    Net net({.seed = 5});
    {
      train::DataParallelOptions native;
      native.algorithm = comm::Algorithm::kNative;
      train::DataParallelOptions zero;
      zero.zero_stage = 1;
      if (backend == Backend::kMpi) {
        train::DataParallel ddp(net, comm, native);
        CHECK_FALSE(ddp.gradients_identical_on_every_rank());  // MPI_Allreduce promises no such
      }
      train::DataParallel sharded(net, comm, zero);
      CHECK_FALSE(sharded.gradients_identical_on_every_rank());  // each rank holds its shard
    }
    // The TCP backend has only coltrain's algorithms; on MPI, automatic may pick MPI_Allreduce.
    train::DataParallelOptions ring = bucket_caps(256, 2048);
    ring.algorithm = comm::Algorithm::kRing;
    std::vector<train::DataParallelOptions> identical{ring};
    if (backend == Backend::kTcp) identical.emplace_back();
    for (const train::DataParallelOptions& options : identical) {
      train::DataParallel ddp(net, comm, options);
      REQUIRE(ddp.gradients_identical_on_every_rank());
      const auto params = optim::parameters_of(net);
      optim::PrecisionOptimizer<optim::MixedFp16, optim::Sgd> sgd(
          params, optim::Sgd({.lr = 0.1}), {.init_scale = 1024.0f});
      const std::vector<half> before = flat_parameters(net);
      net.zero_grad();
      forward_backward(net, samples<Net>(comm.rank(), 2), sgd.loss_scale());
      // An overflow in the last rank's own gradients, before the reduction: the average carries it
      // to every rank, so every rank's local check fails and the step is skipped everywhere.
      if (last) params[0].grad[0] = half(std::numeric_limits<float>::infinity());
      ddp.finish_gradient_sync();
      std::vector<double> averaged;
      for (const auto& g : gradients(net)) averaged.insert(averaged.end(), g.begin(), g.end());
      CHECK(differences_from_rank0(comm, averaged) == 0);
      const bool local = sgd.unscale_and_check();
      CHECK_FALSE(local);
      CHECK_FALSE(sgd.apply(local, 0.1));
      CHECK(flat_parameters(net) == before);
    }
  }
}

TEST_CASE("misuse mid-step is an error, and destruction mid-step leaves the communicator usable",
          "[train][data_parallel][errors]") {
  using Net = nn::Network<ConvNet, double>;
  for (Backend backend : kBackends) {
    INFO(comm::name_of(backend));
    Communicator& comm = shared_communicator(backend);
    Net net({.seed = 1});
    {
      train::DataParallel ddp(net, comm, bucket_caps(1, 1));
      CHECK_THROWS_AS(train::DataParallel(net, comm), InvalidArgument);  // one hook per network
      forward_backward(net, samples<Net>(comm.rank(), 1));
      CHECK_THROWS_WITH(ddp.all_finite(true), Contains("finish_gradient_sync() first"));
      CHECK_THROWS_AS(ddp.no_sync(), InvalidArgument);
      // What a second backward pass in the same synchronised step would report first. (Not a real
      // backward pass: it would add to gradients whose buckets are already in flight.)
      const void* fc_weight = nullptr;
      net.visit_parameters([&](const std::string& name, auto& p) {
        if (name == "fc.weight") fc_weight = &p;
      });
      CHECK_THROWS_WITH(net.context().gradient_ready_hook()(fc_weight),
                        Contains("'fc.weight' was reported twice"));
      ddp.finish_gradient_sync();
      CHECK(ddp.all_finite(true));

      // Destroyed with every bucket issued and none waited for.
      forward_backward(net, samples<Net>(comm.rank(), 1));
    }
    comm.barrier();
    train::DataParallel again(net, comm);
    net.zero_grad();
    forward_backward(net, samples<Net>(comm.rank(), 1));
    again.finish_gradient_sync();
    CHECK(again.last_sync().buckets == 1);
  }
}

TEST_CASE(
    "ranks with different buckets fail at construction; a communication error reaches the "
    "next wait",
    "[train][data_parallel][errors]") {
  if (coltrain::testing::world_size() < 2) return;  // nothing to disagree with
  using Net = nn::Network<Mlp>;
  comm::CommOptions options;
  options.timeout = std::chrono::seconds(4);
  {
    Communicator comm = coltrain::testing::make_communicator(Backend::kTcp, options);
    Net net;
    CHECK_THROWS_WITH(train::DataParallel(net, comm, bucket_caps(comm.rank() == 0 ? 1 : 1000, 1)),
                      Contains("ranks built different gradient buckets"));
  }
  {
    std::optional<Communicator> comm = coltrain::testing::make_communicator(Backend::kTcp, options);
    Net net;
    std::optional<train::DataParallel<Net>> ddp(std::in_place, net, *comm);
    if (comm->rank() == 0) {
      // Rank 0 steps alone: the others leave, so its allreduce loses its peers.
      forward_backward(net, samples<Net>(0, 2));
      MPI_Barrier(MPI_COMM_WORLD);
      try {
        ddp->finish_gradient_sync();
        FAIL("finish_gradient_sync() did not report the failed allreduce");
      } catch (const CommError& e) {
        CHECK_THAT(e.message(), Contains("gradient bucket 0 of 1"));
        CHECK(e.context().rank == 0);
      }
      CHECK_THROWS_WITH(ddp->barrier(), Contains("unusable"));
    } else {
      MPI_Barrier(MPI_COMM_WORLD);
      ddp.reset();
      comm.reset();
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
