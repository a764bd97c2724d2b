#pragma once
// What the sample trainers share: their command line and the data-parallel run it describes. Each
// sample (mnist_mlp.cpp, mnist_convnet.cpp, cifar_resnet.cpp) picks a model and a dataset and calls
// train_classifier<Model>(); this file shows how coltrain's pieces fit together:
//
//   communicator (MPI or TCP, from the launcher's environment)
//   -> Network<Model, Storage> -> DataParallel (parameters broadcast, gradient buckets)
//   -> PrecisionOptimizer<Policy, Sgd> + learning-rate schedule
//   -> DistributedSampler + Loader (background thread) for each rank's shard
//   -> Trainer::fit (epoch lines, metrics, profile, run records, checkpoints, resume)
//
// The precision is a template parameter of the network; --precision picks one of three
// instantiations at run time.

#include <coltrain/coltrain.hpp>

#include <CLI/CLI.hpp>

#include <cstdint>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sample {

namespace ct = coltrain;

struct Options {
  std::string backend = "auto";  // mpi, tcp, or auto (MPI under an MPI launcher, else TCP)
  int epochs = 10;
  std::int64_t batch_size = 64;  // per rank
  double lr = 0.05;              // for the whole (global) batch
  std::string schedule = "cosine";
  int warmup_epochs = 0;
  double momentum = 0.9;
  double weight_decay = 0;
  bool nesterov = false;
  std::string precision = "fp32";
  std::string data;  // dataset directory; MNIST defaults to the subset shipped in data/mnist
  std::string log_dir;
  std::optional<double> target_accuracy;
  std::string checkpoint_dir;
  int checkpoint_every = 1;
  bool resume = false;
  int threads = 1;  // per rank
  std::uint64_t seed = 1;
  bool progress = true;
};

// The options every sample takes; `defaults` are the sample's own recipe.
inline void add_options(CLI::App& app, Options& o) {
  app.add_option("--backend", o.backend, "mpi, tcp or auto")
      ->check(CLI::IsMember({"auto", "mpi", "tcp"}))
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "training epochs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "batch size per rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate (for the global batch)")->capture_default_str();
  app.add_option("--schedule", o.schedule, "cosine, step (/10 at 50% and 75%) or constant")
      ->check(CLI::IsMember({"cosine", "step", "constant"}))
      ->capture_default_str();
  app.add_option("--warmup-epochs", o.warmup_epochs, "linear warm-up epochs")
      ->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "SGD weight decay")->capture_default_str();
  app.add_flag("--nesterov", o.nesterov, "Nesterov momentum");
  app.add_option("--precision", o.precision, "fp32, fp16 or bf16 (mixed, fp32 master weights)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--data", o.data, "dataset directory");
  app.add_option("--log-dir", o.log_dir, "write config.json, metrics.jsonl and result.json here");
  app.add_option("--target-accuracy", o.target_accuracy,
                 "stop when validation accuracy reaches this (exit status 2 if never)");
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "save checkpoints here");
  app.add_option("--checkpoint-every", o.checkpoint_every, "epochs between checkpoints")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--resume", o.resume, "continue from the newest checkpoint in --checkpoint-dir");
  app.add_option("--threads", o.threads, "CPU threads per rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "initialisation, data order and dropout")->capture_default_str();
  app.add_flag("!--no-progress", o.progress, "no progress bar");
}

inline nlohmann::ordered_json to_json(const Options& o, const std::string& model, int world_size,
                                      const std::string& backend) {
  nlohmann::ordered_json config;
  config["model"] = model;
  config["backend"] = backend;
  config["world_size"] = world_size;
  config["epochs"] = o.epochs;
  config["batch_size_per_rank"] = o.batch_size;
  config["lr"] = o.lr;
  config["schedule"] = o.schedule;
  config["warmup_epochs"] = o.warmup_epochs;
  config["momentum"] = o.momentum;
  config["weight_decay"] = o.weight_decay;
  config["nesterov"] = o.nesterov;
  config["precision"] = o.precision;
  config["data"] = o.data;
  config["target_accuracy"] =
      o.target_accuracy ? nlohmann::ordered_json(*o.target_accuracy) : nullptr;
  config["threads_per_rank"] = o.threads;
  config["seed"] = o.seed;
  return config;
}

// The learning rate at each global step: warm-up, then cosine, step or constant.
inline std::function<double(std::int64_t)> make_schedule(const Options& o,
                                                         std::int64_t steps_per_epoch) {
  const std::int64_t warmup = o.warmup_epochs * steps_per_epoch;
  const std::int64_t rest =
      std::max<std::int64_t>(1, (o.epochs - o.warmup_epochs) * steps_per_epoch);
  std::function<double(std::int64_t)> after;
  if (o.schedule == "cosine")
    after = ct::optim::CosineAnnealingLr{.base_lr = o.lr, .t_max = rest};
  else if (o.schedule == "step")
    after = ct::optim::MultiStepLr{.base_lr = o.lr, .milestones = {rest / 2, rest * 3 / 4}};
  else
    after = ct::optim::ConstantLr{.base_lr = o.lr};
  return ct::optim::LinearWarmup<std::function<double(std::int64_t)>>{
      .warmup_steps = warmup, .start_factor = 0.1, .inner = std::move(after)};
}

// Trains Model on `train`, validating on `test`, across the ranks the launcher started. Returns the
// process exit status: 0, or 2 when a target accuracy was given and not reached.
template <class Model, class Policy, class TrainTransform, class EvalTransform>
int train_with_policy(const Options& o, const std::string& model_name, ct::comm::Communicator& comm,
                      const ct::data::ImageDataset& train, const ct::data::ImageDataset& test,
                      TrainTransform train_transform, EvalTransform eval_transform) {
  using T = typename Policy::Storage;
  const int rank = comm.rank(), world = comm.size();

  ct::nn::Network<Model, T> net({.threads = o.threads, .seed = o.seed});
  ct::train::DataParallel ddp(net, comm);  // every rank now holds rank 0's weights
  ct::optim::PrecisionOptimizer<Policy, ct::optim::Sgd> sgd(
      ct::optim::parameters_of(net), ct::optim::Sgd({.lr = o.lr,
                                                     .momentum = o.momentum,
                                                     .weight_decay = o.weight_decay,
                                                     .nesterov = o.nesterov}));

  // Each rank trains on its shard, reshuffled every epoch; validation shards are disjoint.
  ct::data::DistributedSampler sampler(
      train.size(), {.num_replicas = world, .rank = rank, .shuffle = true, .seed = o.seed});
  ct::data::Loader<T, TrainTransform> train_loader(train, sampler, {.batch_size = o.batch_size},
                                                   train_transform);
  std::vector<std::int64_t> shard;
  for (std::int64_t i = rank; i < test.size(); i += world) shard.push_back(i);
  ct::data::Loader<T, EvalTransform> test_loader(test, shard, {.batch_size = 256}, eval_transform);

  ct::train::Trainer trainer(
      net, sgd, ddp, make_schedule(o, train_loader.batches_per_epoch()),
      {.epochs = o.epochs,
       .target_accuracy = o.target_accuracy,
       .log_dir = o.log_dir,
       .checkpoint_dir = o.checkpoint_dir,
       .checkpoint_every = o.checkpoint_every,
       .model_name = model_name,
       .resume = o.resume,
       .progress = o.progress ? std::nullopt : std::optional<bool>(false),
       .config = to_json(o, model_name, world, std::string(ct::comm::name_of(comm.backend())))});
  if (rank == 0)
    std::cout << model_name << ": " << decltype(net)::kParameterCount << " parameters, " << world
              << (world == 1 ? " rank" : " ranks") << " (" << ct::comm::name_of(comm.backend())
              << ") x " << o.threads << (o.threads == 1 ? " thread" : " threads") << ", "
              << train.size() << " training and " << test.size() << " validation images, "
              << Policy::kName << "\n";
  const ct::train::FitResult result = trainer.fit(train_loader, test_loader);
  return o.target_accuracy && !result.time_to_target ? 2 : 0;
}

template <class Model, class TrainTransform, class EvalTransform>
int train_classifier(const Options& o, const std::string& model_name,
                     const ct::data::ImageDataset& train, const ct::data::ImageDataset& test,
                     TrainTransform train_transform, EvalTransform eval_transform) {
  std::optional<ct::comm::Backend> backend;
  if (o.backend != "auto") backend = ct::comm::parse_backend(o.backend);
  ct::comm::Communicator comm = ct::comm::Communicator::from_env(backend);
  if (o.precision == "fp16")
    return train_with_policy<Model, ct::optim::MixedFp16>(o, model_name, comm, train, test,
                                                          train_transform, eval_transform);
  if (o.precision == "bf16")
    return train_with_policy<Model, ct::optim::MixedBf16>(o, model_name, comm, train, test,
                                                          train_transform, eval_transform);
  return train_with_policy<Model, ct::optim::Fp32>(o, model_name, comm, train, test,
                                                   train_transform, eval_transform);
}

// The training and test sets of MNIST in o.data, or, when none is given, of the subset shipped
// in data/mnist (o.data is then set to where it was found, for the run record).
inline std::pair<ct::data::ImageDataset, ct::data::ImageDataset> load_mnist(Options& o) {
  if (o.data.empty()) o.data = ct::data::default_mnist_dir().string();
  return {ct::data::load_mnist(o.data, ct::data::Split::kTrain),
          ct::data::load_mnist(o.data, ct::data::Split::kTest)};
}

// main()'s body for a sample: parses the command line, runs `body`, and turns errors into a
// message and exit status 1 (coltrain's errors name the rank, peer, file or option at fault).
template <class Body>
int run_main(CLI::App& app, int argc, char** argv, Body&& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return body();
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace sample
