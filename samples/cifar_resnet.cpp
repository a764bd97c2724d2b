// Trains a CIFAR ResNet (He et al. 2015: ResNet-20 by default, --depth 32 or 56; or --model
// resnet18) on CIFAR-10, data-parallel, with the paper's recipe: SGD with momentum 0.9, weight
// decay 1e-4, learning rate 0.1 for batch 128, pad-4 random crops and horizontal flips. The data
// is the official binary version (scripts/download-data fetches it):
//
//   mpicxx -std=c++20 -O3 -march=native -I include samples/cifar_resnet.cpp -lz -o cifar_resnet
//   mpiexec -n 4 ./cifar_resnet --data data/full/cifar-10-batches-bin --batch-size 32
//       --target-accuracy 0.80 --log-dir runs/resnet20 --checkpoint-dir runs/resnet20/checkpoints
// (one command; batch 32 on 4 ranks is the paper's global batch of 128).
#include "common/training_sample.hpp"

int main(int argc, char** argv) {
  CLI::App app("coltrain: a ResNet on CIFAR-10, data-parallel", "cifar_resnet");
  sample::Options options;
  options.epochs = 160;
  options.lr = 0.1;
  options.weight_decay = 1e-4;
  options.schedule = "step";
  int depth = 20;
  std::string model = "resnet";
  sample::add_options(app, options);
  app.add_option("--depth", depth, "CIFAR ResNet depth")
      ->check(CLI::IsMember({20, 32, 56}))
      ->capture_default_str();
  app.add_option("--model", model, "resnet (CIFAR ResNet of --depth) or resnet18")
      ->check(CLI::IsMember({"resnet", "resnet18"}))
      ->capture_default_str();
  return sample::run_main(app, argc, argv, [&] {
    namespace data = coltrain::data;
    namespace models = coltrain::models;
    if (options.data.empty())
      throw coltrain::ConfigError(
          "--data: give the CIFAR-10 binary directory (scripts/download-data fetches it)");
    const data::ImageDataset train = data::load_cifar10(options.data, data::Split::kTrain);
    const data::ImageDataset test = data::load_cifar10(options.data, data::Split::kTest);
    const auto run = [&]<class Model>(const std::string& name) {
      return sample::train_classifier<Model>(options, name, train, test,
                                             data::cifar10_train_transform(options.seed),
                                             data::cifar10_eval_transform());
    };
    if (model == "resnet18") return run.operator()<models::ResNet18>("resnet18");
    if (depth == 32) return run.operator()<models::ResNet<32>>("resnet32");
    if (depth == 56) return run.operator()<models::ResNet<56>>("resnet56");
    return run.operator()<models::ResNet<20>>("resnet20");
  });
}
