#pragma once
// A network's weights as a safetensors file in PyTorch's state_dict layout: every parameter and
// buffer under its state_dict name, in the dtype the network stores it (F32, or F16/BF16 for 16-bit
// storage; BatchNorm's running statistics in the compute type, num_batches_tracked as I64). Such a
// file loads into the PyTorch twin with load_state_dict(strict=True), and a PyTorch state_dict
// saved as safetensors (with matching dtypes) loads here.
//
// Loading is strict as PyTorch's: every tensor of the network must be in the file with the same
// dtype and shape, and the file must hold nothing else. Everything is checked before anything is
// copied, so a failed load leaves the network as it was.

#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/device.hpp>
#include <coltrain/tensor/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace coltrain::train {

// One tensor of a network's state_dict, viewed as bytes.
struct StateTensor {
  std::string name;
  DataType dtype;
  std::vector<std::int64_t> shape;
  std::span<std::byte> bytes;
};

// The parameters of `network` (an nn::Network on the CPU), then its buffers, each in state_dict
// order.
template <class Network>
std::vector<StateTensor> state_tensors(Network& network) {
  static_assert(std::is_same_v<typename Network::device_type, tensor::Cpu>,
                "coltrain::train: state_dict I/O reads and writes host tensors; copy a GPU "
                "network to the host first");
  std::vector<StateTensor> tensors;
  auto add = [&](const std::string& name, auto& tensor) {
    using U = std::remove_cvref_t<decltype(*tensor.data())>;
    const auto dims = tensor.shape().dims();
    tensors.push_back({name, data_type_v<U>, std::vector<std::int64_t>(dims.begin(), dims.end()),
                       std::as_writable_bytes(tensor.span())});
  };
  network.visit_parameters(
      [&](const std::string& name, auto& parameter) { add(name, parameter.value); });
  network.visit_buffers([&](const std::string& name, auto& buffer) { add(name, buffer); });
  return tensors;
}

// Adds every parameter and buffer of `network` to `writer` (copied).
template <class Network>
void add_state_dict(tensor::SafetensorsWriter& writer, Network& network) {
  for (const StateTensor& t : state_tensors(network))
    writer.add_bytes(t.name, t.dtype, t.shape, t.bytes);
}

// Writes the network's state_dict to `file`, atomically, with safetensors' {"format": "pt"}
// metadata. Throws IoError naming the file.
template <class Network>
void save_state_dict(const std::filesystem::path& file, Network& network) {
  tensor::SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  add_state_dict(writer, network);
  writer.write(file);
}

namespace detail {

inline std::string dtype_text(DataType type) {
  return std::string(tensor::detail::safetensors_dtype_name(type));
}

inline std::string list_names(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 8;
  std::string text;
  for (std::size_t i = 0; i < names.size() && i < kShown; ++i) {
    text += (i == 0 ? "'" : ", '") + names[i] + "'";
  }
  if (names.size() > kShown) text += " and " + std::to_string(names.size() - kShown) + " more";
  return text;
}

// Checks that `reader` holds exactly `expected` (names, dtypes, shapes); throws InvalidArgument
// naming the first mismatch, the file and what was expected. `what` says whose tensors they are.
inline void check_tensors(const tensor::SafetensorsReader& reader,
                          const std::vector<StateTensor>& expected, const std::string& what) {
  ErrorContext context;
  context.operation = "load " + what;
  context.file = reader.path().string();
  std::vector<std::string> missing;
  std::set<std::string, std::less<>> known;
  for (const StateTensor& t : expected) {
    known.insert(t.name);
    if (!reader.contains(t.name)) {
      missing.push_back(t.name);
      continue;
    }
    const tensor::SafetensorsEntry& entry = reader.entry(t.name);
    if (entry.dtype != t.dtype) {
      throw InvalidArgument("tensor '" + t.name + "' of the " + what + " is " +
                                dtype_text(entry.dtype) + " in the file, expected " +
                                dtype_text(t.dtype),
                            context);
    }
    if (entry.shape != t.shape) {
      throw InvalidArgument("tensor '" + t.name + "' of the " + what + " has shape " +
                                tensor::detail::format_shape(entry.shape) +
                                " in the file, expected " + tensor::detail::format_shape(t.shape),
                            context);
    }
  }
  if (!missing.empty()) {
    throw InvalidArgument("the file lacks " + std::to_string(missing.size()) +
                              " tensor(s) of the " + what + ": " + list_names(missing),
                          context);
  }
  std::vector<std::string> unexpected;
  for (const tensor::SafetensorsEntry& entry : reader.entries()) {
    if (!known.contains(entry.name)) unexpected.push_back(entry.name);
  }
  if (!unexpected.empty()) {
    throw InvalidArgument("the file holds " + std::to_string(unexpected.size()) +
                              " tensor(s) the " + what +
                              " does not have: " + list_names(unexpected),
                          context);
  }
}

}  // namespace detail

// Loads a state_dict into `network`, strictly (see the top of this header). Throws
// InvalidArgument naming the tensor, the expected and found dtype or shape, and the file.
template <class Network>
void load_state_dict(const tensor::SafetensorsReader& reader, Network& network) {
  const std::vector<StateTensor> tensors = state_tensors(network);
  detail::check_tensors(reader, tensors, "model");
  for (const StateTensor& t : tensors) {
    const std::span<const std::byte> bytes = reader.bytes(t.name);
    if (!bytes.empty()) std::memcpy(t.bytes.data(), bytes.data(), bytes.size());
  }
}

// Reads `file` (IoError if it is not a valid safetensors file) and loads it as above.
template <class Network>
void load_state_dict(const std::filesystem::path& file, Network& network) {
  load_state_dict(tensor::SafetensorsReader(file), network);
}

}  // namespace coltrain::train
