// DataParallel::average_buffers and the trainer's use of it, on 1 to 3 TCP ranks run as threads:
// BatchNorm running statistics become the ranks' average (exactly, for values whose sums are exact
// in any order), num_batches_tracked is checked and left alone, one rank changes nothing, and the
// trainer evaluates and checkpoints the averaged statistics, so that every rank ends with them and
// a resumed run ends where an uninterrupted one does, buffers included.
#include <catch2/catch.hpp>

#include "../support/quadrant_images.hpp"
#include "../support/temp_dir.hpp"
#include "../support/thread_ranks.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/data.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/data_parallel.hpp>
#include <coltrain/train/state_dict.hpp>
#include <coltrain/train/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

using namespace coltrain;
using coltrain::testing::expect;
using coltrain::testing::joined;
using coltrain::testing::run_thread_ranks;

namespace {

// Four BatchNorms (float buffers and an int64 count each), one inside a residual block.
using BatchNormNet = nn::Sequential<
    nn::Input<3, 8, 8>, nn::Named<"conv1", nn::Conv2d<4, 3, 1, 1, false>>,
    nn::Named<"bn1", nn::BatchNorm2d<>>, nn::ReLU,
    nn::Named<"block", nn::Residual<nn::Sequential<nn::Conv2d<6, 3, 2, 1, false>, nn::BatchNorm2d<>,
                                                   nn::ReLU, nn::Conv2d<6, 3, 1, 1, false>,
                                                   nn::BatchNorm2d<>>,
                                    nn::Projection<6, 2>, nn::ReLU>>,
    nn::Flatten, nn::Named<"fc", nn::Linear<5>>>;

// A training-mode forward pass on `count` samples drawn from `seed` (shifted by it, so that
// different seeds give different statistics): it moves the running statistics towards this
// data's and counts one batch.
template <class Net>
void forward_on(Net& net, std::uint64_t seed, std::int64_t count = 4) {
  using T = typename Net::value_type;
  tensor::Tensor<T> inputs(Net::Input::batch(count));
  nn::Rng rng(seed);
  const double shift = 0.1 * static_cast<double>(seed % 11);
  for (T& x : inputs.span()) x = T(static_cast<float>(rng.uniform(-1.0, 1.0) + shift));
  net.train();
  net.forward(inputs.view());
}

// Every buffer of one element type, flattened in state_dict order.
template <class U, class Net>
std::vector<U> buffers_of(Net& net) {
  std::vector<U> values;
  net.visit_buffers([&](const std::string&, auto& buffer) {
    using B = typename std::remove_reference_t<decltype(buffer)>::value_type;
    if constexpr (std::is_same_v<B, U>)
      values.insert(values.end(), buffer.span().begin(), buffer.span().end());
  });
  return values;
}

// Every rank's `mine`, rank after rank.
template <class U>
std::vector<U> gather(comm::Communicator& comm, const std::vector<U>& mine) {
  std::vector<U> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(std::span<const U>(mine), std::span<U>(all));
  return all;
}

template <class U>
bool same_bits(const std::vector<U>& a, const std::vector<U>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(U)) == 0;
}

void require_all_passed(const std::vector<std::string>& failures) {
  const std::string text = joined(failures);
  INFO(text);
  CHECK(text.empty());
}

}  // namespace

TEST_CASE("average_buffers gives every rank the average of the ranks' running statistics",
          "[train][data_parallel][buffers]") {
  using Net = nn::Network<BatchNormNet>;
  for (const int world_size : {2, 3}) {
    INFO(world_size << " ranks");
    require_all_passed(run_thread_ranks(world_size, [](comm::Communicator& comm) {
      Net net({.seed = 5});
      train::DataParallel ddp(net, comm);
      for (std::uint64_t batch = 0; batch < 2; ++batch)
        forward_on(net, 10 * static_cast<std::uint64_t>(comm.rank()) + batch);
      const std::vector<float> before = gather(comm, buffers_of<float>(net));
      const std::vector<std::int64_t> counts = buffers_of<std::int64_t>(net);
      const std::size_t n = before.size() / static_cast<std::size_t>(comm.size());
      expect(!same_bits(std::vector<float>(before.begin(), before.begin() + n),
                        std::vector<float>(before.begin() + n, before.begin() + 2 * n)),
             "the ranks' statistics differ before averaging");

      ddp.average_buffers();
      const std::vector<float> after = buffers_of<float>(net);
      expect(after.size() == n, "the same buffers");
      for (std::size_t i = 0; i < n; ++i) {
        double mean = 0;
        for (int r = 0; r < comm.size(); ++r) mean += before[r * n + i];
        mean /= comm.size();
        if (comm.size() == 2) {
          // a + b is exact in either order, and so is the division by two.
          const float exact = (before[i] + before[n + i]) / 2.0f;
          expect(std::memcmp(&after[i], &exact, sizeof(float)) == 0,
                 "buffer value " + std::to_string(i) + " is " + std::to_string(after[i]) +
                     ", the ranks' average is " + std::to_string(exact));
        } else {
          // Three addends: the ring's summation order differs per segment.
          expect(std::abs(after[i] - mean) <= 1e-6 * std::max(1.0, std::abs(mean)),
                 "buffer value " + std::to_string(i) + " is " + std::to_string(after[i]) +
                     ", the ranks' average is " + std::to_string(mean));
        }
      }
      expect(same_bits(gather(comm, after),
                       [&] {
                         std::vector<float> tiled;
                         for (int r = 0; r < comm.size(); ++r)
                           tiled.insert(tiled.end(), after.begin(), after.end());
                         return tiled;
                       }()),
             "every rank holds the same bits");
      expect(buffers_of<std::int64_t>(net) == counts && counts == std::vector<std::int64_t>(4, 2),
             "num_batches_tracked untouched (2 on every BatchNorm)");
    }));
  }
}

TEMPLATE_TEST_CASE(
    "average_buffers is exact for values whose sums are exact, and one rank changes nothing",
    "[train][data_parallel][buffers]", float, double, half, bfloat16) {
  using Net = nn::Network<BatchNormNet, TestType>;
  for (const int world_size : {1, 2, 3}) {
    INFO(world_size << " ranks");
    require_all_passed(run_thread_ranks(world_size, [](comm::Communicator& comm) {
      Net net({.seed = 5});
      train::DataParallel ddp(net, comm);
      // Quarters and halves: every partial sum is exact, so the average is (sum) / ranks in any
      // order; running statistics are f32 in 16-bit networks and f64 in double ones.
      const auto value = [](int rank, std::size_t i) {
        return 0.25 * static_cast<double>(i % 7) + 0.5 * rank - 1.0;
      };
      std::size_t i = 0;
      net.visit_buffers([&](const std::string&, auto& buffer) {
        using U = typename std::remove_reference_t<decltype(buffer)>::value_type;
        for (U& v : buffer.span())
          v = std::is_integral_v<U> ? U(3) : static_cast<U>(value(comm.rank(), i++));
      });
      using S = nn::compute_t<TestType>;
      const std::vector<S> mine = buffers_of<S>(net);
      expect(mine.size() == i, "running statistics are stored in compute precision");
      ddp.average_buffers();
      const std::vector<S> after = buffers_of<S>(net);
      for (std::size_t k = 0; k < after.size(); ++k) {
        S sum = 0;
        for (int r = 0; r < comm.size(); ++r) sum += static_cast<S>(value(r, k));
        const S expected = sum / static_cast<S>(comm.size());
        expect(after[k] == expected, "value " + std::to_string(k) + " is " +
                                         std::to_string(after[k]) + ", expected " +
                                         std::to_string(expected));
      }
      if (comm.size() == 1) expect(same_bits(after, mine), "one rank: unchanged bit for bit");
      expect(buffers_of<std::int64_t>(net) == std::vector<std::int64_t>(4, 3),
             "num_batches_tracked untouched");
    }));
  }
}

TEST_CASE("one rank's statistics after real batches are left bit for bit",
          "[train][data_parallel][buffers]") {
  using Net = nn::Network<BatchNormNet>;
  require_all_passed(run_thread_ranks(1, [](comm::Communicator& comm) {
    Net net({.seed = 5});
    train::DataParallel ddp(net, comm);
    forward_on(net, 1);
    forward_on(net, 2);
    const std::vector<float> before = buffers_of<float>(net);
    ddp.average_buffers();
    expect(same_bits(buffers_of<float>(net), before), "unchanged");
  }));
}

TEST_CASE("ranks that counted different batches get a MismatchError naming the buffer",
          "[train][data_parallel][buffers][errors]") {
  using Net = nn::Network<BatchNormNet>;
  require_all_passed(run_thread_ranks(2, [](comm::Communicator& comm) {
    Net net({.seed = 5});
    train::DataParallel ddp(net, comm);
    forward_on(net, 1);
    forward_on(net, 2);
    if (comm.rank() == 1) forward_on(net, 3);  // one training-mode forward pass more
    const std::vector<float> before = buffers_of<float>(net);
    bool threw = false;
    try {
      ddp.average_buffers();
    } catch (const MismatchError& e) {
      threw = true;
      const std::string message = e.what();
      expect(message.find("'bn1.num_batches_tracked' differs across ranks (2 to 3)") !=
                 std::string::npos,
             "the message names the buffer and the range: " + message);
      expect(e.context().rank == comm.rank(), "the context names this rank");
    }
    expect(threw, "a MismatchError on every rank");
    expect(same_bits(buffers_of<float>(net), before), "no buffer changed");

    // A clean collective: the communicator still works, and agreeing counts average.
    if (comm.rank() == 0) forward_on(net, 4);
    ddp.average_buffers();
    expect(buffers_of<std::int64_t>(net) == std::vector<std::int64_t>(4, 3), "3 batches each");
  }));
}

TEST_CASE("average_buffers mid-step is an error, as the other helpers",
          "[train][data_parallel][buffers][errors]") {
  using Net = nn::Network<BatchNormNet>;
  require_all_passed(run_thread_ranks(2, [](comm::Communicator& comm) {
    Net net({.seed = 5});
    train::DataParallel ddp(net, comm);
    net.zero_grad();
    tensor::Tensor<float> inputs(Net::Input::batch(2));
    nn::Rng rng(static_cast<std::uint64_t>(comm.rank()));
    for (float& x : inputs.span()) x = static_cast<float>(rng.uniform(-1.0, 1.0));
    const auto logits = net.forward(inputs.view());
    tensor::Tensor<float> grad(logits.shape());
    const std::vector<std::int32_t> labels = {0, 1};
    nn::SoftmaxCrossEntropy().loss_and_grad<float>(logits, labels, grad.view(), 1.0);
    net.backward(grad.view());
    bool threw = false;
    try {
      ddp.average_buffers();
    } catch (const Error& e) {
      threw = std::string(e.what()).find("call finish_gradient_sync() first") != std::string::npos;
    }
    expect(threw, "an Error telling to finish the step first");
    ddp.finish_gradient_sync();
    ddp.average_buffers();
  }));
}

namespace {

using coltrain::testing::quadrant_images;

using QuadrantModel =
    nn::Sequential<nn::Input<1, 6, 6>, nn::Named<"conv", nn::Conv2d<4, 3, 1, 1>>,
                   nn::Named<"bn", nn::BatchNormReLU2d<>>, nn::MaxPool2d<2>, nn::Flatten,
                   nn::Named<"fc", nn::Linear<4>>>;
using QuadrantNet = nn::Network<QuadrantModel>;
using Sgd = optim::PrecisionOptimizer<optim::Fp32, optim::Sgd>;

const data::ImageTransform kTransform{.normalization = {{0.5f}, {0.25f}}};

struct Run {
  train::FitResult result;
  std::vector<float> weights;  // all parameters, in state_dict order
  std::vector<float> statistics;
  std::vector<std::int64_t> counts;
};

// A short fit on this rank's shard of the training set (the DistributedSampler's).
Run fit(comm::Communicator& comm, train::TrainerOptions options) {
  const data::ImageDataset train_set = quadrant_images(96, 1), test_set = quadrant_images(40, 2);
  QuadrantNet net({.threads = 1, .seed = 7});
  train::DataParallel ddp(net, comm);
  Sgd sgd(optim::parameters_of(net), optim::Sgd({.lr = 0.1, .momentum = 0.9}));
  data::DistributedSampler sampler(train_set.size(),
                                   {.num_replicas = comm.size(), .rank = comm.rank(), .seed = 3});
  data::Loader<float> train_loader(train_set, sampler, {.batch_size = 8}, kTransform);
  std::vector<std::int64_t> shard;
  for (std::int64_t i = comm.rank(); i < test_set.size(); i += comm.size()) shard.push_back(i);
  data::Loader<float> test_loader(test_set, shard, {.batch_size = 16}, kTransform);
  std::ostringstream out;
  options.out = &out;
  options.progress = false;
  options.report = false;
  options.model_name = "quadrant_net";
  train::Trainer trainer(net, sgd, ddp, optim::CosineAnnealingLr{.base_lr = 0.1, .t_max = 200},
                         options);
  Run run{trainer.fit(train_loader, test_loader), {}, buffers_of<float>(net),
          buffers_of<std::int64_t>(net)};
  net.visit_parameters([&](const std::string&, auto& p) {
    run.weights.insert(run.weights.end(), p.value.span().begin(), p.value.span().end());
  });
  return run;
}

// Correct top-1 answers of `net` in evaluation mode on the whole of `set`.
std::int64_t correct_on(QuadrantNet& net, const data::ImageDataset& set) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(set.size()));
  for (std::int64_t i = 0; i < set.size(); ++i) all[static_cast<std::size_t>(i)] = i;
  data::Loader<float> loader(set, all, {.batch_size = 16}, kTransform);
  loader.start_epoch(0);
  net.eval();
  std::int64_t correct = 0;
  while (const data::Batch<float>* batch = loader.next()) {
    const auto logits = net.forward(batch->images.view());
    correct += nn::topk_correct<float>(logits, batch->labels, 1);
  }
  return correct;
}

}  // namespace

TEST_CASE("the trainer evaluates and checkpoints the ranks' averaged statistics",
          "[train][trainer][buffers]") {
  const coltrain::testing::TempDir temp;
  const std::filesystem::path dir = temp.path() / "checkpoints";
  require_all_passed(run_thread_ranks(2, [&](comm::Communicator& comm) {
    const Run run = fit(comm, {.epochs = 2, .checkpoint_dir = dir});
    comm.barrier();  // rank 0 has written the last checkpoint
    // Each rank trained on its own shard; without averaging their statistics would differ.
    expect(same_bits(gather(comm, run.statistics), [&] {
             std::vector<float> twice = run.statistics;
             twice.insert(twice.end(), run.statistics.begin(), run.statistics.end());
             return twice;
           }()),
           "every rank ends with the same running statistics");
    expect(run.counts == std::vector<std::int64_t>{12}, "6 batches a rank and epoch");

    const std::optional<train::CheckpointFiles> files = train::find_latest_checkpoint(dir);
    expect(files.has_value(), "a checkpoint");
    QuadrantNet saved({.threads = 1, .seed = 99});
    train::load_state_dict(files->model, saved);
    expect(same_bits(buffers_of<float>(saved), run.statistics),
           "the checkpoint holds the averaged statistics");
    // The validation metrics (each rank's shard, summed) are those of the saved network on the
    // whole set: every rank evaluated with the same statistics.
    const auto correct = static_cast<double>(correct_on(saved, quadrant_images(40, 2)));
    expect(std::abs(run.result.validation.top1() - correct / 40.0) < 1e-12,
           "validation top-1 " + std::to_string(run.result.validation.top1()) +
               " is the saved network's on the whole set, " + std::to_string(correct / 40.0));
  }));
}

TEST_CASE("a resumed 2-rank run ends where an uninterrupted one does, buffers included",
          "[train][trainer][buffers]") {
  const coltrain::testing::TempDir temp;
  const std::filesystem::path dir = temp.path() / "checkpoints";
  require_all_passed(run_thread_ranks(2, [&](comm::Communicator& comm) {
    const Run whole = fit(comm, {.epochs = 3});
    fit(comm, {.epochs = 2, .checkpoint_dir = dir});
    comm.barrier();
    const Run resumed = fit(comm, {.epochs = 3, .checkpoint_dir = dir, .resume = true});
    expect(resumed.result.global_step == whole.result.global_step, "same step");
    expect(same_bits(resumed.weights, whole.weights), "same weights");
    expect(same_bits(resumed.statistics, whole.statistics), "same running statistics");
    expect(resumed.counts == whole.counts, "same num_batches_tracked");
    expect(resumed.result.validation.top1() == whole.result.validation.top1(), "same accuracy");
  }));
}
