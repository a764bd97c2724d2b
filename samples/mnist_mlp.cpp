// Trains the 784-128-256-10 multilayer perceptron on MNIST, data-parallel on every rank the
// launcher started. Without --data it uses the MNIST subset shipped in data/mnist.
//
//   mpicxx -std=c++20 -O3 -march=native -flto=auto -I include samples/mnist_mlp.cpp -lz -o mnist_mlp
//   mpiexec -n 2 ./mnist_mlp --epochs 20 --lr 0.1
#include "common/training_sample.hpp"

int main(int argc, char** argv) {
  sample::CommandLine app("coltrain: a multilayer perceptron on MNIST, data-parallel", "mnist_mlp");
  sample::Options options;
  options.epochs = 20;
  options.lr = 0.1;
  sample::add_options(app, options);
  return sample::run_main(app, options, argc, argv, [&] {
    const auto [train, test] = sample::load_mnist(options);
    const auto transform = coltrain::data::mnist_transform();
    return sample::train_classifier<coltrain::models::Mlp>(options, "mlp", train, test, transform,
                                                           transform);
  });
}
