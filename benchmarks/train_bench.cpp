// Training throughput on synthetic data: images per second of a full training step (forward,
// softmax cross-entropy, backward, SGD with momentum 0.9) for each model, one line per model, and
// the achieved GFLOP/s, counted as 3 x the forward pass's multiply-accumulates x 2. The PyTorch side
// of the comparison is benchmarks/reference/torch_train_bench.py (same models, step and output);
// scripts/bench_train runs both.
//
//   build/benchmarks/train_bench --model mlp,resnet20 --batch 64 --threads 2 --seconds 3
//       [--precision fp32|fp16|bf16] [--csv FILE]

#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>
#include <coltrain/models.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace coltrain;

struct Settings {
  int batch = 64;
  int threads = 2;
  double seconds = 3.0;
  int warmup = 3;
};

struct Result {
  double images_per_s = 0;
  double gflops = 0;
};

template <class Spec, class Precision>
Result measure(const Settings& settings) {
  using T = typename Precision::Storage;
  using Net = nn::Network<Spec, T>;
  Net net({.threads = settings.threads, .seed = 1});
  net.train();

  // Synthetic data: fixed images in [0, 1) and labels, as the PyTorch side uses.
  tensor::Tensor<T> images(Net::Input::batch(settings.batch));
  nn::Rng rng(2);
  for (T& v : images.span()) v = T(static_cast<float>(rng.uniform()));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(settings.batch));
  for (auto& label : labels) label = static_cast<std::int32_t>(rng.next() % 10);

  auto params = optim::parameters_of(net);
  optim::PrecisionOptimizer<Precision, optim::Sgd> optimizer(
      params, optim::Sgd({.lr = 0.01, .momentum = 0.9}));
  optimizer.use_threads(&net.context().pool());  // as the Trainer does
  nn::SoftmaxCrossEntropy loss;
  tensor::Tensor<T> grad_logits(Net::Output::batch(settings.batch));

  auto step = [&] {
    net.zero_grad();
    auto logits = net.forward(images.view());
    loss.loss_and_grad<T>(logits, labels, grad_logits.view(), optimizer.loss_scale());
    net.backward(grad_logits.view());
    optimizer.step(0.01);
  };
  for (int i = 0; i < settings.warmup; ++i) step();
  std::int64_t steps = 0;
  Stopwatch watch;
  do {
    step();
    ++steps;
  } while (watch.seconds() < settings.seconds);
  const double elapsed = watch.seconds();
  Result result;
  result.images_per_s = static_cast<double>(steps * settings.batch) / elapsed;
  result.gflops = 6.0 * static_cast<double>(Net::kForwardMacs) * result.images_per_s / 1e9;
  return result;
}

template <class Spec>
Result measure_with(const std::string& precision, const Settings& settings) {
  if (precision == "fp32") return measure<Spec, optim::Fp32>(settings);
  if (precision == "fp16") return measure<Spec, optim::MixedFp16>(settings);
  return measure<Spec, optim::MixedBf16>(settings);
}

using Runner = std::function<Result(const std::string&, const Settings&)>;

const std::map<std::string, Runner>& model_table() {
  static const std::map<std::string, Runner> table = {
      {"mlp", measure_with<models::Mlp>},
      {"mnist_convnet", measure_with<models::MnistConvNet>},
      {"cifar_net", measure_with<models::CifarNet>},
      {"resnet20", measure_with<models::ResNet<20>>},
      {"resnet32", measure_with<models::ResNet<32>>},
      {"resnet56", measure_with<models::ResNet<56>>},
      {"resnet18", measure_with<models::ResNet18>},
  };
  return table;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> items;
  std::stringstream stream(list);
  for (std::string item; std::getline(stream, item, ',');)
    if (!item.empty()) items.push_back(item);
  return items;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("coltrain training throughput on synthetic data (images/s and GFLOP/s)");
  std::string model_list = "mlp,mnist_convnet,cifar_net,resnet20";
  std::string precision = "fp32";
  std::string csv_path;
  Settings settings;
  std::string known;
  for (const auto& [name, runner] : model_table()) known += (known.empty() ? "" : ", ") + name;
  app.add_option("--model", model_list, "Comma-separated models: " + known)->capture_default_str();
  app.add_option("--batch", settings.batch, "Images per step")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--threads", settings.threads, "CPU threads")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seconds", settings.seconds, "Measured time per model")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--warmup", settings.warmup, "Untimed steps first")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--precision", precision, "fp32, or fp16/bf16 mixed precision (fp32 master weights)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--csv", csv_path, "Also write the results as CSV");
  CLI11_PARSE(app, argc, argv);

  const std::vector<std::string> names = split(model_list);
  for (const std::string& name : names)
    if (!model_table().contains(name)) {
      std::fprintf(stderr, "train_bench: unknown model '%s'; known: %s\n", name.c_str(), known.c_str());
      return 2;
    }

  std::ostringstream csv;
  csv << "model,batch,threads,precision,device,images_per_s,gflops\n";
  try {
    for (const std::string& name : names) {
      const Result r = model_table().at(name)(precision, settings);
      std::printf("%-14s batch %4d  threads %d  %-4s  cpu   %10.1f images/s  %7.1f GFLOP/s\n", name.c_str(),
                  settings.batch, settings.threads, precision.c_str(), r.images_per_s, r.gflops);
      std::fflush(stdout);
      csv << name << ',' << settings.batch << ',' << settings.threads << ',' << precision << ",cpu,"
          << r.images_per_s << ',' << r.gflops << '\n';
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "train_bench: %s\n", e.what());
    return 1;
  }
  if (!csv_path.empty()) {
    std::ofstream out(csv_path);
    out << csv.str();
    if (!out) {
      std::fprintf(stderr, "train_bench: cannot write %s\n", csv_path.c_str());
      return 1;
    }
  }
  return 0;
}
