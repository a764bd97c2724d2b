// Trains a CIFAR ResNet (He et al. 2015: ResNet-20 by default, --depth 32 or 56; or --model
// resnet18) on CIFAR-10, data-parallel, with the paper's recipe: SGD with momentum 0.9, weight
// decay 1e-4, learning rate 0.1 for batch 128, pad-4 random crops and horizontal flips. The data
// is the official binary version (scripts/download-data fetches it):
//
//   mpicxx -std=c++20 -O3 -march=native -flto=auto -I include samples/cifar_resnet.cpp -lz -o cifar_resnet
//   mpiexec -n 4 ./cifar_resnet --data data/full/cifar-10-batches-bin --batch-size 32
//       --target-accuracy 0.80 --log-dir runs/resnet20 --checkpoint-dir runs/resnet20/checkpoints
// (one command; batch 32 on 4 ranks is the paper's global batch of 128).
//
// That build compiles ResNet-20 at fp32 alone; -DCOLTRAIN_SAMPLE_MODEL=resnet32, resnet56 or
// resnet18 and -DCOLTRAIN_SAMPLE_PRECISION=fp16 or bf16 compile another (=all: every one, at
// several times the compile time); CMake takes the same macros as cache variables.
#ifndef COLTRAIN_SAMPLE_MODEL
#define COLTRAIN_SAMPLE_MODEL resnet20
#endif

#include "common/training_sample.hpp"

#include <string>
#include <string_view>

namespace {

// The model this binary was compiled for, or "all".
constexpr std::string_view kCompiledModels = COLTRAIN_SAMPLE_STRING(COLTRAIN_SAMPLE_MODEL);
static_assert(kCompiledModels == "resnet20" || kCompiledModels == "resnet32" ||
                  kCompiledModels == "resnet56" || kCompiledModels == "resnet18" ||
                  kCompiledModels == "all",
              "COLTRAIN_SAMPLE_MODEL must be resnet20, resnet32, resnet56, resnet18 or all");

// Trains the model called `name` through `run.operator()<Model>()`. Only the compiled models are
// instantiated: this is a template because nvcc's front end, outside one, instantiates what a
// discarded `if constexpr` branch names (three unused ResNets cost 12 s of its device pass).
template <class Run>
int run_compiled_model(const std::string& name, const Run& run) {
  namespace models = coltrain::models;
  using sample::is_compiled;
  if constexpr (is_compiled(kCompiledModels, "resnet18"))
    if (name == "resnet18") return run.template operator()<models::ResNet18>();
  if constexpr (is_compiled(kCompiledModels, "resnet32"))
    if (name == "resnet32") return run.template operator()<models::ResNet<32>>();
  if constexpr (is_compiled(kCompiledModels, "resnet56"))
    if (name == "resnet56") return run.template operator()<models::ResNet<56>>();
  if constexpr (is_compiled(kCompiledModels, "resnet20"))
    if (name == "resnet20") return run.template operator()<models::ResNet<20>>();
  throw coltrain::InvalidArgument("no CIFAR ResNet named " + name);
}

}  // namespace

int main(int argc, char** argv) {
  sample::CommandLine app("coltrain: a ResNet on CIFAR-10, data-parallel", "cifar_resnet");
  sample::Options options;
  options.epochs = 160;
  options.lr = 0.1;
  options.weight_decay = 1e-4;
  options.schedule = "step";
  // The compiled model is the default.
  std::string model = kCompiledModels == "resnet18" ? "resnet18" : "resnet";
  int depth = kCompiledModels == "resnet32" ? 32 : kCompiledModels == "resnet56" ? 56 : 20;
  sample::add_options(app, options);
  app.option("--depth", depth, "CIFAR ResNet depth").choices({20, 32, 56}).show_default();
  app.option("--model", model,
             "resnet (CIFAR ResNet of --depth) or resnet18; compiled in: " +
                 std::string(kCompiledModels))
      .choices({"resnet", "resnet18"})
      .show_default();
  return sample::run_main(app, options, argc, argv, [&] {
    namespace data = coltrain::data;
    const std::string name = model == "resnet18" ? model : model + std::to_string(depth);
    sample::require_compiled("--model/--depth", name, "COLTRAIN_SAMPLE_MODEL", kCompiledModels);
    if (options.data.empty())
      throw coltrain::ConfigError(
          "--data: give the CIFAR-10 binary directory (scripts/download-data fetches it)");
    const data::ImageDataset train = data::load_cifar10(options.data, data::Split::kTrain);
    const data::ImageDataset test = data::load_cifar10(options.data, data::Split::kTest);
    const auto run = [&]<class Model>() -> int {
      return sample::train_classifier<Model>(options, name, train, test,
                                             data::cifar10_train_transform(options.seed),
                                             data::cifar10_eval_transform());
    };
    return run_compiled_model(name, run);
  });
}
