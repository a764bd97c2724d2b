// The GPU trainer's pieces: device-side metrics against the CPU's, DeviceLoader against the host
// Loader, DeviceDataParallel over staged TCP against one rank on the whole batch, and
// DeviceTrainer's resume against an uninterrupted run, bit for bit, and its CUDA-graph steps
// against eager ones, also when evaluation grows device memory under the recorded step.
//
// Convolutions run as im2col + cuBLAS: cuDNN times its algorithms in each process, so a resumed
// run may pick others than the uninterrupted one and round differently (docs/gpu.md, known limits).
#define COLTRAIN_CUDA_CONV_IM2COL 1
#include "../support/temp_dir.hpp"
#include "../support/thread_ranks.hpp"

#include <coltrain/core/env_count.hpp>
#include <coltrain/cuda/nn.cuh>
#include <coltrain/cuda/optim/device_optimizer.cuh>
#include <coltrain/cuda/train/data_parallel.cuh>
#include <coltrain/cuda/train/metrics.cuh>
#include <coltrain/cuda/train/trainer.cuh>
#include <coltrain/data/device_loader.hpp>
#include <coltrain/data/mnist.hpp>
#include <coltrain/models.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/tensor/device_copy.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

using namespace coltrain;

namespace {

template <class T>
tensor::Tensor<T> random_logits(std::int64_t batch, std::int64_t classes, std::uint64_t seed) {
  tensor::Tensor<T> logits(tensor::Shape{batch, classes});
  nn::Rng rng(seed);
  for (T& v : logits.span()) v = T(static_cast<float>(std::floor(rng.uniform() * 8.0)));  // ties
  logits.span()[3] = T(std::numeric_limits<float>::quiet_NaN());  // NaN ranks above every number
  return logits;
}

data::ImageDataset mnist_subset(std::int64_t images) {
  const data::ImageDataset all = data::load_mnist(data::default_mnist_dir(), data::Split::kTrain);
  const auto pixels = static_cast<std::size_t>(all.image_shape().size());
  std::vector<std::uint8_t> bytes(all.pixels().begin(),
                                  all.pixels().begin() + static_cast<std::ptrdiff_t>(pixels * images));
  std::vector<std::int32_t> labels(all.labels().begin(), all.labels().begin() + images);
  return data::ImageDataset(all.image_shape(), std::move(bytes), std::move(labels));
}

}  // namespace

TEMPLATE_TEST_CASE("DeviceClassificationCounters counts as ClassificationMetrics", "", float, coltrain::half) {
  constexpr std::int64_t kBatch = 300, kClasses = 10;
  const auto logits = random_logits<TestType>(kBatch, kClasses, 7);
  tensor::Tensor<std::int32_t> labels(tensor::Shape{kBatch});
  for (std::int64_t i = 0; i < kBatch; ++i) labels.span()[i] = static_cast<std::int32_t>(i % 10);
  const auto device_logits = tensor::to_device(logits);
  const auto device_labels = tensor::to_device(labels);
  tensor::Tensor<float, tensor::Cuda> mean_loss(tensor::Shape{1});
  const float loss = 0.75f;
  COLTRAIN_CHECK_CUDA(cudaMemcpy(mean_loss.data(), &loss, sizeof loss, cudaMemcpyHostToDevice));

  train::DeviceClassificationCounters counters(kClasses);
  counters.reset(nullptr);
  for (int pass = 0; pass < 2; ++pass)
    counters.add_batch<TestType>(device_logits.view(), device_labels.view(), mean_loss.data(),
                                 nullptr);
  train::ClassificationMetrics on_device(kClasses), on_host(kClasses);
  counters.read_into(on_device, nullptr);
  for (int pass = 0; pass < 2; ++pass)
    on_host.add_batch<TestType>(logits.view(), labels.span(), loss);
  const auto a = on_device.counters(), b = on_host.counters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("counter " << i);
    CHECK(a[i] == b[i]);
  }
}

TEST_CASE("DeviceLoader hands out the host Loader's batches in device memory") {
  const data::ImageDataset dataset = mnist_subset(300);
  data::DistributedSampler sampler(dataset.size(), {.num_replicas = 1, .rank = 0, .seed = 3});
  data::Loader<float> host(dataset, sampler, {.batch_size = 64}, data::mnist_transform());
  data::Loader<float> reference(dataset, sampler, {.batch_size = 64}, data::mnist_transform());
  CudaStream stream;
  data::DeviceLoader<float> device(host, stream.get());
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
    device.start_epoch(epoch);
    reference.start_epoch(epoch);
    std::int64_t batches = 0;
    while (const data::DeviceBatch<float>* batch = device.next()) {
      const data::Batch<float>* expected = reference.next();
      REQUIRE(expected != nullptr);
      const auto images = tensor::to_host(batch->images, stream.get());
      const auto labels = tensor::to_host(batch->labels, stream.get());
      REQUIRE(images.shape() == expected->images.shape());
      CHECK(std::equal(images.span().begin(), images.span().end(),
                       expected->images.span().begin()));
      CHECK(std::equal(labels.span().begin(), labels.span().end(), expected->labels.begin()));
      CHECK(batch->number == expected->number);
      ++batches;
    }
    CHECK(reference.next() == nullptr);
    CHECK(batches == 5);  // 300 images in batches of 64: the last one of 44
  }
}

TEST_CASE("DeviceDataParallel over staged TCP: 2 ranks average to one rank on the whole batch") {
  using Net = nn::Network<models::Mlp, float, tensor::Cuda>;
  constexpr std::int64_t kHalf = 32;
  const data::ImageDataset dataset = mnist_subset(2 * kHalf);
  std::vector<std::int64_t> order(2 * kHalf);
  for (std::int64_t i = 0; i < 2 * kHalf; ++i) order[static_cast<std::size_t>(i)] = i;
  data::Loader<float> all(dataset, order, {.batch_size = 2 * kHalf}, data::mnist_transform());
  all.start_epoch(0);
  const data::Batch<float>* batch = all.next();
  REQUIRE(batch != nullptr);

  // The gradients of one step on `images`/`labels` rows [begin, begin + count).
  const auto step = [&](Net& net, std::int64_t begin, std::int64_t count,
                        const std::function<void()>& sync) {
    tensor::Tensor<float> images(Net::Input::batch(count));
    std::copy_n(batch->images.data() + begin * 784, count * 784, images.data());
    tensor::Tensor<std::int32_t> labels(tensor::Shape{count});
    std::copy_n(batch->labels.data() + begin, count, labels.data());
    const auto device_images = tensor::to_device(images);
    const auto device_labels = tensor::to_device(labels);
    nn::DeviceSoftmaxCrossEntropy loss;
    tensor::Tensor<float, tensor::Cuda> grad(Net::Output::batch(count));
    const auto logits = net.forward(device_images.view());
    loss.forward_backward<float>(logits, device_labels.view(), grad.view(), nullptr,
                                 net.context().stream());
    net.backward(grad.view());
    sync();
    std::vector<std::vector<float>> grads;
    net.visit_parameters([&](const std::string&, auto& parameter) {
      const auto host = tensor::to_host(parameter.grad, net.context().stream());
      grads.emplace_back(host.span().begin(), host.span().end());
    });
    return grads;
  };

  Net reference({.seed = 5});
  const auto expected = step(reference, 0, 2 * kHalf, [] {});
  std::vector<std::vector<std::vector<float>>> got(2);
  const auto failures = testing::run_thread_ranks(2, [&](comm::Communicator& comm) {
    Net net({.seed = 5});
    train::DeviceDataParallel ddp(net, comm, {.first_bucket_bytes = 4096, .bucket_bytes = 65536});
    testing::expect(ddp.buckets().size() > 2, "several buckets, so that some overlap backward");
    got[static_cast<std::size_t>(comm.rank())] =
        step(net, comm.rank() * kHalf, kHalf, [&] { ddp.finish_gradient_sync(); });
  });
  REQUIRE(testing::joined(failures).empty());
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(got[rank].size() == expected.size());
    for (std::size_t p = 0; p < expected.size(); ++p) {
      double error = 0, norm = 0;
      for (std::size_t i = 0; i < expected[p].size(); ++i) {
        error += std::pow(double(got[rank][p][i]) - expected[p][i], 2);
        norm += std::pow(double(expected[p][i]), 2);
      }
      INFO("rank " << rank << ", parameter " << p);
      CHECK(std::sqrt(error) <= 1e-5 * std::sqrt(norm) + 1e-12);
    }
  }
}

TEST_CASE("DeviceTrainer: a resumed run equals an uninterrupted one bit for bit") {
  using Net = nn::Network<models::MnistConvNet, float, tensor::Cuda>;
  // Under racecheck each step takes seconds: COLTRAIN_GPU_TEST_IMAGES=128 keeps every kernel and
  // both epochs' resume path at a quarter of the steps.
  const auto images = static_cast<std::int64_t>(
      detail::count_from_env("COLTRAIN_GPU_TEST_IMAGES", 512, 8192, "training images"));
  const data::ImageDataset train_set = mnist_subset(images);
  const data::ImageDataset test_set = mnist_subset(128);
  const auto run = [&](const std::filesystem::path& dir, std::int64_t epochs, bool resume) {
    std::vector<std::vector<float>> weights;
    const auto failures = testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
      Net net({.seed = 9});
      train::DeviceDataParallel ddp(net, comm);
      optim::DevicePrecisionOptimizer<optim::Fp32, optim::Sgd> sgd(
          net, optim::Sgd({.lr = 0.05, .momentum = 0.9}));
      data::DistributedSampler sampler(train_set.size(), {.num_replicas = 1, .rank = 0, .seed = 2});
      data::Loader<float> train(train_set, sampler, {.batch_size = 64}, data::mnist_transform());
      std::vector<std::int64_t> order(static_cast<std::size_t>(test_set.size()));
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
      data::Loader<float> test(test_set, order, {.batch_size = 128}, data::mnist_transform());
      std::ostringstream out;
      train::DeviceTrainer trainer(net, sgd, ddp, [](std::int64_t) { return 0.05; },
                                   {.epochs = epochs,
                                    .checkpoint_dir = dir,
                                    .model_name = "mnist_convnet",
                                    .resume = resume,
                                    .progress = false,
                                    .report = false,
                                    .out = &out});
      trainer.fit(train, test);
      net.visit_parameters([&](const std::string&, auto& parameter) {
        const auto host = tensor::to_host(parameter.value, net.context().stream());
        weights.emplace_back(host.span().begin(), host.span().end());
      });
    });
    REQUIRE(testing::joined(failures).empty());
    return weights;
  };
  // A directory of this process's own: two runs at once (say, under two sanitizers) must not
  // share checkpoints.
  const testing::TempDir root("coltrain_device_resume");
  const auto uninterrupted = run(root / "a", 2, false);
  run(root / "b", 1, false);
  const auto resumed = run(root / "b", 2, true);
  REQUIRE(resumed.size() == uninterrupted.size());
  for (std::size_t p = 0; p < resumed.size(); ++p) {
    INFO("parameter " << p);
    CHECK(resumed[p] == uninterrupted[p]);
  }
}

TEST_CASE("DeviceTrainer replays full-size steps from a CUDA graph on one rank") {
  using Net = nn::Network<models::Mlp, coltrain::half, tensor::Cuda>;
  const data::ImageDataset train_set = mnist_subset(1000);
  const auto failures = testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
    Net net({.seed = 4});
    train::DeviceDataParallel ddp(net, comm);
    optim::DevicePrecisionOptimizer<optim::MixedFp16, optim::Sgd> sgd(
        net, optim::Sgd({.lr = 0.1, .momentum = 0.9}));
    data::DistributedSampler sampler(train_set.size(), {.num_replicas = 1, .rank = 0, .seed = 1});
    data::Loader<coltrain::half> train(train_set, sampler, {.batch_size = 128}, data::mnist_transform());
    std::vector<std::int64_t> order(200);
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
    data::Loader<coltrain::half> test(train_set, order, {.batch_size = 100}, data::mnist_transform());
    std::ostringstream out;
    train::DeviceTrainer trainer(net, sgd, ddp, [](std::int64_t) { return 0.1; },
                                 {.epochs = 3, .progress = false, .report = false,
                                  .cuda_graph = true, .out = &out});
    const train::FitResult result = trainer.fit(train, test);
    // 8 batches an epoch: the first step eager, then 6 replays an epoch, the last (104) eager.
    testing::expect(trainer.graph_replays() == 6 + 7 + 7, "replays: " + out.str());
    testing::expect(result.validation.top1() > 0.5, "it learns: " + out.str());
  });
  REQUIRE(testing::joined(failures).empty());
}

TEST_CASE("DeviceTrainer records the graph again when evaluation grows device memory") {
  // Evaluation batches of 200 against training batches of 64: the first evaluation grows the
  // activations and the im2col workspace, which the step recorded before it pointed into.
  using Net = nn::Network<models::MnistConvNet, float, tensor::Cuda>;
  const data::ImageDataset train_set = mnist_subset(512);
  const data::ImageDataset test_set = mnist_subset(200);
  struct Run {
    std::vector<std::vector<float>> weights;
    double top1 = 0;
    std::int64_t replays = 0, recordings = 0;
  };
  const auto run = [&](bool cuda_graph) {
    Run result;
    const auto failures = testing::run_thread_ranks(1, [&](comm::Communicator& comm) {
      Net net({.seed = 5});
      train::DeviceDataParallel ddp(net, comm);
      optim::DevicePrecisionOptimizer<optim::Fp32, optim::Sgd> sgd(
          net, optim::Sgd({.lr = 0.05, .momentum = 0.9}));
      data::DistributedSampler sampler(train_set.size(), {.num_replicas = 1, .rank = 0, .seed = 3});
      data::Loader<float> train(train_set, sampler, {.batch_size = 64}, data::mnist_transform());
      std::vector<std::int64_t> order(static_cast<std::size_t>(test_set.size()));
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
      data::Loader<float> test(test_set, order, {.batch_size = 256}, data::mnist_transform());
      std::ostringstream out;
      train::DeviceTrainer trainer(
          net, sgd, ddp, [](std::int64_t) { return 0.05; },
          {.epochs = 3, .progress = false, .report = false, .cuda_graph = cuda_graph, .out = &out});
      result.top1 = trainer.fit(train, test).validation.top1();
      result.replays = trainer.graph_replays();
      result.recordings = trainer.graph_recordings();
      net.visit_parameters([&](const std::string&, auto& parameter) {
        const auto host = tensor::to_host(parameter.value, net.context().stream());
        result.weights.emplace_back(host.span().begin(), host.span().end());
      });
    });
    REQUIRE(testing::joined(failures).empty());
    return result;
  };
  const Run eager = run(false);
  const Run graph = run(true);
  // 8 batches an epoch, all full: the first step eager, every later one replayed.
  CHECK(graph.replays == 3 * 8 - 1);
  // Recorded after the first step and once more after the first evaluation, not per epoch.
  CHECK(graph.recordings == 2);
  CHECK(eager.recordings == 0);
  CHECK(std::abs(graph.top1 - eager.top1) <= 0.011);
  REQUIRE(graph.weights.size() == eager.weights.size());
  for (std::size_t p = 0; p < eager.weights.size(); ++p) {
    INFO("parameter " << p);
    double difference = 0, norm = 0;
    for (std::size_t i = 0; i < eager.weights[p].size(); ++i) {
      difference += std::pow(double(graph.weights[p][i]) - eager.weights[p][i], 2);
      norm += std::pow(double(eager.weights[p][i]), 2);
    }
    CHECK(std::sqrt(difference) <= 1e-5 * std::sqrt(norm) + 1e-7);
  }
}
