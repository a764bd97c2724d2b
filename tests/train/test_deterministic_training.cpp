// DataParallel's deterministic mode (micro_shards) on 1, 2, 4 and 8 TCP ranks run as threads:
// three SGD steps (fp32, bf16 with f32 master weights, fp16 with loss scaling) of a network with
// BatchNorm and dropout end with the same bits of every parameter, running statistic and loss on
// every world size and every rank; so do two epochs through the Trainer, with and without gradient
// accumulation, checkpoints included, and under ZeRO-1 with gradient clipping, whose runs end with
// the bits of the plain run on one rank; inputs that plain data-parallel training on 1 and 2 ranks
// turns into different bits, so that the comparison can fail; and the shard arithmetic and its
// errors.
#include <catch2/catch.hpp>

#include "deterministic_runs.hpp"

#include "../support/quadrant_images.hpp"
#include "../support/temp_dir.hpp"
#include "../support/thread_ranks.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/data.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/data_parallel.hpp>
#include <coltrain/train/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace coltrain;
using coltrain::testing::add_state;
using coltrain::testing::deterministic_run;
using coltrain::testing::expect;
using coltrain::testing::expect_throws_containing;
using coltrain::testing::forward_backward;
using coltrain::testing::joined;
using coltrain::testing::Outcome;
using coltrain::testing::Outcomes;
using coltrain::testing::require_all_passed;
using coltrain::testing::require_same_bits_on_world_sizes;
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

}  // namespace

TEMPLATE_TEST_CASE("Deterministic data-parallel: 1, 2, 4 and 8 ranks end with the same bits",
                   "[train][deterministic]", optim::Fp32, optim::MixedBf16, optim::MixedFp16) {
  // With 4 micro-shards of four samples the outcome differs: it depends on the shards, not merely
  // on the data.
  require_same_bits_on_world_sizes(
      [](comm::Communicator& comm, int micro_shards) {
        return deterministic_run<ShardNet, TestType>(comm, micro_shards, kGlobalBatch, kSteps);
      },
      600);
}

TEST_CASE("Deterministic data-parallel: these inputs tell plain data-parallel's world sizes apart",
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

// The ranks are threads: they check with expect(), not Catch (tests/support/thread_ranks.hpp).
// INFO and CHECK from two rank threads at once had raced on Catch's message list (a leak that
// LeakSanitizer reported in one CI run).
TEST_CASE("Deterministic data-parallel: shards, and what the mode refuses",
          "[train][deterministic]") {
  require_all_passed(run_thread_ranks(2, [](comm::Communicator& comm) {
    nn::Network<ShardNet> net({.seed = 5});
    train::DataParallel ddp(net, comm, {.micro_shards = 8});
    expect(ddp.deterministic(), "deterministic()");
    expect(ddp.local_shards() == 4, "4 local shards");
    expect(ddp.first_shard() == 4 * comm.rank(), "first shard 4 * rank");
    expect(ddp.shard_samples(32, 5) == std::pair<std::int64_t, std::int64_t>{20, 24},
           "shard 5 of a batch of 32 is samples [20, 24)");
    expect_throws_containing([&] { ddp.shard_samples(12, 0); },
                             "global batch of 12 in 8 micro-shards", "a batch of 12");
    expect(ddp.gradients_identical_on_every_rank(), "gradients identical on every rank");
    // Accumulation goes through compute_gradients, and backward passes inside it.
    expect_throws_containing([&] { [[maybe_unused]] auto scope = ddp.no_sync(); },
                             "compute_gradients(pass_number, pass, true)", "no_sync()");
    net.train();
    expect_throws_containing([&] { forward_backward(net, 0, 2); },
                             "a backward pass outside compute_gradients()",
                             "a backward pass outside compute_gradients()");
    // 2 ranks: 6 shards are 3 a rank, not a power of two; 3 shards do not divide.
    for (const int shards : {6, 3}) {
      nn::Network<ShardNet> other({.seed = 5});
      expect_throws_containing(
          [&] {
            train::DataParallel<nn::Network<ShardNet>>(other, comm, {.micro_shards = shards});
          },
          std::to_string(shards) + " micro-shards over 2 ranks",
          std::to_string(shards) + " micro-shards");
    }
    const auto refused = [&](train::DataParallelOptions options) {
      nn::Network<ShardNet> other({.seed = 5});
      train::DataParallel<nn::Network<ShardNet>> wrapper(other, comm, options);
    };
    expect_throws_containing([&] { refused({.micro_shards = -1}); }, "-1 micro-shards (0: off)",
                             "-1 micro-shards");
    const std::string folds = "folds the gradients with the rank_order allreduce";
    expect_throws_containing(
        [&] { refused({.compression = comm::WireCompression::kBFloat16, .micro_shards = 8}); },
        folds, "wire compression");
    expect_throws_containing(
        [&] { refused({.algorithm = comm::Algorithm::kRing, .micro_shards = 8}); }, folds,
        "the ring algorithm");
    // A pass that throws leaves the buffers and gradients as before the call, and the error
    // reaches the caller; with accumulate, the gradients it would have added to.
    const auto floats_of = [&](auto visit) {
      std::vector<float> values;
      visit([&](const std::string&, auto& tensor) {
        using U = typename std::remove_reference_t<decltype(tensor)>::value_type;
        if constexpr (std::is_same_v<U, float>)
          values.insert(values.end(), tensor.span().begin(), tensor.span().end());
      });
      return values;
    };
    const auto buffers = [&] { return floats_of([&](auto f) { net.visit_buffers(f); }); };
    const auto gradients = [&] {
      return floats_of([&](auto f) {
        net.visit_parameters([&](const std::string& name, auto& p) { f(name, p.grad); });
      });
    };
    const auto throwing_pass = [&](int shard) -> double {
      forward_backward(net, shard * 2, 2);
      throw std::runtime_error("pass failed");
    };
    const std::vector<float> buffers_before = buffers();
    expect_throws_containing([&] { ddp.compute_gradients(0, throwing_pass); }, "pass failed",
                             "a throwing pass");
    expect(buffers() == buffers_before, "buffers unchanged by a throwing pass");
    const std::vector<float> zeroed = gradients();
    expect(std::all_of(zeroed.begin(), zeroed.end(), [](float g) { return g == 0; }),
           "gradients zero after a throwing pass");
    ddp.compute_gradients(0, [&](int shard) { return forward_backward(net, shard * 2, 2); });
    const std::vector<float> accumulated = gradients();
    expect(std::any_of(accumulated.begin(), accumulated.end(), [](float g) { return g != 0; }),
           "gradients after a pass");
    expect_throws_containing([&] { ddp.compute_gradients(1, throwing_pass, true); }, "pass failed",
                             "a throwing pass with accumulate");
    expect(gradients() == accumulated, "accumulated gradients unchanged by a throwing pass");
  }));
  // Outside the mode its calls are refused.
  require_all_passed(run_thread_ranks(1, [](comm::Communicator& comm) {
    nn::Network<ShardNet> net({.seed = 5});
    train::DataParallel ddp(net, comm);
    expect(!ddp.deterministic(), "not deterministic()");
    expect_throws_containing([&] { ddp.shard_samples(16, 0); }, "only in deterministic mode",
                             "shard_samples outside the mode");
    expect_throws_containing([&] { ddp.compute_gradients(0, [](int) { return 0.0; }); },
                             "only in deterministic mode", "compute_gradients outside the mode");
  }));
}

namespace {

using coltrain::testing::quadrant_images;

using TrainerModel =
    nn::Sequential<nn::Input<1, 6, 6>, nn::Named<"conv", nn::Conv2d<4, 3, 1, 1, false>>,
                   nn::Named<"bn", nn::BatchNormReLU2d<>>, nn::Dropout<0.25>, nn::MaxPool2d<2>,
                   nn::Flatten, nn::Named<"fc", nn::Linear<4>>>;

std::vector<unsigned char> file_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The newest checkpoint's file ending in `suffix` in `dir`, as bytes; empty if there is none.
std::vector<unsigned char> newest_checkpoint_file(const std::filesystem::path& dir,
                                                  const std::string& suffix) {
  std::filesystem::path newest;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > suffix.size() && name.ends_with(suffix) && entry.path() > newest)
      newest = entry.path();
  }
  return newest.empty() ? std::vector<unsigned char>{} : file_bytes(newest);
}

// How a Trainer run is set up: gradient accumulation, ZeRO-1, clipping by the gradients' norm.
struct TrainerSetup {
  int grad_accum = 1;
  bool zero = false;
  std::optional<double> clip_grad_norm = std::nullopt;
};

// Two epochs of 96 samples in global batches of 16 through the Trainer, in deterministic mode:
// the state every rank ends with, and rank 0's epoch lines cut to their training part.
Outcome trainer_run(comm::Communicator& comm, const TrainerSetup& setup,
                    const std::filesystem::path& dir, std::string& training_lines) {
  constexpr std::int64_t kBatch = 16;
  const data::ImageDataset train_set = quadrant_images(96, 1), test_set = quadrant_images(40, 2);
  using Net = nn::Network<TrainerModel>;
  Net net({.seed = 7});
  train::DataParallel ddp(net, comm, {.zero_stage = setup.zero ? 1 : 0, .micro_shards = 8});
  const optim::Sgd::Options sgd_options{.lr = 0.1, .momentum = 0.9};
  // The whole optimizer on every rank, or each rank's shard of it.
  std::optional<optim::PrecisionOptimizer<optim::Fp32, optim::Sgd>> sgd;
  std::optional<train::ZeroOptimizer<Net, optim::Fp32, optim::Sgd>> zero_sgd;
  if (setup.zero)
    zero_sgd.emplace(ddp, optim::Sgd(sgd_options));
  else
    sgd.emplace(optim::parameters_of(net), optim::Sgd(sgd_options));
  data::DistributedSampler sampler(
      train_set.size(),
      {.num_replicas = comm.size(), .rank = comm.rank(), .seed = 3, .global_batch = kBatch});
  const data::ImageTransform transform{.normalization = {{0.5f}, {0.25f}}};
  data::Loader<float> train_loader(train_set, sampler,
                                   {.batch_size = kBatch / comm.size(), .prefetch = 0}, transform);
  std::vector<std::int64_t> shard;
  for (std::int64_t i = comm.rank(); i < test_set.size(); i += comm.size()) shard.push_back(i);
  data::Loader<float> test_loader(test_set, shard, {.batch_size = 16, .prefetch = 0}, transform);
  std::ostringstream out;
  train::TrainerOptions options;
  options.epochs = 2;
  options.grad_accum = setup.grad_accum;
  options.clip_grad_norm = setup.clip_grad_norm;
  options.checkpoint_dir = dir;
  options.out = &out;
  options.progress = false;
  const optim::CosineAnnealingLr schedule{.base_lr = 0.1, .t_max = 20};
  std::optional<train::Trainer<Net, optim::Fp32, optim::Sgd>> trainer;
  if (setup.zero)
    trainer.emplace(net, *zero_sgd, ddp, schedule, options);
  else
    trainer.emplace(net, *sgd, ddp, schedule, options);
  trainer->fit(train_loader, test_loader);
  Outcome outcome;
  add_state(outcome, net);
  if (comm.rank() == 0) {
    const std::regex training("training loss: [0-9.]+  training accuracy [0-9.]+");
    const std::string text = out.str();
    for (std::sregex_iterator it(text.begin(), text.end(), training), end; it != end; ++it)
      training_lines += it->str() + "\n";
  }
  return outcome;
}

}  // namespace

TEST_CASE("Deterministic data-parallel: the Trainer ends with the same bits on 1, 2, 4 and 8 ranks",
          "[train][deterministic]") {
  const coltrain::testing::TempDir temp("deterministic_trainer");
  for (const int grad_accum : {1, 2}) {
    INFO("grad_accum " << grad_accum);
    Outcomes outcomes;
    std::map<int, std::string> lines;
    std::map<int, std::vector<unsigned char>> models, optimizers;
    for (const int world_size : {1, 2, 4, 8}) {
      const std::filesystem::path dir =
          temp.path() / ("accum" + std::to_string(grad_accum) + "_p" + std::to_string(world_size));
      std::string training_lines;
      require_all_passed(run_thread_ranks(world_size, [&](comm::Communicator& comm) {
        outcomes.put(comm.size(), comm.rank(),
                     trainer_run(comm, {.grad_accum = grad_accum}, dir, training_lines));
      }));
      lines[world_size] = training_lines;
      models[world_size] = newest_checkpoint_file(dir, ".model.safetensors");
      optimizers[world_size] = newest_checkpoint_file(dir, ".optimizer.safetensors");
    }
    const Outcome& reference = outcomes.by_world_size[1][0];
    REQUIRE(reference.bytes.size() > 200);
    REQUIRE(std::count(lines[1].begin(), lines[1].end(), '\n') == 2);
    REQUIRE(!models[1].empty());
    REQUIRE(!optimizers[1].empty());
    for (const auto& [world_size, ranks] : outcomes.by_world_size) {
      INFO(world_size << " ranks");
      for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
        INFO("rank " << rank);
        CHECK(ranks[rank].first_difference(reference) == -1);
      }
      CHECK(lines[world_size] == lines[1]);
      CHECK(models[world_size] == models[1]);
      CHECK(optimizers[world_size] == optimizers[1]);
    }
  }
}

TEST_CASE("Deterministic data-parallel: ZeRO-1 with clipping ends with the plain run's bits",
          "[train][deterministic][zero]") {
  const coltrain::testing::TempDir temp("deterministic_zero");
  // Clipping at this norm scales most steps' gradients: the norm, which ZeRO-1 otherwise sums
  // shard by shard, takes part in every step.
  const TrainerSetup plain{.clip_grad_norm = 0.05}, zero{.zero = true, .clip_grad_norm = 0.05};
  struct Run {
    Outcomes outcomes;
    std::string lines;
    std::vector<unsigned char> model, optimizer;
  };
  std::map<std::string, Run> runs;
  const auto run = [&](const std::string& name, int world_size, const TrainerSetup& setup) {
    Run& r = runs[name];
    const std::filesystem::path dir = temp.path() / name;
    require_all_passed(run_thread_ranks(world_size, [&](comm::Communicator& comm) {
      r.outcomes.put(comm.size(), comm.rank(), trainer_run(comm, setup, dir, r.lines));
    }));
    r.model = newest_checkpoint_file(dir, ".model.safetensors");
    r.optimizer = newest_checkpoint_file(dir, ".optimizer.safetensors");
  };
  run("plain_p1", 1, plain);
  run("unclipped_p1", 1, {});
  for (const int world_size : {1, 2, 4})
    run("zero_p" + std::to_string(world_size), world_size, zero);

  const Run& reference = runs["plain_p1"];
  const Outcome& state = reference.outcomes.by_world_size.at(1)[0];
  REQUIRE(!reference.model.empty());
  REQUIRE(!reference.optimizer.empty());
  // Clipping changed the run: otherwise the norm would not have been tested.
  CHECK(runs["unclipped_p1"].outcomes.by_world_size.at(1)[0].first_difference(state) != -1);
  for (const int world_size : {1, 2, 4}) {
    INFO("ZeRO-1 on " << world_size << " ranks");
    const Run& r = runs["zero_p" + std::to_string(world_size)];
    const std::vector<Outcome>& ranks = r.outcomes.by_world_size.at(world_size);
    for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
      INFO("rank " << rank);
      CHECK(ranks[rank].first_difference(state) == -1);
    }
    CHECK(r.lines == reference.lines);
    CHECK(r.model == reference.model);
    CHECK(r.optimizer == reference.optimizer);
  }
}

TEMPLATE_TEST_CASE(
    "Deterministic data-parallel: ZeRO-1's gradient norm is the unsharded optimizer's on any "
    "world size",
    "[train][deterministic][zero]", optim::Fp32, optim::MixedBf16) {
  using T = typename TestType::Storage;
  using Net = nn::Network<ShardNet, T>;
  // Gradients from 2^-30 to 2^10 in magnitude, of both signs: their squares span more bits than a
  // double holds, so that the sum depends on the order of the additions (checked below), as a
  // shard-by-shard sum would show.
  const auto fill = [](Net& net) {
    std::int64_t i = 0;
    net.visit_parameters([&](const std::string&, auto& parameter) {
      for (T& g : parameter.grad.span()) {
        const double mantissa = 1.0 + static_cast<double>((i * 2654435761) % 1000) / 1000.0;
        const double magnitude = std::ldexp(mantissa, static_cast<int>(i % 41) - 30);
        g = static_cast<T>(static_cast<float>(i % 2 == 0 ? magnitude : -magnitude));
        ++i;
      }
    });
  };
  Net net({.seed = 5});
  fill(net);
  optim::PrecisionOptimizer<TestType, optim::Sgd> whole(optim::parameters_of(net),
                                                        optim::Sgd({.lr = 0.1}));
  REQUIRE(whole.unscale_and_check());
  const double replicated = whole.gradient_sum_of_squares();
  std::vector<double> squares;
  net.visit_parameters([&](const std::string&, auto& parameter) {
    for (const T g : parameter.grad.span())
      squares.push_back(static_cast<double>(static_cast<float>(g)) *
                        static_cast<double>(static_cast<float>(g)));
  });
  const auto sum_of = [&](std::size_t begin, std::size_t end) {
    double sum = 0;
    for (std::size_t i = begin; i < end; ++i) sum += squares[i];
    return sum;
  };
  REQUIRE(sum_of(0, squares.size()) == replicated);
  const std::size_t n = squares.size();
  REQUIRE((sum_of(0, n / 4) + sum_of(n / 4, n) != replicated ||
           sum_of(0, n / 2) + sum_of(n / 2, n) != replicated ||
           sum_of(0, 3 * n / 4) + sum_of(3 * n / 4, n) != replicated));

  std::mutex mutex;
  std::map<int, std::vector<double>> norms;  // world size -> each rank's
  std::map<int, int> took_nan_for_finite;    // world size -> ranks that would step
  for (const int world_size : {1, 2, 4}) {
    require_all_passed(run_thread_ranks(world_size, [&](comm::Communicator& comm) {
      Net rank_net({.seed = 5});
      train::DataParallel ddp(rank_net, comm, {.zero_stage = 1, .micro_shards = 8});
      train::ZeroOptimizer<Net, TestType, optim::Sgd> zero(ddp, optim::Sgd({.lr = 0.1}));
      train::ShardedOptimizer<Net, TestType, optim::Sgd> sharded(zero);
      fill(rank_net);
      // Each rank checked its shard alone; the ranks agree.
      if (!sharded.all_finite(ddp, zero.unscale_and_check()))
        throw std::runtime_error("finite gradients taken for non-finite");
      const double norm = sharded.gradient_sum_of_squares(ddp);
      // A NaN in the last rank's shard alone: every rank skips the step.
      zero.abandon_step();
      T* last = nullptr;
      rank_net.visit_parameters(
          [&](const std::string&, auto& parameter) { last = &parameter.grad.span().back(); });
      *last = static_cast<T>(std::numeric_limits<float>::quiet_NaN());
      const bool finite = sharded.all_finite(ddp, zero.unscale_and_check());
      const std::lock_guard lock(mutex);
      norms[world_size].push_back(norm);
      if (finite) ++took_nan_for_finite[world_size];
    }));
  }
  for (const auto& [world_size, ranks] : norms) {
    INFO(world_size << " ranks");
    REQUIRE(ranks.size() == static_cast<std::size_t>(world_size));
    for (const double norm : ranks) CHECK(norm == replicated);
    CHECK(took_nan_for_finite[world_size] == 0);
  }
}
