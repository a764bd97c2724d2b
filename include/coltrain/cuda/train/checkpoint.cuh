#pragma once
// Checkpoints of a training run on the GPU: save_checkpoint and load_checkpoint for a network in
// device memory (nn::Network<Spec, T, tensor::Cuda>) and its DevicePrecisionOptimizer, with the
// signatures and semantics of the CPU ones in train/checkpoint.hpp, whose writer and reader they
// share: the same three files (weights under PyTorch's names, optimizer state with the fp32
// masters, the sidecar), atomic writes, pruning to `keep`, and the same checks before anything
// changes. The weights and buffers are copied to the host under their state_dict names and the
// optimizer's state is exported as an optim::OptimizerSnapshot, so a checkpoint saved here loads
// on the CPU and in PyTorch, and one saved on the CPU loads here. The sidecar also records the
// device optimizer's steps taken and skipped (a CPU checkpoint has neither; see import_state).
//
// Both wait for the network's and the optimizer's streams; call them between steps, outside
// stream capture. A step replayed from a CUDA graph does not advance the context's host-side step
// (see cuda/nn/dropout.cuh): set_step() it to the steps trained before saving, so that the
// recorded step resumes the dropout masks where the run was.

#if !defined(__CUDACC__)
#error "coltrain/cuda/train/checkpoint.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/cuda/optim/device_optimizer.cuh>
#include <coltrain/nn/cuda_context.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/tensor/device.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/state_dict.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::train {
namespace detail {

// A device network's state_dict tensors (parameters, then buffers, in state_dict order): where
// each lives on the device and, when downloaded, a host copy that `tensors` views.
struct DeviceStateTensors {
  std::vector<StateTensor> tensors;
  std::vector<void*> device;
  std::vector<std::vector<std::byte>> host;
};

template <class Spec, class T>
DeviceStateTensors device_state_tensors(nn::Network<Spec, T, tensor::Cuda>& network,
                                        bool download) {
  DeviceStateTensors out;
  auto add = [&](const std::string& name, auto& tensor) {
    using U = std::remove_cvref_t<decltype(*tensor.data())>;
    const auto dims = tensor.shape().dims();
    out.tensors.push_back(
        {name, data_type_v<U>, std::vector<std::int64_t>(dims.begin(), dims.end()), {}});
    out.device.push_back(tensor.data());
    out.host.emplace_back(download ? static_cast<std::size_t>(tensor.numel()) * sizeof(U) : 0);
  };
  network.visit_parameters(
      [&](const std::string& name, auto& parameter) { add(name, parameter.value); });
  network.visit_buffers([&](const std::string& name, auto& buffer) { add(name, buffer); });
  if (download) {
    for (std::size_t i = 0; i < out.host.size(); ++i) {
      if (out.host[i].empty()) continue;
      COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(out.host[i].data(), out.device[i], out.host[i].size(),
                                          cudaMemcpyDeviceToHost, network.context().stream()));
      out.tensors[i].bytes = out.host[i];
    }
    network.context().synchronize();
  }
  return out;
}

}  // namespace detail

// Saves a checkpoint of `network` (an nn::Network on the GPU) and `optimizer` (built from its
// parameters, optim::device_parameters_of) into `dir`, as the CPU overload does; returns the new
// files. Throws as the CPU overload, and CudaError for a failed copy.
template <class Spec, class T, class Precision, class Optimizer>
CheckpointFiles save_checkpoint(
    const std::filesystem::path& dir, nn::Network<Spec, T, tensor::Cuda>& network,
    const optim::DevicePrecisionOptimizer<Precision, Optimizer>& optimizer,
    const TrainingState& state, const CheckpointOptions& options = {}) {
  // The optimizer's stream first: its last update writes the model's values.
  const optim::OptimizerSnapshot snapshot = optimizer.export_state();
  const detail::DeviceStateTensors model = detail::device_state_tensors(network, true);
  return detail::write_checkpoint<Precision>(dir, detail::model_record(network, model.tensors),
                                             optimizer.optimizer(), optimizer.scaler_options(),
                                             snapshot, state, options);
}

// Restores a checkpoint (saved on the GPU or the CPU) into `network` and `optimizer`, built as for
// training, as the CPU overload does: everything is checked before anything changes; returns the
// epoch, global step and extra data saved with it. Throws as the CPU overload, and CudaError for a
// failed copy.
template <class Spec, class T, class Precision, class Optimizer>
TrainingState load_checkpoint(const std::filesystem::path& path,
                              nn::Network<Spec, T, tensor::Cuda>& network,
                              optim::DevicePrecisionOptimizer<Precision, Optimizer>& optimizer,
                              const CheckpointOptions& options = {}) {
  std::vector<std::string> parameter_names;
  for (std::size_t p = 0; p < optimizer.size(); ++p) {
    parameter_names.push_back(optimizer.parameter_name(p));
  }
  // State exists from the first step taken, for an optimizer that keeps any (not plain SGD).
  const bool has_state =
      !detail::OptimizerRecord<Optimizer>::state_suffixes(optimizer.optimizer()).empty() &&
      optimizer.steps_taken() > 0;
  const detail::DeviceStateTensors model = detail::device_state_tensors(network, false);
  detail::CheckpointContents contents = detail::read_checkpoint<Precision>(
      path, detail::model_record(network, model.tensors), optimizer.optimizer(),
      optimizer.scaler_options(), parameter_names, has_state, options);

  // Everything fits: copy.
  optimizer.import_state(contents.optimizer);
  for (std::size_t i = 0; i < model.tensors.size(); ++i) {
    const std::span<const std::byte> bytes = contents.model.bytes(model.tensors[i].name);
    if (bytes.empty()) continue;
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(model.device[i], bytes.data(), bytes.size(),
                                        cudaMemcpyHostToDevice, network.context().stream()));
  }
  network.context().synchronize();  // the file's bytes go out of scope
  network.context().set_step(contents.context_step);
  return std::move(contents.state);
}

}  // namespace coltrain::train
