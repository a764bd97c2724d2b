// Trainer::fit on the world size mpiexec gives (CTest runs 1 and 2 ranks), over the MPI and TCP
// backends, on a small generated data set that a tiny network learns in a few epochs: the epoch
// lines in the seeds' form, stopping at the target accuracy, the run records, ranks that end with
// the same weights, and a resumed run that ends bit for bit where an uninterrupted one does.
#include <catch2/catch.hpp>

#include "../comm/collective_fixtures.hpp"
#include "../support/quadrant_images.hpp"
#include "../support/temp_dir.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/data.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/trainer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

using namespace coltrain;
using coltrain::testing::shared_communicator;
using comm::Backend;

namespace {

constexpr Backend kBackends[] = {Backend::kMpi, Backend::kTcp};

using coltrain::testing::quadrant_images;

using Model = nn::Sequential<nn::Input<1, 6, 6>, nn::Named<"conv", nn::Conv2d<4, 3, 1, 1>>,
                             nn::Named<"bn", nn::BatchNormReLU2d<>>, nn::MaxPool2d<2>, nn::Flatten,
                             nn::Named<"fc", nn::Linear<4>>>;
using Net = nn::Network<Model>;
// Without BatchNorm, whose batch statistics make a batch of 8 differ from two of 4.
using MlpModel = nn::Sequential<nn::Input<1, 6, 6>, nn::Flatten, nn::Named<"fc1", nn::Linear<12>>,
                                nn::ReLU, nn::Named<"fc2", nn::Linear<4>>>;

const data::ImageTransform kTransform{.normalization = {{0.5f}, {0.25f}}};

Json read_json(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

// Runs train in float (Fp32 and Sgd) or, with T = double, in float64 (Fp64 and BasicSgd<double>).
template <class T>
using PolicyFor = std::conditional_t<std::is_same_v<T, double>, optim::Fp64, optim::Fp32>;

template <class T = float>
struct Run {
  train::FitResult result;
  std::vector<T> weights;  // all parameters, in state_dict order
  std::string output;      // what rank 0 printed
};

struct Setup {
  bool zero = false;            // the optimizer state sharded (ZeRO-1)
  std::int64_t batch_size = 8;  // per rank
  double lr = 0.1;              // the cosine schedule's base
};

// Trains a fresh network for `epochs` (or, with `resume`, continues from the checkpoints).
template <class M = Model, class T = float>
Run<T> fit(comm::Communicator& comm, train::TrainerOptions options, Setup setup = {}) {
  using N = nn::Network<M, T>;
  using Policy = PolicyFor<T>;
  using Sgd = optim::BasicSgd<T>;
  const data::ImageDataset train_set = quadrant_images(96, 1), test_set = quadrant_images(40, 2);
  N net({.threads = 1, .seed = 7});
  const bool zero = setup.zero;
  train::DataParallel ddp(net, comm, {.zero_stage = zero ? 1 : 0});
  const typename Sgd::Options sgd_options{.lr = setup.lr, .momentum = 0.9};
  std::optional<optim::PrecisionOptimizer<Policy, Sgd>> sgd;
  std::optional<train::ZeroOptimizer<N, Policy, Sgd>> sharded;
  if (zero)
    sharded.emplace(ddp, Sgd(sgd_options));
  else
    sgd.emplace(optim::parameters_of(net), Sgd(sgd_options));
  data::DistributedSampler sampler(train_set.size(),
                                   {.num_replicas = comm.size(), .rank = comm.rank(), .seed = 3});
  data::Loader<T> train_loader(train_set, sampler, {.batch_size = setup.batch_size}, kTransform);
  std::vector<std::int64_t> shard;
  for (std::int64_t i = comm.rank(); i < test_set.size(); i += comm.size()) shard.push_back(i);
  data::Loader<T> test_loader(test_set, shard, {.batch_size = 16}, kTransform);
  std::ostringstream out;
  options.out = &out;
  options.progress = false;
  options.model_name = "quadrant_net";
  const optim::CosineAnnealingLr schedule{.base_lr = setup.lr, .t_max = 200};
  std::optional<train::Trainer<N, Policy, Sgd>> trainer;
  if (zero)
    trainer.emplace(net, *sharded, ddp, schedule, options);
  else
    trainer.emplace(net, *sgd, ddp, schedule, options);
  Run<T> run{trainer->fit(train_loader, test_loader), {}, {}};
  net.visit_parameters([&](const std::string&, auto& p) {
    run.weights.insert(run.weights.end(), p.value.span().begin(), p.value.span().end());
  });
  run.output = out.str();
  return run;
}

// A directory every rank agrees on: rank 0 makes it and broadcasts the name.
std::filesystem::path shared_dir(comm::Communicator& comm,
                                 const coltrain::testing::TempDir& local) {
  const std::string path = local.path().string();
  std::vector<std::int32_t> buffer(512, 0);
  if (comm.rank() == 0) std::copy(path.begin(), path.end(), buffer.begin());
  comm.broadcast(std::span<std::int32_t>(buffer));
  std::string shared;
  for (std::int32_t c : buffer) {
    if (c == 0) break;
    shared.push_back(static_cast<char>(c));
  }
  return shared;
}

std::vector<float> gather_weights(comm::Communicator& comm, const std::vector<float>& mine) {
  std::vector<float> all(mine.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(std::span<const float>(mine), std::span<float>(all));
  return all;
}

}  // namespace

TEST_CASE("fit prints the epoch lines, stops at the target and writes the run records",
          "[trainer]") {
  for (const Backend backend : kBackends) {
    comm::Communicator& comm = shared_communicator(backend);
    INFO("backend " << comm::name_of(backend) << ", " << comm.size() << " ranks");
    const coltrain::testing::TempDir temp;
    const std::filesystem::path dir = shared_dir(comm, temp) / "run";
    const Run run = fit(comm, {.epochs = 30, .target_accuracy = 0.95, .log_dir = dir});

    REQUIRE(run.result.time_to_target.has_value());
    CHECK(run.result.epochs == *run.result.target_epoch);
    CHECK(run.result.epochs < 30);
    CHECK(run.result.validation.top1() >= 0.95);
    CHECK(run.result.validation.samples() == 40);  // every rank's shard, counted once
    if (comm.rank() != 0) {
      CHECK(run.output.empty());
      continue;
    }
    const std::regex line(
        "epoch: \\d\\d/30  training loss: \\d\\.\\d{4}  training accuracy \\d\\.\\d{4}  "
        "validation loss: \\d\\.\\d{4}  validation accuracy: \\d\\.\\d{4}");
    std::istringstream lines(run.output);
    std::string text;
    std::int64_t epoch_lines = 0;
    while (std::getline(lines, text)) epoch_lines += std::regex_match(text, line) ? 1 : 0;
    CHECK(epoch_lines == run.result.epochs);
    CHECK_THAT(run.output, Catch::Contains("time to 0.95 validation accuracy"));
    CHECK_THAT(run.output, Catch::Contains("|  backward"));
    CHECK_THAT(run.output, Catch::Contains("allreduce_wait"));
    CHECK_THAT(run.output, Catch::Contains("confusion matrix"));

    std::ifstream metrics(dir / "metrics.jsonl");
    std::int64_t logged = 0;
    while (std::getline(metrics, text)) ++logged;
    CHECK(logged == run.result.epochs);
    const Json result = read_json(dir / "result.json");
    CHECK(result["target"]["reached"] == true);
    CHECK(result["epochs"] == run.result.epochs);
    CHECK(result["world_size"] == comm.size());
  }
}

TEST_CASE("every rank ends with the same weights", "[trainer]") {
  comm::Communicator& comm = shared_communicator(Backend::kMpi);
  const Run run = fit(comm, {.epochs = 2});
  const std::vector<float> all = gather_weights(comm, run.weights);
  for (int r = 1; r < comm.size(); ++r)
    CHECK(std::equal(run.weights.begin(), run.weights.end(), all.begin() + r * run.weights.size()));
}

TEST_CASE("a run resumed from its checkpoint ends bit for bit where an uninterrupted one does",
          "[trainer]") {
  for (const Backend backend : kBackends) {
    comm::Communicator& comm = shared_communicator(backend);
    INFO("backend " << comm::name_of(backend) << ", " << comm.size() << " ranks");
    const coltrain::testing::TempDir temp;
    const std::filesystem::path dir = shared_dir(comm, temp);
    const Run whole = fit(comm, {.epochs = 4});
    const Run first_half = fit(comm, {.epochs = 2, .checkpoint_dir = dir / "checkpoints"});
    const Run second_half =
        fit(comm, {.epochs = 4, .checkpoint_dir = dir / "checkpoints", .resume = true});
    CHECK(first_half.result.epochs == 2);
    CHECK(second_half.result.epochs == 4);
    CHECK(second_half.result.global_step == whole.result.global_step);
    CHECK(second_half.weights == whole.weights);
    CHECK(first_half.weights != whole.weights);
    if (comm.rank() == 0) CHECK_THAT(second_half.output, Catch::Contains("resuming after epoch 2"));
  }
}

// On 1 and 2 ranks the reduce-scatter sums each element as the allreduce does, so ZeRO-1 changes
// no bit; its checkpoints hold the whole state, so a run resumes from them without ZeRO too.
TEST_CASE("ZeRO-1 in the trainer: the same weights, and checkpoints that resume either way",
          "[trainer][zero]") {
  for (const Backend backend : kBackends) {
    comm::Communicator& comm = shared_communicator(backend);
    INFO("backend " << comm::name_of(backend) << ", " << comm.size() << " ranks");
    const coltrain::testing::TempDir temp;
    const std::filesystem::path dir = shared_dir(comm, temp);
    const Run whole = fit(comm, {.epochs = 4});
    CHECK(fit(comm, {.epochs = 4}, {.zero = true}).weights == whole.weights);

    const Run first_half = fit(comm, {.epochs = 2, .checkpoint_dir = dir / "zero"}, {.zero = true});
    CHECK(first_half.result.epochs == 2);
    const Run unsharded_rest =
        fit(comm, {.epochs = 4, .checkpoint_dir = dir / "zero", .resume = true});
    CHECK(unsharded_rest.weights == whole.weights);

    CHECK(fit(comm, {.epochs = 2, .checkpoint_dir = dir / "plain"}).result.epochs == 2);
    const Run sharded_rest =
        fit(comm, {.epochs = 4, .checkpoint_dir = dir / "plain", .resume = true}, {.zero = true});
    CHECK(sharded_rest.weights == whole.weights);
    if (comm.rank() == 0)
      CHECK_THAT(sharded_rest.output, Catch::Contains("resuming after epoch 2"));
  }
}

// Fp64: parameters, gradients, optimizer state and checkpoints all in double, so that a long run
// can be compared with a float64 PyTorch one (tests/optim/test_float64_training_parity.cpp).
TEST_CASE("float64: the trainer learns, shards, and resumes from fp64 checkpoints bit for bit",
          "[trainer][float64]") {
  for (const Backend backend : kBackends) {
    comm::Communicator& comm = shared_communicator(backend);
    INFO("backend " << comm::name_of(backend) << ", " << comm.size() << " ranks");
    const coltrain::testing::TempDir temp;
    const std::filesystem::path dir = shared_dir(comm, temp);
    const Run whole = fit<Model, double>(comm, {.epochs = 4});
    CHECK(whole.result.validation.top1() >= 0.9);
    // Computed in double: weights that float cannot hold.
    CHECK(std::ranges::any_of(
        whole.weights, [](double w) { return static_cast<double>(static_cast<float>(w)) != w; }));
    CHECK(fit<Model, double>(comm, {.epochs = 4}, {.zero = true}).weights == whole.weights);

    const Run first_half = fit<Model, double>(comm, {.epochs = 2, .checkpoint_dir = dir / "f64"});
    const Run second_half =
        fit<Model, double>(comm, {.epochs = 4, .checkpoint_dir = dir / "f64", .resume = true});
    CHECK(first_half.weights != whole.weights);
    CHECK(second_half.result.global_step == whole.result.global_step);
    CHECK(second_half.weights == whole.weights);
    const auto saved = train::find_latest_checkpoint(dir / "f64");
    REQUIRE(saved.has_value());
    CHECK(tensor::SafetensorsReader(saved->optimizer).entry("conv.weight.momentum_buffer").dtype ==
          DataType::kFloat64);
  }
}

TEST_CASE("a log directory refused on rank 0 stops every rank before training", "[trainer]") {
  for (const Backend backend : kBackends) {
    comm::Communicator& comm = shared_communicator(backend);
    INFO("backend " << comm::name_of(backend) << ", " << comm.size() << " ranks");
    const coltrain::testing::TempDir temp;
    const std::filesystem::path dir = shared_dir(comm, temp) / "run";
    fit(comm, {.epochs = 1, .log_dir = dir});  // leaves an epoch in metrics.jsonl
    // A fresh run into the same directory: rank 0's run log refuses it. The other ranks must
    // fail too, at once, rather than wait in the first allreduce for COLTRAIN_TIMEOUT.
    const auto started = std::chrono::steady_clock::now();
    if (comm.rank() == 0) {
      CHECK_THROWS_WITH(fit(comm, {.epochs = 1, .log_dir = dir}),
                        Catch::Contains("already holds 1 epochs"));
    } else {
      CHECK_THROWS_WITH(fit(comm, {.epochs = 1, .log_dir = dir}),
                        Catch::Contains("rank 0 could not open the run log"));
    }
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(30));
    // The communicator is still usable: every rank stopped at the same point.
    std::int64_t one = 1;
    comm.allreduce(std::span<std::int64_t>(&one, 1), comm::ReduceOp::kSum);
    CHECK(one == comm.size());
  }
}

namespace {

// The initial weights of fit<M>()'s network (its seed), in state_dict order.
template <class M>
std::vector<float> initial_weights() {
  nn::Network<M> net({.threads = 1, .seed = 7});
  std::vector<float> weights;
  net.visit_parameters([&](const std::string&, auto& p) {
    weights.insert(weights.end(), p.value.span().begin(), p.value.span().end());
  });
  return weights;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double largest = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    largest = std::max(largest, std::abs(static_cast<double>(a[i]) - b[i]));
  return largest;
}

double norm_of_change(const std::vector<float>& from, const std::vector<float>& to) {
  double sum = 0;
  for (std::size_t i = 0; i < from.size(); ++i) {
    const double d = static_cast<double>(to[i]) - from[i];
    sum += d * d;
  }
  return std::sqrt(sum);
}

}  // namespace

// Each rank's 96 / p samples in batches of 8 against batches of 4 accumulated in pairs (or 2 in
// fours): the same sums of the same gradients, so the same weights up to rounding.
TEST_CASE("gradient accumulation: k batches of b/k per step train as batches of b",
          "[trainer][grad_accum]") {
  for (const Backend backend : kBackends) {
    comm::Communicator& comm = shared_communicator(backend);
    INFO("backend " << comm::name_of(backend) << ", " << comm.size() << " ranks");
    for (const bool zero : {false, true}) {
      INFO("ZeRO-1 " << zero);
      const Run whole = fit<MlpModel>(comm, {.epochs = 2}, {.zero = zero, .batch_size = 8});
      const Run pairs =
          fit<MlpModel>(comm, {.epochs = 2, .grad_accum = 2}, {.zero = zero, .batch_size = 4});
      const Run fours =
          fit<MlpModel>(comm, {.epochs = 2, .grad_accum = 4}, {.zero = zero, .batch_size = 2});
      CHECK(pairs.result.global_step == whole.result.global_step);
      CHECK(fours.result.global_step == whole.result.global_step);
      CHECK(max_abs_difference(pairs.weights, whole.weights) < 1e-5);
      CHECK(max_abs_difference(fours.weights, whole.weights) < 1e-5);
      CHECK(max_abs_difference(initial_weights<MlpModel>(), whole.weights) > 1e-2);
    }
  }
}

TEST_CASE("gradient accumulation: a shorter last group still steps", "[trainer][grad_accum]") {
  comm::Communicator& comm = shared_communicator(Backend::kTcp);
  // 96 / p samples per rank in batches of 8: 12 or 6 batches, in groups of 5 (the last of 2 or 1).
  const std::int64_t batches = 96 / comm.size() / 8;
  const Run run = fit<MlpModel>(comm, {.epochs = 2, .grad_accum = 5});
  CHECK(run.result.global_step == 2 * ((batches + 4) / 5));
  CHECK(max_abs_difference(initial_weights<MlpModel>(), run.weights) > 1e-3);
}

// One step per epoch (each rank's whole shard in one batch). SGD's first step with momentum moves
// the weights by lr * gradient, so clipping to max_norm makes the change's norm lr * max_norm.
TEST_CASE("clip_grad_norm scales the gradients to the norm, on every rank alike",
          "[trainer][clip]") {
  for (const Backend backend : kBackends) {
    comm::Communicator& comm = shared_communicator(backend);
    INFO("backend " << comm::name_of(backend) << ", " << comm.size() << " ranks");
    const Setup one_step{.batch_size = 96 / comm.size()};
    const std::vector<float> start = initial_weights<Model>();
    const Run free = fit(comm, {.epochs = 1}, one_step);
    const double lr = 0.1;  // the schedule's rate at step 0
    const double gradient_norm = norm_of_change(start, free.weights) / lr;
    REQUIRE(gradient_norm > 0.1);

    const double max_norm = gradient_norm / 4;
    const Run clipped = fit(comm, {.epochs = 1, .clip_grad_norm = max_norm}, one_step);
    CHECK(norm_of_change(start, clipped.weights) == Approx(lr * max_norm).epsilon(1e-4));
    // The same direction: the clipped change is the free one, scaled.
    const double factor = max_norm / (gradient_norm + 1e-6);
    for (std::size_t i = 0; i < start.size(); i += 7)
      CHECK(clipped.weights[i] - start[i] ==
            Approx((free.weights[i] - start[i]) * factor).margin(1e-6));
    // Under ZeRO-1 each rank holds a shard of the gradients; the norm sums the shards'.
    const Run sharded = fit(comm, {.epochs = 1, .clip_grad_norm = max_norm},
                            {.zero = true, .batch_size = 96 / comm.size()});
    CHECK(max_abs_difference(sharded.weights, clipped.weights) < 1e-6);
    // A limit above the norm leaves the step alone.
    CHECK(fit(comm, {.epochs = 1, .clip_grad_norm = gradient_norm * 2}, one_step).weights ==
          free.weights);
    const std::vector<float> all = gather_weights(comm, clipped.weights);
    for (int r = 1; r < comm.size(); ++r)
      CHECK(std::equal(clipped.weights.begin(), clipped.weights.end(),
                       all.begin() + r * static_cast<std::ptrdiff_t>(clipped.weights.size())));
  }
}

// At learning rate 0 the validation loss never improves after the first epoch: patience 2 stops
// after epoch 3. Its count travels in checkpoints, so a resumed run stops there too.
TEST_CASE("early stopping ends the run when the validation loss stops improving, across a resume",
          "[trainer][early_stopping]") {
  for (const Backend backend : kBackends) {
    comm::Communicator& comm = shared_communicator(backend);
    INFO("backend " << comm::name_of(backend) << ", " << comm.size() << " ranks");
    const coltrain::testing::TempDir temp;
    const std::filesystem::path dir = shared_dir(comm, temp);
    const Setup frozen{.lr = 0.0};
    const Run run = fit<MlpModel>(
        comm, {.epochs = 10, .log_dir = dir / "run", .early_stopping_patience = 2}, frozen);
    CHECK(run.result.stopped_early);
    CHECK(run.result.epochs == 3);
    if (comm.rank() == 0) {
      CHECK_THAT(run.output,
                 Catch::Contains("early stopping after epoch 3: validation loss has not "
                                 "improved on ") &&
                     Catch::Contains("(epoch 1) for 2 epochs"));
      CHECK(read_json(dir / "run" / "result.json")["extra"]["stopped_early"] == true);
    }
    // Training that improves is not stopped.
    CHECK_FALSE(
        fit<MlpModel>(comm, {.epochs = 3, .early_stopping_patience = 2}).result.stopped_early);

    const Run first = fit<MlpModel>(
        comm, {.epochs = 2, .checkpoint_dir = dir / "checkpoints", .early_stopping_patience = 2},
        frozen);
    CHECK_FALSE(first.result.stopped_early);
    const Run resumed = fit<MlpModel>(comm,
                                      {.epochs = 10,
                                       .checkpoint_dir = dir / "checkpoints",
                                       .resume = true,
                                       .early_stopping_patience = 2},
                                      frozen);
    CHECK(resumed.result.stopped_early);
    CHECK(resumed.result.epochs == 3);
  }
}

TEST_CASE("eval_only evaluates the newest checkpoint, resume_from reads another directory",
          "[trainer][eval_only]") {
  for (const Backend backend : kBackends) {
    comm::Communicator& comm = shared_communicator(backend);
    INFO("backend " << comm::name_of(backend) << ", " << comm.size() << " ranks");
    const coltrain::testing::TempDir temp;
    const std::filesystem::path dir = shared_dir(comm, temp);
    const Run trained = fit(comm, {.epochs = 2, .checkpoint_dir = dir / "a"});

    const Run evaluated =
        fit(comm, {.log_dir = dir / "eval", .resume_from = dir / "a", .eval_only = true});
    CHECK(evaluated.result.epochs == 2);
    CHECK(evaluated.result.global_step == trained.result.global_step);
    CHECK(evaluated.weights == trained.weights);
    CHECK(evaluated.result.validation.top1() == trained.result.validation.top1());
    CHECK(evaluated.result.validation.mean_loss() ==
          Approx(trained.result.validation.mean_loss()).epsilon(1e-6));
    if (comm.rank() == 0) {
      CHECK_THAT(evaluated.output,
                 Catch::Contains("(epoch 2, step " + std::to_string(trained.result.global_step) +
                                 "): validation loss: "));
      const Json record = read_json(dir / "eval" / "evaluation.json");
      CHECK(record["epoch"] == 2);
      CHECK(record["validation"]["samples"] == 40);
      CHECK(record["validation"]["top1"].get<double>() == trained.result.validation.top1());
    }
    // Nothing to evaluate is an error naming the directory.
    CHECK_THROWS_WITH(fit(comm, {.checkpoint_dir = dir / "empty", .eval_only = true}),
                      Catch::Contains((dir / "empty").string()));

    // Resuming from a's checkpoints while saving into b: the uninterrupted run's weights.
    const Run whole = fit(comm, {.epochs = 4});
    const Run rest = fit(
        comm, {.epochs = 4, .checkpoint_dir = dir / "b", .resume = true, .resume_from = dir / "a"});
    CHECK(rest.weights == whole.weights);
    CHECK(train::find_latest_checkpoint(dir / "b").has_value());
  }
}

TEST_CASE("the trainer refuses options out of range, naming them", "[trainer]") {
  comm::Communicator& comm = shared_communicator(Backend::kTcp);
  CHECK_THROWS_WITH(fit(comm, {.grad_accum = 0}), Catch::Contains("grad_accum must be >= 1"));
  CHECK_THROWS_WITH(fit(comm, {.clip_grad_norm = 0.0}),
                    Catch::Contains("clip_grad_norm must be > 0"));
  CHECK_THROWS_WITH(fit(comm, {.early_stopping_patience = 0}),
                    Catch::Contains("early_stopping_patience must be >= 1"));
  CHECK_THROWS_WITH(fit(comm, {.eval_only = true}),
                    Catch::Contains("eval_only needs a checkpoint directory"));
}
