// Trainer::fit on the world size mpiexec gives (CTest runs 1 and 2 ranks), over the MPI and TCP
// backends, on a small generated data set that a tiny network learns in a few epochs: the epoch
// lines in the seeds' form, stopping at the target accuracy, the run records, ranks that end with
// the same weights, and a resumed run that ends bit for bit where an uninterrupted one does.
#include <catch2/catch.hpp>

#include "../comm/collective_fixtures.hpp"
#include "../support/temp_dir.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/data.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/train/trainer.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

using namespace coltrain;
using coltrain::testing::shared_communicator;
using comm::Backend;

namespace {

constexpr Backend kBackends[] = {Backend::kMpi, Backend::kTcp};

// Four classes of 1 x 6 x 6 images: the bright quadrant is the class, on a noisy background.
data::ImageDataset quadrants(std::int64_t count, std::uint64_t seed) {
  const data::ImageShape shape{1, 6, 6};
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(count * shape.size()));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(count));
  nn::Rng rng(seed);
  for (std::int64_t i = 0; i < count; ++i) {
    const auto label = static_cast<std::int32_t>(i % 4);
    labels[static_cast<std::size_t>(i)] = label;
    for (std::int64_t y = 0; y < 6; ++y)
      for (std::int64_t x = 0; x < 6; ++x) {
        const bool bright = (y / 3) * 2 + x / 3 == label;
        pixels[static_cast<std::size_t>(i * 36 + y * 6 + x)] =
            static_cast<std::uint8_t>(rng.uniform(0, 120) + (bright ? 120 : 0));
      }
  }
  return data::ImageDataset(shape, std::move(pixels), std::move(labels), 4);
}

using Model = nn::Sequential<nn::Input<1, 6, 6>, nn::Named<"conv", nn::Conv2d<4, 3, 1, 1>>,
                             nn::Named<"bn", nn::BatchNormReLU2d<>>, nn::MaxPool2d<2>, nn::Flatten,
                             nn::Named<"fc", nn::Linear<4>>>;
using Net = nn::Network<Model>;
using Sgd = optim::PrecisionOptimizer<optim::Fp32, optim::Sgd>;

const data::ImageTransform kTransform{.normalization = {{0.5f}, {0.25f}}};

struct Run {
  train::FitResult result;
  std::vector<float> weights;  // all parameters, in state_dict order
  std::string output;          // what rank 0 printed
};

// Trains a fresh network for `epochs` (or, with `resume`, continues from the checkpoints); with
// `zero`, the optimizer state sharded (ZeRO-1).
Run fit(comm::Communicator& comm, train::TrainerOptions options, bool zero = false) {
  const data::ImageDataset train_set = quadrants(96, 1), test_set = quadrants(40, 2);
  Net net({.threads = 1, .seed = 7});
  train::DataParallel ddp(net, comm, {.zero_stage = zero ? 1 : 0});
  const optim::Sgd::Options sgd_options{.lr = 0.1, .momentum = 0.9};
  std::optional<Sgd> sgd;
  std::optional<train::ZeroOptimizer<Net, optim::Fp32, optim::Sgd>> sharded;
  if (zero)
    sharded.emplace(ddp, optim::Sgd(sgd_options));
  else
    sgd.emplace(optim::parameters_of(net), optim::Sgd(sgd_options));
  data::DistributedSampler sampler(train_set.size(),
                                   {.num_replicas = comm.size(), .rank = comm.rank(), .seed = 3});
  data::Loader<float> train_loader(train_set, sampler, {.batch_size = 8}, kTransform);
  std::vector<std::int64_t> shard;
  for (std::int64_t i = comm.rank(); i < test_set.size(); i += comm.size()) shard.push_back(i);
  data::Loader<float> test_loader(test_set, shard, {.batch_size = 16}, kTransform);
  std::ostringstream out;
  options.out = &out;
  options.progress = false;
  options.model_name = "quadrant_net";
  const optim::CosineAnnealingLr schedule{.base_lr = 0.1, .t_max = 200};
  std::optional<train::Trainer<Net, optim::Fp32, optim::Sgd>> trainer;
  if (zero)
    trainer.emplace(net, *sharded, ddp, schedule, options);
  else
    trainer.emplace(net, *sgd, ddp, schedule, options);
  Run run{trainer->fit(train_loader, test_loader), {}, {}};
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
    std::ifstream result_file(dir / "result.json");
    const auto result = nlohmann::json::parse(result_file);
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
    CHECK(fit(comm, {.epochs = 4}, true).weights == whole.weights);

    const Run first_half = fit(comm, {.epochs = 2, .checkpoint_dir = dir / "zero"}, true);
    CHECK(first_half.result.epochs == 2);
    const Run unsharded_rest =
        fit(comm, {.epochs = 4, .checkpoint_dir = dir / "zero", .resume = true});
    CHECK(unsharded_rest.weights == whole.weights);

    CHECK(fit(comm, {.epochs = 2, .checkpoint_dir = dir / "plain"}).result.epochs == 2);
    const Run sharded_rest =
        fit(comm, {.epochs = 4, .checkpoint_dir = dir / "plain", .resume = true}, true);
    CHECK(sharded_rest.weights == whole.weights);
    if (comm.rank() == 0)
      CHECK_THAT(sharded_rest.output, Catch::Contains("resuming after epoch 2"));
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
