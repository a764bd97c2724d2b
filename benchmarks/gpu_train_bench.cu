// Training throughput on the GPU: images per second of a full training step (forward, softmax
// cross-entropy, backward, SGD with momentum 0.9 through DevicePrecisionOptimizer) on synthetic
// data, eagerly and replayed as one CUDA graph. The PyTorch side of the comparison is
// benchmarks/reference/torch_gpu_train_bench.py (eager, AMP, channels-last; same models and step).
//
//   build-gpu/benchmarks/gpu_train_bench --model mnist_convnet,resnet20 --batch 512
//       --precision fp16 [--steps 50] [--rounds 5] [--csv FILE]

#include <coltrain/cuda/nn.cuh>
#include <coltrain/cuda/optim/device_optimizer.cuh>
#include <coltrain/models.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/tensor/device_copy.hpp>
#include <coltrain/train/cuda_graph.hpp>

#include <cuda_profiler_api.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace coltrain;

struct Settings {
  int batch = 512;
  int steps = 50;
  int rounds = 5;
  bool profile = false;  // run `steps` eager steps between cudaProfilerStart/Stop, time nothing
};

struct Result {
  double eager = 0, graph = 0;  // median images/s
  float final_loss = 0, loss_scale = 0;
  std::int64_t skipped = 0;
  std::size_t graph_nodes = 0;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Images/s of `rounds` rounds of `steps` calls of run_step, timed with events on `stream`.
template <class F>
double time_rounds(const Settings& s, cudaStream_t stream, F&& run_step) {
  cudaEvent_t start, stop;
  COLTRAIN_CHECK_CUDA(cudaEventCreate(&start));
  COLTRAIN_CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> rates;
  for (int round = 0; round < s.rounds; ++round) {
    COLTRAIN_CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < s.steps; ++i) run_step();
    COLTRAIN_CHECK_CUDA(cudaEventRecord(stop, stream));
    COLTRAIN_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    COLTRAIN_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    rates.push_back(double(s.steps) * s.batch / (ms / 1e3));
  }
  COLTRAIN_CHECK_CUDA(cudaEventDestroy(start));
  COLTRAIN_CHECK_CUDA(cudaEventDestroy(stop));
  return median(rates);
}

template <class Spec, class Precision>
Result measure(const Settings& s) {
  using T = typename Precision::Storage;
  using Net = nn::Network<Spec, T, tensor::Cuda>;
  Net net({.seed = 1});
  net.train();
  cudaStream_t stream = net.context().stream();

  // Synthetic data, as the PyTorch side: images in [0, 1), labels in [0, 10).
  tensor::Tensor<T> host_images(Net::Input::batch(s.batch));
  nn::Rng rng(2);
  for (T& v : host_images.span()) v = T(static_cast<float>(rng.uniform()));
  tensor::Tensor<std::int32_t> host_labels(tensor::Shape{s.batch});
  for (auto& label : host_labels.span()) label = static_cast<std::int32_t>(rng.next() % 10);
  const auto images = tensor::to_device(host_images);
  const auto labels = tensor::to_device(host_labels);
  tensor::Tensor<T, tensor::Cuda> grad(Net::Output::batch(s.batch));

  nn::DeviceSoftmaxCrossEntropy loss;
  optim::DevicePrecisionOptimizer<Precision, optim::Sgd> optimizer(
      net, optim::Sgd({.lr = 0.01, .momentum = 0.9}));
  auto step = [&] {
    const auto logits = net.forward(images.view());
    loss.forward_backward<T>(logits, labels.view(), grad.view(), optimizer.loss_scale_device(),
                             stream);
    net.backward(grad.view());
    optimizer.step();  // also zeroes the gradients
  };

  Result result;
  for (int i = 0; i < 5; ++i) step();  // sizes every tensor, picks cuDNN algorithms
  net.context().synchronize();
  if (s.profile) {  // for `ncu --profile-from-start off`: the steady state's kernels only
    COLTRAIN_CHECK_CUDA(cudaProfilerStart());
    for (int i = 0; i < s.steps; ++i) step();
    net.context().synchronize();
    COLTRAIN_CHECK_CUDA(cudaProfilerStop());
    return result;
  }
  result.eager = time_rounds(s, stream, step);
  const auto graph = train::CudaGraph::capture(stream, step);
  result.graph_nodes = graph.node_count();
  for (int i = 0; i < 3; ++i) graph.replay(stream);
  result.graph = time_rounds(s, stream, [&] { graph.replay(stream); });
  result.final_loss = loss.read_loss(stream);
  result.loss_scale = optimizer.loss_scale();
  result.skipped = optimizer.steps_skipped();
  if (!std::isfinite(result.final_loss))
    throw Error("training diverged: the last loss is " + std::to_string(result.final_loss));
  return result;
}

template <class Precision>
Result measure_model(const std::string& model, const Settings& s) {
  if (model == "mnist_convnet") return measure<models::MnistConvNet, Precision>(s);
  if (model == "resnet20") return measure<models::ResNet<20>, Precision>(s);
  if (model == "cifar_net") return measure<models::CifarNet, Precision>(s);
  throw InvalidArgument("unknown model '" + model + "' (mnist_convnet, cifar_net, resnet20)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"coltrain training throughput on the GPU"};
  std::string model_list = "mnist_convnet,resnet20", precision = "fp16", csv_path;
  Settings s;
  app.add_option("--model", model_list, "comma-separated: mnist_convnet, cifar_net, resnet20");
  app.add_option("--batch", s.batch)->check(CLI::PositiveNumber);
  app.add_option("--precision", precision)->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--steps", s.steps, "steps per timed round")->check(CLI::PositiveNumber);
  app.add_option("--rounds", s.rounds)->check(CLI::PositiveNumber);
  app.add_flag("--profile", s.profile,
               "after the warm-up, run --steps eager steps between cudaProfilerStart and Stop "
               "(for ncu --profile-from-start off) and time nothing");
  app.add_option("--csv", csv_path,
                 "write model,batch,threads,precision,device,images_per_s,gflops");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::string> rows;
  std::stringstream list(model_list);
  for (std::string model; std::getline(list, model, ',');) {
    const Result r = precision == "fp32"   ? measure_model<optim::Fp32>(model, s)
                     : precision == "fp16" ? measure_model<optim::MixedFp16>(model, s)
                                           : measure_model<optim::MixedBf16>(model, s);
    std::printf(
        "%-14s batch %4d  %s  cuda  eager %10.1f images/s  graph %10.1f images/s  "
        "(%zu nodes; last loss %.4f, loss scale %g, %lld skipped)\n",
        model.c_str(), s.batch, precision.c_str(), r.eager, r.graph, r.graph_nodes, r.final_loss,
        r.loss_scale, static_cast<long long>(r.skipped));
    std::fflush(stdout);
    rows.push_back(model + "," + std::to_string(s.batch) + ",1," + precision + ",cuda," +
                   std::to_string(r.graph) + ",");
  }
  if (!csv_path.empty()) {
    std::ofstream csv(csv_path);
    csv << "model,batch,threads,precision,device,images_per_s,gflops\n";
    for (const auto& row : rows) csv << row << '\n';
  }
  return 0;
}
