// One rank of the elastic jobs that tests/elastic/elastic_training.sh runs: an Mlp trained on the
// first 1,152 MNIST digits (batch 32, SGD) by train::Trainer over a comm::ElasticGroup, and the
// evidence the script checks:
//   OUT/samples.NAME   every training sample this rank loaded, as "epoch index" lines
//   stdout             the trainer's lines, then "final-weights HASH" (FNV-1a of the parameters)
// With FAULT=RANK:STEP:SIGNAL (SIGNAL KILL or STOP), launch rank RANK raises that signal when it
// loads the first sample of training step STEP of epoch 0: no rank can complete that step, so the
// survivors' schedule is the same whichever rank it is. Several faults: a comma-separated list.
// With DETERMINISTIC=1, deterministic mode: global batches of 64 in 8 micro-shards, each rank's
// loader batch its block of them (64 / ranks), so the final weights are the same on every world
// size, and after any shrinking and growing among 1, 2, 4 and 8 ranks.
//   usage: elastic_worker OUT NAME EPOCHS MIN_RANKS [join]
#include <coltrain/coltrain.hpp>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ct = coltrain;

namespace {

constexpr std::int64_t kTrainSamples = 1152;
constexpr std::int64_t kTestSamples = 288;
constexpr std::int64_t kBatch = 32;
constexpr std::int64_t kGlobalBatch = 64;  // deterministic mode
constexpr int kMicroShards = 8;

ct::data::ImageDataset first(const ct::data::ImageDataset& all, std::int64_t count) {
  const auto image = static_cast<std::size_t>(all.image_shape().size());
  const auto n = static_cast<std::size_t>(count);
  return {all.image_shape(),
          std::vector<std::uint8_t>(all.pixels().begin(), all.pixels().begin() + n * image),
          std::vector<std::int32_t>(all.labels().begin(), all.labels().begin() + n),
          all.num_classes()};
}

struct Fault {
  int rank = -1;
  std::int64_t step = 0;
  int signal = SIGKILL;
};

// MNIST's transform, recording every sample and raising the fault's signal at its step.
struct RecordingTransform {
  struct Shared {
    std::ofstream log;
    std::int64_t loaded_in_epoch0 = 0;
    bool strike = false;
    std::int64_t strike_at = 0;
    int signal = SIGKILL;
  };
  ct::data::ImageTransform inner = ct::data::mnist_transform();
  std::shared_ptr<Shared> shared;

  ct::data::ImageShape output_shape(ct::data::ImageShape shape) const {
    return inner.output_shape(shape);
  }
  void apply(std::span<const std::uint8_t> image, ct::data::ImageShape shape,
             ct::data::SampleKey key, std::span<float> out) const {
    if (key.epoch == 0) {
      if (shared->strike && shared->loaded_in_epoch0 == shared->strike_at) {
        shared->log.flush();
        std::raise(shared->signal);
      }
      ++shared->loaded_in_epoch0;
    }
    shared->log << key.epoch << ' ' << key.index << '\n';
    inner.apply(image, shape, key, out);
  }
};

// The fault of `rank` in FAULT's list, or none (rank -1).
Fault fault_of(int rank, const char* text) {
  std::string list = text == nullptr ? "" : text;
  while (!list.empty()) {
    const auto comma = list.find(',');
    const std::string spec = list.substr(0, comma);
    list = comma == std::string::npos ? "" : list.substr(comma + 1);
    const auto first_colon = spec.find(':'), second_colon = spec.rfind(':');
    Fault fault;
    fault.rank = std::stoi(spec.substr(0, first_colon));
    fault.step = std::stoll(spec.substr(first_colon + 1, second_colon - first_colon - 1));
    fault.signal = spec.substr(second_colon + 1) == "STOP" ? SIGSTOP : SIGKILL;
    if (fault.rank == rank) return fault;
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::cerr << "usage: elastic_worker OUT NAME EPOCHS MIN_RANKS [join]\n";
    return 2;
  }
  const std::string out = argv[1], name = argv[2];
  const int epochs = std::atoi(argv[3]), min_ranks = std::atoi(argv[4]);
  const bool join = argc == 6 && std::strcmp(argv[5], "join") == 0;
  try {
    const ct::LaunchEnv env = ct::detect_launch_env();
    const Fault fault = fault_of(env.rank, std::getenv("FAULT"));
    const char* deterministic_env = std::getenv("DETERMINISTIC");
    const bool deterministic =
        deterministic_env != nullptr && std::strcmp(deterministic_env, "1") == 0;
    const auto all_train =
        ct::data::load_mnist(ct::data::default_mnist_dir(), ct::data::Split::kTrain);
    const auto all_test =
        ct::data::load_mnist(ct::data::default_mnist_dir(), ct::data::Split::kTest);
    const ct::data::ImageDataset train = first(all_train, kTrainSamples);
    const ct::data::ImageDataset test = first(all_test, kTestSamples);

    ct::comm::ElasticGroup group(env, ct::comm::comm_options_from_env(),
                                 {.min_ranks = min_ranks, .join = join});
    using Net = ct::nn::Network<ct::models::Mlp, float>;
    Net net({.threads = 1, .seed = 7});
    ct::optim::PrecisionOptimizer<ct::optim::Fp32, ct::optim::Sgd> sgd(
        ct::optim::parameters_of(net), ct::optim::Sgd({.lr = 0.05, .momentum = 0.9}));

    RecordingTransform transform;
    transform.shared = std::make_shared<RecordingTransform::Shared>();
    transform.shared->log.open(out + "/samples." + name);
    transform.shared->strike = !join && env.rank == fault.rank;
    const std::int64_t batch = deterministic ? kGlobalBatch / group.size() : kBatch;
    transform.shared->strike_at = fault.step * batch;
    transform.shared->signal = fault.signal;
    ct::data::DistributedSampler sampler(train.size(),
                                         {.num_replicas = group.size(),
                                          .rank = group.rank(),
                                          .seed = 3,
                                          .global_batch = deterministic ? kGlobalBatch : 0});
    // No prefetching: a sample is loaded when its step starts, so the fault strikes at a fixed
    // step.
    ct::data::Loader<float, RecordingTransform> train_loader(
        train, sampler, {.batch_size = batch, .prefetch = 0}, transform);
    // The trainer shares the validation set among the ranks itself; its samples are not recorded.
    RecordingTransform evaluation{.shared = std::make_shared<RecordingTransform::Shared>()};
    ct::data::Loader<float, RecordingTransform> test_loader(
        test, std::vector<std::int64_t>{}, {.batch_size = 96, .prefetch = 0}, evaluation);

    ct::train::Trainer trainer(net, sgd, group, [](std::int64_t) { return 0.05; },
                               {.epochs = epochs,
                                .checkpoint_dir = out + "/checkpoints",
                                .checkpoint_every = epochs,
                                .model_name = "mlp",
                                .progress = false,
                                .report = false},
                               {.micro_shards = deterministic ? kMicroShards : 0});
    trainer.fit(train_loader, test_loader);

    std::uint64_t hash = 14695981039346656037ull;
    net.visit_parameters([&](const std::string&, auto& parameter) {
      for (const std::byte b : std::as_bytes(parameter.value.span())) {
        hash ^= static_cast<unsigned char>(b);
        hash *= 1099511628211ull;
      }
    });
    std::cout << "final-weights " << std::hex << hash << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cout << "error: " << e.what() << std::endl;
    return 1;
  }
}
