#pragma once
// What the sample trainers share: their command line (sample_options.hpp) and the data-parallel run
// it describes. Each sample (mnist_mlp.cpp, mnist_convnet.cpp, cifar_resnet.cpp) picks a model and
// a dataset and calls train_classifier<Model>(), which picks the device and the precision: a
// template parameter of the network, so each one compiled in is an instantiation of the whole
// training stack (training_run.hpp on the CPU, cuda_training.cuh on the GPU under nvcc).

#include "sample_options.hpp"
#include "training_run.hpp"

#if defined(__CUDACC__)
#include "cuda_training.cuh"
#endif

#include <coltrain/coltrain.hpp>

#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace sample {

#if defined(__CUDACC__)
// This rank's CUDA device (core/device_selection.hpp), made current so that the communicator and
// everything after it use it.
inline int use_cuda_device_of_this_rank() {
  int visible = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&visible); status != cudaSuccess) {
    throw ct::ConfigError(std::string("--device cuda: the CUDA runtime finds no usable device (") +
                          cudaGetErrorString(status) + ")");
  }
  const int device = ct::select_cuda_device(ct::detect_launch_env(), visible);
  COLTRAIN_CHECK_CUDA(cudaSetDevice(device));
  return device;
}
#endif

// Trains Model at o.precision on o.device (see train_classifier).
template <class Model, class Policy, class Group, class TrainTransform, class EvalTransform>
int train_on_device(const Options& o, const std::string& model_name, Group& comm,
                    const ct::data::ImageDataset& train, const ct::data::ImageDataset& test,
                    TrainTransform train_transform, EvalTransform eval_transform) {
  // Only the compiled devices are instantiated (COLTRAIN_SAMPLE_DEVICE, sample_options.hpp).
#if defined(__CUDACC__)
  if constexpr (is_compiled(kCompiledDevices, "cuda") &&
                std::is_same_v<Group, ct::comm::Communicator>) {
    if (o.cuda_device) {
      return train_classifier_on_cuda<Model, Policy>(o, model_name, comm, *o.cuda_device, train,
                                                     test, train_transform, eval_transform);
    }
  }
#endif
  if constexpr (is_compiled(kCompiledDevices, "cpu")) {
    return train_with_policy<Model, Policy>(o, model_name, comm, train, test, train_transform,
                                            eval_transform);
  }
  // resolve_and_check already refused a device this binary was not compiled for.
  throw ct::InvalidArgument("--device " + o.device + ": not compiled into this binary");
}

// Trains Model at o.precision (see train_classifier) over `comm`: a Communicator, or an
// ElasticGroup under --elastic.
template <class Model, class Group, class TrainTransform, class EvalTransform>
int train_at_precision(const Options& o, const std::string& model_name, Group& comm,
                       const ct::data::ImageDataset& train, const ct::data::ImageDataset& test,
                       TrainTransform train_transform, EvalTransform eval_transform) {
  // Only the compiled precisions are instantiated (sample_options.hpp).
  if constexpr (is_compiled(kCompiledPrecisions, "fp16")) {
    if (o.precision == "fp16")
      return train_on_device<Model, ct::optim::MixedFp16>(o, model_name, comm, train, test,
                                                          train_transform, eval_transform);
  }
  if constexpr (is_compiled(kCompiledPrecisions, "bf16")) {
    if (o.precision == "bf16")
      return train_on_device<Model, ct::optim::MixedBf16>(o, model_name, comm, train, test,
                                                          train_transform, eval_transform);
  }
  if constexpr (is_compiled(kCompiledPrecisions, "fp32")) {
    if (o.precision == "fp32")
      return train_on_device<Model, ct::optim::Fp32>(o, model_name, comm, train, test,
                                                     train_transform, eval_transform);
  }
  require_compiled("--precision", o.precision, "COLTRAIN_SAMPLE_PRECISION", kCompiledPrecisions);
  throw ct::InvalidArgument("--precision " + o.precision + ": not fp32, fp16 or bf16");
}

// Trains Model on `train`, validating on `test`, across the ranks the launcher started, on
// o.device at o.precision (both checked by resolve_and_check). Returns the process exit status: 0,
// or 2 when a target accuracy was given and not reached.
template <class Model, class TrainTransform, class EvalTransform>
int train_classifier(const Options& options, const std::string& model_name,
                     const ct::data::ImageDataset& train, const ct::data::ImageDataset& test,
                     TrainTransform train_transform, EvalTransform eval_transform) {
  Options o = options;
#if defined(__CUDACC__)
  if (o.device == "cuda") o.cuda_device = use_cuda_device_of_this_rank();
#endif
  std::optional<ct::comm::Backend> backend;
  if (o.backend != "auto") backend = ct::comm::parse_backend(o.backend);
  // On the GPU, a communicator for device buffers: NCCL when this build has it (comm::from_env).
  const ct::comm::Memory memory =
      o.device == "cuda" ? ct::comm::Memory::kDevice : ct::comm::Memory::kHost;
  if (!o.trace.empty()) ct::Timeline::instance().enable(o.trace);
  ct::comm::CommOptions comm_options = ct::comm::comm_options_from_env();
  if (o.deterministic) comm_options.deterministic = true;
  // The flight recorder writes into the run directory unless COLTRAIN_TRACE_DIR says elsewhere.
  if (comm_options.trace_dir.empty() && !o.log_dir.empty()) comm_options.trace_dir = o.log_dir;
  // Elastic training is the CPU trainer's (resolve_and_check refuses it elsewhere), so a binary
  // without the CPU path does not compile it.
  if constexpr (is_compiled(kCompiledDevices, "cpu")) {
    if (o.elastic) {
      ct::comm::ElasticGroup group(ct::detect_launch_env(), comm_options,
                                   {.min_ranks = o.min_ranks, .join = o.join});
      return train_at_precision<Model>(o, model_name, group, train, test, train_transform,
                                       eval_transform);
    }
  }
  ct::comm::Communicator comm = ct::comm::Communicator::from_env(backend, comm_options, memory);
  return train_at_precision<Model>(o, model_name, comm, train, test, train_transform,
                                   eval_transform);
}

// The training and test sets of MNIST in o.data, or, when none is given, of the subset shipped
// in data/mnist (o.data is then set to where it was found, for the run record).
inline std::pair<ct::data::ImageDataset, ct::data::ImageDataset> load_mnist(Options& o) {
  if (o.data.empty()) o.data = ct::data::default_mnist_dir().string();
  return {ct::data::load_mnist(o.data, ct::data::Split::kTrain),
          ct::data::load_mnist(o.data, ct::data::Split::kTest)};
}

// main()'s body for a sample: parses the command line, resolves and checks the device and
// precision in `o` before anything is loaded, runs `body`, and turns errors into a message and
// exit status 1 (coltrain's errors name the rank, peer, file or option at fault).
template <class Body>
int run_main(CommandLine& app, Options& o, int argc, char** argv, Body&& body) {
  if (const std::optional<int> status = app.parse(argc, argv, std::cout, std::cerr)) return *status;
  try {
    resolve_and_check(o, app.program());
    return body();
  } catch (const std::exception& e) {
    std::cerr << app.program() << ": error: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace sample
