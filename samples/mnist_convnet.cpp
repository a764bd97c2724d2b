// Trains PyTorch's MNIST example network (conv 32, conv 64, max-pool, dropout, fc 128, fc 10)
// data-parallel on every rank the launcher started. Without --data it uses the 8,000 + 2,000 real
// MNIST digits shipped in data/mnist; with --data, a directory of the official IDX files.
//
//   mpicxx -std=c++20 -O3 -march=native -flto=auto -I include samples/mnist_convnet.cpp -lz -o mnist_convnet
//   mpiexec -n 2 ./mnist_convnet --epochs 10 --target-accuracy 0.97 --log-dir runs/convnet
#include "common/training_sample.hpp"

int main(int argc, char** argv) {
  sample::CommandLine app("coltrain: MnistConvNet on MNIST, data-parallel", "mnist_convnet");
  sample::Options options;
  options.epochs = 15;
  options.schedule = "constant";  // the recipe of benchmarks/reference/torch_ddp_mnist.py
  sample::add_options(app, options);
  return sample::run_main(app, options, argc, argv, [&] {
    const auto [train, test] = sample::load_mnist(options);
    const auto transform = coltrain::data::mnist_transform();
    return sample::train_classifier<coltrain::models::MnistConvNet>(options, "mnist_convnet", train,
                                                                    test, transform, transform);
  });
}
