#pragma once
// Checkpoints of a training run: a network and its PrecisionOptimizer (SGD, Adam or AdamW under
// fp32, fp16 or bf16), enough to resume bit for bit. Each checkpoint is three files in one
// directory, numbered by a sequence that grows with every save:
//
//   checkpoint-000007.model.safetensors      the network's state_dict (train/state_dict.hpp):
//                                            PyTorch names and dtypes, loads with strict=True
//   checkpoint-000007.optimizer.safetensors  optimizer tensors under PyTorch's state names
//                                            (<param>.momentum_buffer, .exp_avg, .exp_avg_sq) and,
//                                            with master weights, <param>.master_weight; fp32
//                                            (fp64 under the Fp64 policy)
//   checkpoint-000007.json                   the sidecar: format version, epoch, global step, the
//                                            optimizer's type, hyperparameters and step counts, the
//                                            loss scaler, the RNG state (network seed and context
//                                            step), the model's name and parameter count, the two
//                                            files' names and sizes, and the trainer's extra data
//
// Crash safety: every file is written to a temporary name, flushed, renamed into place and its
// directory flushed; the sidecar is written last and is the commit record. A checkpoint counts
// only once its sidecar exists and names files of the recorded sizes, so a crash at any point
// leaves the previous checkpoint the newest complete one. The next save removes what an
// interrupted one left (temporary files, data files without a sidecar) and then, once its own
// sidecar is in place, all but the newest `keep` checkpoints (sidecar first, so that a crash while
// pruning leaves no sidecar without its files). One process writes a directory at a time (rank 0).
//
// Resuming: the network is constructed with the same seed (its dropout masks derive from it), the
// optimizer from the network's parameters as for training, then load_checkpoint() restores weights,
// buffers, optimizer state, fp32 masters, loss scale and the context's step, and returns the epoch
// and global step to continue from. Data order and learning-rate schedules are functions of the
// (seed, epoch) and the step, so nothing else is needed.
//
// The optimizer's part goes through optim::OptimizerSnapshot, which the device optimizer exports
// and imports too: coltrain/cuda/train/checkpoint.cuh saves and loads a network on the GPU with
// this writer and reader, so checkpoints move between the CPU, the GPU and PyTorch.

#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/core/timer.hpp>
#include <coltrain/optim/adam.hpp>
#include <coltrain/optim/loss_scaler.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/optim/sgd.hpp>
#include <coltrain/tensor/safetensors.hpp>
#include <coltrain/train/state_dict.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace coltrain::train {

// The sidecar's format_version; a reader refuses newer ones.
inline constexpr int kCheckpointFormatVersion = 1;

struct CheckpointOptions {
  // The model's name ("resnet20"), recorded; on load, a different recorded name is an error when
  // both are set.
  std::string model_name{};
  // Complete checkpoints kept in the directory after a save (>= 1).
  int keep = 2;
  // On load: the optimizer's and loss scaler's settings must equal the recorded ones (a changed
  // momentum or beta would silently change the resumed run).
  bool check_hyperparameters = true;
  // Called after each file is in place (model, optimizer, sidecar), for progress messages.
  std::function<void(const std::filesystem::path&)> on_file_written{};
};

// Where the run stands; saved with the checkpoint and returned by load_checkpoint.
struct TrainingState {
  std::int64_t epoch = 0;        // epochs completed
  std::int64_t global_step = 0;  // training steps taken (skipped fp16 steps included)
  Json extra = Json::object();   // the trainer's own (best accuracy, time...)
};

// The files of one checkpoint.
struct CheckpointFiles {
  std::int64_t sequence = 0;
  std::filesystem::path sidecar{}, model{}, optimizer{};
};

namespace detail {

inline constexpr std::string_view kCheckpointPrefix = "checkpoint-";
inline constexpr std::string_view kSidecarSuffix = ".json";
inline constexpr std::string_view kModelSuffix = ".model.safetensors";
inline constexpr std::string_view kOptimizerSuffix = ".optimizer.safetensors";
inline constexpr std::string_view kCheckpointFormat = "coltrain.checkpoint";
inline constexpr std::string_view kMasterSuffix = "master_weight";

inline CheckpointFiles checkpoint_files(const std::filesystem::path& dir, std::int64_t sequence) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%06lld", static_cast<long long>(sequence));
  const std::string stem = std::string(kCheckpointPrefix) + digits;
  return {sequence, dir / (stem + std::string(kSidecarSuffix)),
          dir / (stem + std::string(kModelSuffix)), dir / (stem + std::string(kOptimizerSuffix))};
}

// The sequence number and kind of a checkpoint file name, or nullopt for any other name.
struct CheckpointName {
  std::int64_t sequence;
  bool sidecar;
};

inline std::optional<CheckpointName> parse_checkpoint_name(std::string_view name) {
  if (!name.starts_with(kCheckpointPrefix)) return std::nullopt;
  name.remove_prefix(kCheckpointPrefix.size());
  const std::size_t digits = name.find_first_not_of("0123456789");
  if (digits == 0 || digits == std::string_view::npos) return std::nullopt;
  std::int64_t sequence = 0;
  const auto parsed = std::from_chars(name.data(), name.data() + digits, sequence);
  if (parsed.ec != std::errc()) return std::nullopt;
  const std::string_view suffix = name.substr(digits);
  if (suffix == kSidecarSuffix) return CheckpointName{sequence, true};
  if (suffix == kModelSuffix || suffix == kOptimizerSuffix) return CheckpointName{sequence, false};
  return std::nullopt;
}

struct DirectoryScan {
  std::map<std::int64_t, bool> sequences;  // sequence -> has a sidecar
  std::vector<std::filesystem::path> temporaries;
  std::vector<std::filesystem::path> data_files;
};

inline DirectoryScan scan_checkpoints(const std::filesystem::path& dir) {
  DirectoryScan scan;
  std::error_code error;
  std::filesystem::directory_iterator it(dir, error);
  if (error)
    coltrain::detail::fail_io("list checkpoints", dir,
                              "cannot list the directory: " + error.message());
  for (const std::filesystem::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (is_atomic_write_temporary(name, kCheckpointPrefix)) {
      scan.temporaries.push_back(entry.path());
      continue;
    }
    const std::optional<CheckpointName> parsed = parse_checkpoint_name(name);
    if (!parsed) continue;
    bool& has_sidecar = scan.sequences[parsed->sequence];
    has_sidecar = has_sidecar || parsed->sidecar;
    if (!parsed->sidecar) scan.data_files.push_back(entry.path());
  }
  return scan;
}

[[noreturn]] inline void fail_checkpoint(const std::filesystem::path& file,
                                         const std::string& message,
                                         std::optional<std::uint64_t> offset = std::nullopt) {
  ErrorContext context;
  context.operation = "load checkpoint";
  context.file = file.string();
  context.offset = offset;
  throw IoError(message, context);
}

[[noreturn]] inline void mismatch(const std::filesystem::path& file, const std::string& message) {
  ErrorContext context;
  context.operation = "load checkpoint";
  context.file = file.string();
  throw InvalidArgument(message, context);
}

// How deep a sidecar may nest arrays and objects: the format uses 3 levels and a trainer's `extra`
// data a few more.
inline constexpr int kSidecarMaxDepth = 64;

inline Json read_sidecar(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail_checkpoint(file, "cannot open the checkpoint's sidecar");
  std::ostringstream read;
  read << in.rdbuf();
  const std::string text = std::move(read).str();
  Json sidecar;
  try {
    sidecar = Json::parse(text, JsonParseOptions{.max_depth = kSidecarMaxDepth});
  } catch (const JsonError& e) {
    fail_checkpoint(file,
                    e.reason() == JsonError::Reason::kTooDeep
                        ? "the sidecar nests arrays or objects deeper than " +
                              std::to_string(kSidecarMaxDepth) + " levels"
                        : "the sidecar is not valid JSON: " + e.description(),
                    e.offset());
  }
  if (!sidecar.is_object() || !sidecar.contains("format") || !sidecar["format"].is_string() ||
      sidecar["format"].get<std::string>() != kCheckpointFormat) {
    fail_checkpoint(file, "not a coltrain checkpoint sidecar (\"format\" is not \"" +
                              std::string(kCheckpointFormat) + "\")");
  }
  const Json& version = sidecar["format_version"];
  if (!version.is_number_integer()) fail_checkpoint(file, "the sidecar has no format_version");
  // Compared as written: get<int>() would read 2^32 + 1 as version 1.
  const bool newer = version.is_number_unsigned()
                         ? version.get<std::uint64_t>() > std::uint64_t{kCheckpointFormatVersion}
                         : version.get<std::int64_t>() > kCheckpointFormatVersion;
  if (newer) {
    fail_checkpoint(file, "format version " + version.dump() +
                              " was written by a newer coltrain; this one reads version " +
                              std::to_string(kCheckpointFormatVersion));
  }
  if (version.get<std::int64_t>() < 1) {
    fail_checkpoint(file, "format version " + version.dump() + " is not one coltrain writes " +
                              "(they start at 1)");
  }
  return sidecar;
}

// The sidecar's field at a JSON pointer, of the kind `check` accepts; IoError naming it otherwise.
template <class Check>
const Json& field(const Json& sidecar, const std::filesystem::path& file,
                  const std::string& pointer, Check&& check, const char* kind) {
  const Json* at = sidecar.at_pointer(pointer);
  if (at == nullptr || !check(*at)) {
    fail_checkpoint(file, "the sidecar's " + pointer + " is missing or not " + kind);
  }
  return *at;
}

// An integer above 2^63 - 1 is refused: get<std::int64_t>() would wrap it to a negative one.
inline bool is_int64(const Json& value) {
  return value.is_number_integer() &&
         !(value.is_number_unsigned() &&
           value.get<std::uint64_t>() >
               static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
}

inline std::int64_t integer_field(const Json& sidecar, const std::filesystem::path& file,
                                  const std::string& pointer) {
  return field(sidecar, file, pointer, is_int64, "a 64-bit integer").get<std::int64_t>();
}

// A count, which save_checkpoint never writes negative (epoch, global step, optimizer steps).
inline std::int64_t count_field(const Json& sidecar, const std::filesystem::path& file,
                                const std::string& pointer) {
  const std::int64_t count = integer_field(sidecar, file, pointer);
  if (count < 0) {
    fail_checkpoint(file,
                    "the sidecar's " + pointer + " is negative (" + std::to_string(count) + ")");
  }
  return count;
}

// The data files a sidecar names, checked to exist with the recorded sizes (a mismatch means
// they were replaced or cut short after the commit).
inline CheckpointFiles sidecar_files(const Json& sidecar, const std::filesystem::path& file) {
  CheckpointFiles files;
  files.sidecar = file;
  files.sequence = integer_field(sidecar, file, "/sequence");
  const std::filesystem::path dir = coltrain::detail::directory_of(file);
  for (const char* key : {"model", "optimizer"}) {
    const std::string base = std::string("/files/") + key;
    const auto name =
        field(
            sidecar, file, base + "/name", [](const Json& v) { return v.is_string(); }, "a string")
            .get<std::string>();
    const std::int64_t bytes = integer_field(sidecar, file, base + "/bytes");
    if (name.empty() || std::filesystem::path(name).filename() != name) {
      fail_checkpoint(file, "the sidecar's " + base + "/name '" + name + "' is not a file name");
    }
    const std::filesystem::path path = dir / name;
    std::error_code error;
    const std::uintmax_t size = std::filesystem::file_size(path, error);
    if (error)
      fail_checkpoint(file, "its " + std::string(key) + " file " + path.string() +
                                " cannot be read: " + error.message());
    if (size != static_cast<std::uintmax_t>(bytes)) {
      fail_checkpoint(file, "its " + std::string(key) + " file " + path.string() + " has " +
                                std::to_string(size) + " bytes, the sidecar records " +
                                std::to_string(bytes));
    }
    (std::string_view(key) == "model" ? files.model : files.optimizer) = path;
  }
  return files;
}

// What a checkpoint records about each optimizer: its PyTorch class name, hyperparameters, and the
// suffixes of the state it keeps per parameter.
template <class Optimizer>
struct OptimizerRecord {
  static_assert(sizeof(Optimizer) == 0,
                "coltrain::train checkpoints know optim::Sgd, optim::Adam and optim::AdamW (and "
                "their Basic*<double>)");
};

template <class T>
struct OptimizerRecord<optim::BasicSgd<T>> {
  static constexpr std::string_view kType = "SGD";
  static Json hyperparameters(const optim::BasicSgd<T>& sgd) {
    const typename optim::BasicSgd<T>::Options& o = sgd.options();
    // Member by member, as AdamRecord's (cudafe++ and braced lists of dependent members).
    Json out = Json::object();
    out["lr"] = o.lr;
    out["momentum"] = o.momentum;
    out["dampening"] = o.dampening;
    out["weight_decay"] = o.weight_decay;
    out["nesterov"] = o.nesterov;
    return out;
  }
  // Momentum buffers exist only with momentum.
  static std::vector<std::string> state_suffixes(const optim::BasicSgd<T>& sgd) {
    if (sgd.options().momentum == 0) return {};
    return {"momentum_buffer"};
  }
};

template <class Adam>
struct AdamRecord {
  static Json hyperparameters(const Adam& adam) {
    const typename Adam::Options& o = adam.options();
    // Member by member: cudafe++ parenthesises a braced list of dependent members, which g++
    // then refuses.
    Json out = Json::object();
    out["lr"] = o.lr;
    out["beta1"] = o.beta1;
    out["beta2"] = o.beta2;
    out["eps"] = o.eps;
    out["weight_decay"] = o.weight_decay;
    return out;
  }
  static std::vector<std::string> state_suffixes(const Adam&) { return {"exp_avg", "exp_avg_sq"}; }
};

template <class T>
struct OptimizerRecord<optim::BasicAdam<T>> : AdamRecord<optim::BasicAdam<T>> {
  static constexpr std::string_view kType = "Adam";
};

template <class T>
struct OptimizerRecord<optim::BasicAdamW<T>> : AdamRecord<optim::BasicAdamW<T>> {
  static constexpr std::string_view kType = "AdamW";
};

// What a checkpoint records of a network, on either device: its state_dict tensors (host views to
// save; for a load, their names, dtypes and shapes, to check the file against), its parameters'
// shapes (the optimizer's tensors have them), size, storage type and RNG state.
struct ModelRecord {
  std::vector<StateTensor> tensors;
  std::map<std::string, std::vector<std::int64_t>> parameter_shapes;
  std::size_t parameter_count = 0;
  DataType storage = DataType::kFloat32;
  std::uint64_t seed = 0;
  std::uint64_t context_step = 0;
};

template <class Network>
ModelRecord model_record(Network& network, std::vector<StateTensor> tensors) {
  ModelRecord record;
  record.tensors = std::move(tensors);
  network.visit_parameters([&](const std::string& name, auto& parameter) {
    const auto dims = parameter.value.shape().dims();
    record.parameter_shapes.emplace(name, std::vector<std::int64_t>(dims.begin(), dims.end()));
  });
  record.parameter_count = Network::kParameterCount;
  record.storage = data_type_v<typename Network::value_type>;
  record.seed = network.context().seed();
  record.context_step = network.context().step();
  return record;
}

// The loss scaler's settings of a precision optimizer on either device (defaults without loss
// scaling: then none are recorded).
template <class PrecisionOptimizer>
optim::DynamicLossScaler::Options scaler_options_of(const PrecisionOptimizer& optimizer) {
  if constexpr (requires { optimizer.scaler_options(); }) {
    return optimizer.scaler_options();
  } else if constexpr (requires { optimizer.scaler(); }) {
    return optimizer.scaler().options();
  } else {
    return {};
  }
}

inline std::uintmax_t file_bytes(const std::filesystem::path& path) {
  std::error_code error;
  const std::uintmax_t bytes = std::filesystem::file_size(path, error);
  if (error)
    coltrain::detail::fail_io("save checkpoint", path,
                              "cannot read the file's size: " + error.message());
  return bytes;
}

inline void remove_file(const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::remove(path, error);
  if (error)
    coltrain::detail::fail_io("remove checkpoint file", path, "cannot remove: " + error.message());
}

}  // namespace detail

// The newest complete checkpoint in `dir`: the highest sequence whose sidecar parses and names
// files of the recorded sizes. Incomplete or damaged ones are passed over. nullopt when there is
// none (or no such directory).
inline std::optional<CheckpointFiles> find_latest_checkpoint(const std::filesystem::path& dir) {
  if (!std::filesystem::is_directory(dir)) return std::nullopt;
  const detail::DirectoryScan scan = detail::scan_checkpoints(dir);
  for (auto it = scan.sequences.rbegin(); it != scan.sequences.rend(); ++it) {
    if (!it->second) continue;
    const CheckpointFiles names = detail::checkpoint_files(dir, it->first);
    try {
      CheckpointFiles files =
          detail::sidecar_files(detail::read_sidecar(names.sidecar), names.sidecar);
      if (files.sequence == it->first) return files;
    } catch (const IoError&) {
      // Damaged: an older complete checkpoint is the one to resume from.
    }
  }
  return std::nullopt;
}

namespace detail {

// Writes a checkpoint of a network (its ModelRecord) and a precision optimizer (its settings and
// exported state) into `dir`, then prunes; the body of save_checkpoint on either device.
template <class Precision, class Optimizer>
CheckpointFiles write_checkpoint(const std::filesystem::path& dir, const ModelRecord& network,
                                 const Optimizer& settings,
                                 const optim::DynamicLossScaler::Options& scaler_options,
                                 const optim::BasicOptimizerSnapshot<optim::master_t<Precision>>&
                                     snapshot,
                                 const TrainingState& state, const CheckpointOptions& options) {
  using Record = OptimizerRecord<Optimizer>;
  if (options.keep < 1 || state.epoch < 0 || state.global_step < 0) {
    ErrorContext context;
    context.operation = "save checkpoint";
    context.file = dir.string();
    throw InvalidArgument(
        "save_checkpoint: keep must be >= 1 and epoch and global step >= 0 (keep " +
            std::to_string(options.keep) + ", epoch " + std::to_string(state.epoch) + ", step " +
            std::to_string(state.global_step) + ")",
        context);
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error)
    coltrain::detail::fail_io("save checkpoint", dir,
                              "cannot create the directory: " + error.message());

  // What an interrupted save left behind goes first; its sequence numbers are not reused.
  const DirectoryScan scan = scan_checkpoints(dir);
  for (const std::filesystem::path& temp : scan.temporaries) remove_file(temp);
  for (const std::filesystem::path& file : scan.data_files) {
    const auto parsed = parse_checkpoint_name(file.filename().string());
    if (!scan.sequences.at(parsed->sequence)) remove_file(file);
  }
  const std::int64_t sequence = scan.sequences.empty() ? 1 : scan.sequences.rbegin()->first + 1;
  const CheckpointFiles files = checkpoint_files(dir, sequence);
  auto written = [&](const std::filesystem::path& path) {
    if (options.on_file_written) options.on_file_written(path);
  };

  tensor::SafetensorsWriter model;
  model.set_metadata("format", "pt");
  for (const StateTensor& t : network.tensors) model.add_bytes(t.name, t.dtype, t.shape, t.bytes);
  model.write(files.model);
  written(files.model);

  // A state tensor is "<parameter>.<suffix>", shaped as its parameter.
  auto shape_of = [&](const std::string& parameter) -> const std::vector<std::int64_t>& {
    const auto found = network.parameter_shapes.find(parameter);
    if (found == network.parameter_shapes.end()) {
      throw InvalidArgument("save_checkpoint: the optimizer's parameter '" + parameter +
                            "' is not a parameter of the network");
    }
    return found->second;
  };
  tensor::SafetensorsWriter optimizer_file;
  optimizer_file.set_metadata("format", "pt");
  for (const auto& t : snapshot.state) {
    optimizer_file.add(t.name, shape_of(t.name.substr(0, t.name.rfind('.'))), t.values);
  }
  for (const auto& t : snapshot.masters) {
    optimizer_file.add(t.name + "." + std::string(kMasterSuffix), shape_of(t.name), t.values);
  }
  optimizer_file.write(files.optimizer);
  written(files.optimizer);

  Json sidecar;
  sidecar["format"] = kCheckpointFormat;
  sidecar["format_version"] = kCheckpointFormatVersion;
  sidecar["sequence"] = sequence;
  sidecar["saved_at"] = utc_now();
  sidecar["epoch"] = state.epoch;
  sidecar["global_step"] = state.global_step;
  const auto file_record = [](const std::filesystem::path& file) {
    return Json::object({{"name", file.filename().string()}, {"bytes", file_bytes(file)}});
  };
  sidecar["files"] = Json::object(
      {{"model", file_record(files.model)}, {"optimizer", file_record(files.optimizer)}});
  sidecar["model"] = Json::object({{"name", options.model_name},
                                   {"parameter_count", network.parameter_count},
                                   {"storage", dtype_text(network.storage)}});
  sidecar["precision"] = Precision::kName;
  Json optimizer_record = Json::object({{"type", Record::kType},
                                        {"hyperparameters", Record::hyperparameters(settings)},
                                        {"has_state", !snapshot.state.empty()}});
  if constexpr (optim::detail::HasStepCounts<Optimizer>) {
    Json steps = Json::object();
    for (const auto& [name, step] : snapshot.step_counts) steps[name] = step;
    optimizer_record["step_counts"] = std::move(steps);
  }
  // Only the device optimizer counts these; a CPU checkpoint stays as format version 1 wrote it.
  if (snapshot.steps_taken) optimizer_record["steps_taken"] = *snapshot.steps_taken;
  if (snapshot.steps_skipped) optimizer_record["steps_skipped"] = *snapshot.steps_skipped;
  sidecar["optimizer"] = std::move(optimizer_record);
  if constexpr (Precision::kLossScaling) {
    // Member by member: the snapshot's type depends on the policy (see AdamRecord).
    Json& scaler = sidecar["loss_scaler"] = Json::object();
    scaler["scale"] = snapshot.loss_scale.value().scale;
    scaler["growth_tracker"] = snapshot.loss_scale.value().growth_tracker;
    scaler["init_scale"] = scaler_options.init_scale;
    scaler["growth_factor"] = scaler_options.growth_factor;
    scaler["backoff_factor"] = scaler_options.backoff_factor;
    scaler["growth_interval"] = scaler_options.growth_interval;
  } else {
    sidecar["loss_scaler"] = nullptr;
  }
  sidecar["rng"] =
      Json::object({{"network_seed", network.seed}, {"context_step", network.context_step}});
  sidecar["extra"] = state.extra;
  write_file_atomically(files.sidecar, sidecar.dump(2) + "\n");
  written(files.sidecar);

  // Prune: the sequences with a sidecar, newest first, beyond `keep`.
  std::vector<std::int64_t> committed;
  for (const auto& [number, has_sidecar] : scan_checkpoints(dir).sequences) {
    if (has_sidecar) committed.push_back(number);
  }
  std::ranges::sort(committed, std::greater<>());
  for (std::size_t i = static_cast<std::size_t>(options.keep); i < committed.size(); ++i) {
    const CheckpointFiles old = checkpoint_files(dir, committed[i]);
    remove_file(old.sidecar);
    sync_directory(dir);
    remove_file(old.model);
    remove_file(old.optimizer);
  }
  if (committed.size() > static_cast<std::size_t>(options.keep)) sync_directory(dir);
  return files;
}

// A checkpoint read and checked against a network and optimizer, nothing applied yet: the model
// file (its tensors checked against the ModelRecord's), the optimizer's state as a snapshot to
// import (in the optimizer's type, T), the context step to restore, and the run's state to return.
template <class T>
struct CheckpointContents {
  TrainingState state;
  std::uint64_t context_step = 0;
  tensor::SafetensorsReader model;
  optim::BasicOptimizerSnapshot<T> optimizer;
};

// The body of load_checkpoint on either device, up to the copies. `parameter_names` are the
// optimizer's, in its order; `optimizer_has_state` whether it has taken steps.
template <class Precision, class Optimizer>
CheckpointContents<optim::master_t<Precision>> read_checkpoint(
    const std::filesystem::path& path, const ModelRecord& network, const Optimizer& settings,
    const optim::DynamicLossScaler::Options& scaler_options,
    const std::vector<std::string>& parameter_names, bool optimizer_has_state,
    const CheckpointOptions& options) {
  using Record = OptimizerRecord<Optimizer>;
  using Master = optim::master_t<Precision>;
  std::filesystem::path sidecar_path = path;
  if (std::filesystem::is_directory(path)) {
    const std::optional<CheckpointFiles> latest = find_latest_checkpoint(path);
    if (!latest) fail_checkpoint(path, "no complete checkpoint in the directory");
    sidecar_path = latest->sidecar;
  }
  const Json sidecar = read_sidecar(sidecar_path);
  const CheckpointFiles files = sidecar_files(sidecar, sidecar_path);
  auto string_field = [&](const std::string& pointer) {
    return field(
               sidecar, sidecar_path, pointer, [](const Json& v) { return v.is_string(); },
               "a string")
        .template get<std::string>();
  };
  auto expect = [&](const std::string& what, const std::string& recorded, const std::string& here) {
    if (recorded != here) {
      mismatch(sidecar_path,
               "the checkpoint's " + what + " is " + recorded + ", this one's is " + here);
    }
  };

  TrainingState state;
  state.epoch = count_field(sidecar, sidecar_path, "/epoch");
  state.global_step = count_field(sidecar, sidecar_path, "/global_step");
  if (sidecar.contains("extra")) {
    state.extra = field(
        sidecar, sidecar_path, "/extra", [](const Json& v) { return v.is_object(); }, "an object");
  }

  // The model and the run's settings.
  const std::string model_name = string_field("/model/name");
  if (!model_name.empty() && !options.model_name.empty()) {
    expect("model", "'" + model_name + "'", "'" + options.model_name + "'");
  }
  expect("parameter count",
         std::to_string(integer_field(sidecar, sidecar_path, "/model/parameter_count")),
         std::to_string(network.parameter_count));
  expect("storage type", string_field("/model/storage"), dtype_text(network.storage));
  expect("precision", string_field("/precision"), std::string(Precision::kName));
  expect("optimizer", string_field("/optimizer/type"), std::string(Record::kType));
  const Json& seed = field(
      sidecar, sidecar_path, "/rng/network_seed",
      [](const Json& v) { return v.is_number_unsigned(); }, "an unsigned integer");
  expect("network seed (construct the network with it: dropout masks derive from it)",
         std::to_string(seed.get<std::uint64_t>()), std::to_string(network.seed));
  const auto context_step =
      field(
          sidecar, sidecar_path, "/rng/context_step",
          [](const Json& v) { return v.is_number_unsigned(); }, "an unsigned integer")
          .template get<std::uint64_t>();
  if (options.check_hyperparameters) {
    const Json here = Record::hyperparameters(settings);
    const Json& recorded = field(
        sidecar, sidecar_path, "/optimizer/hyperparameters",
        [](const Json& v) { return v.is_object(); }, "an object");
    for (const auto& [key, value] : here.items()) {
      const std::string saved = recorded.contains(key) ? recorded[key].dump() : "missing";
      expect("optimizer setting '" + key + "'", saved, value.dump());
    }
  }
  optim::BasicOptimizerSnapshot<Master> snapshot;
  if constexpr (Precision::kLossScaling) {
    auto number = [&](const std::string& key) {
      return field(
                 sidecar, sidecar_path, "/loss_scaler/" + key,
                 [](const Json& v) { return v.is_number(); }, "a number")
          .template get<double>();
    };
    snapshot.loss_scale = optim::DynamicLossScaler::State{
        static_cast<float>(number("scale")),
        integer_field(sidecar, sidecar_path, "/loss_scaler/growth_tracker")};
    if (options.check_hyperparameters) {
      expect("loss scaler growth_factor", Json(number("growth_factor")).dump(),
             Json(scaler_options.growth_factor).dump());
      expect("loss scaler backoff_factor", Json(number("backoff_factor")).dump(),
             Json(scaler_options.backoff_factor).dump());
      expect("loss scaler growth_interval",
             std::to_string(integer_field(sidecar, sidecar_path, "/loss_scaler/growth_interval")),
             std::to_string(scaler_options.growth_interval));
    }
  } else if (sidecar.contains("loss_scaler") && !sidecar["loss_scaler"].is_null()) {
    mismatch(sidecar_path, "the checkpoint has loss-scaler state, the precision " +
                               std::string(Precision::kName) + " scales no loss");
  }
  for (const char* counter : {"steps_taken", "steps_skipped"}) {
    const std::string pointer = "/optimizer/" + std::string(counter);
    if (sidecar.at_pointer(pointer) == nullptr) continue;
    const std::int64_t count = count_field(sidecar, sidecar_path, pointer);
    (std::string_view(counter) == "steps_taken" ? snapshot.steps_taken : snapshot.steps_skipped) =
        count;
  }

  // The tensors: the model's, then the optimizer's, all checked before anything is read.
  tensor::SafetensorsReader model_reader(files.model);
  check_tensors(model_reader, network.tensors, "model");

  const bool has_state = field(
                             sidecar, sidecar_path, "/optimizer/has_state",
                             [](const Json& v) { return v.is_boolean(); }, "a boolean")
                             .template get<bool>();
  if (!has_state && optimizer_has_state) {
    mismatch(sidecar_path,
             "the checkpoint has no optimizer state but this optimizer has taken steps; "
             "load into a freshly constructed one");
  }
  std::vector<StateTensor> optimizer_tensors;
  std::vector<std::string> state_names;  // in the optimizer's for_each_state order
  for (const std::string& name : parameter_names) {
    const auto shape = network.parameter_shapes.find(name);
    if (shape == network.parameter_shapes.end()) {
      mismatch(sidecar_path,
               "the optimizer's parameter '" + name + "' is not a parameter of the network");
    }
    auto add = [&](std::string_view suffix) {
      optimizer_tensors.push_back(
          {name + "." + std::string(suffix), data_type_v<Master>, shape->second, {}});
    };
    if (has_state) {
      for (const std::string& suffix : Record::state_suffixes(settings)) {
        add(suffix);
        state_names.push_back(optimizer_tensors.back().name);
      }
      if constexpr (optim::detail::HasStepCounts<Optimizer>) {
        const Json& counts = field(
            sidecar, sidecar_path, "/optimizer/step_counts",
            [](const Json& v) { return v.is_object(); }, "an object");
        const std::string key = name + ".step";
        const Json* count = counts.find(key);
        if (count == nullptr || !is_int64(*count) || count->get<std::int64_t>() < 0) {
          fail_checkpoint(sidecar_path, "the sidecar has no step count for '" + key + "'");
        }
        snapshot.step_counts.emplace_back(key, count->get<std::int64_t>());
      }
    }
    if constexpr (Precision::kMasterWeights) add(kMasterSuffix);
  }
  if (parameter_names.size() != network.parameter_shapes.size()) {
    mismatch(sidecar_path, "the optimizer steps " + std::to_string(parameter_names.size()) +
                               " parameters, the network has " +
                               std::to_string(network.parameter_shapes.size()) +
                               "; build it from all of the network's parameters");
  }
  const tensor::SafetensorsReader optimizer_reader(files.optimizer);
  check_tensors(optimizer_reader, optimizer_tensors, "optimizer state");

  for (const std::string& name : state_names) {
    snapshot.state.push_back({name, optimizer_reader.read<Master>(name)});
  }
  if constexpr (Precision::kMasterWeights) {
    for (const std::string& name : parameter_names) {
      snapshot.masters.push_back(
          {name, optimizer_reader.read<Master>(name + "." + std::string(kMasterSuffix))});
    }
  }
  return {std::move(state), context_step, std::move(model_reader), std::move(snapshot)};
}

// The last part of a load on the CPU, once everything is checked: the model's tensors and step.
template <class Network, class T>
void restore_network(Network& network, const ModelRecord& record,
                     const CheckpointContents<T>& contents) {
  for (const StateTensor& t : record.tensors) {
    const std::span<const std::byte> bytes = contents.model.bytes(t.name);
    if (!bytes.empty()) std::memcpy(t.bytes.data(), bytes.data(), bytes.size());
  }
  network.context().set_step(contents.context_step);
}

}  // namespace detail

// Saves a checkpoint of `network` (an nn::Network on the CPU) and `optimizer` into `dir` (created
// if needed), then prunes older ones; see the top of this header. The optimizer must have been
// built from the network's parameters (optim::parameters_of). Returns the new files. Throws
// IoError naming the file that could not be written, InvalidArgument for keep < 1 or a negative
// epoch or step; after a failure, the previous checkpoints are intact. The GPU overload is in
// coltrain/cuda/train/checkpoint.cuh.
template <class Network, class Precision, class Optimizer>
CheckpointFiles save_checkpoint(const std::filesystem::path& dir, Network& network,
                                const optim::PrecisionOptimizer<Precision, Optimizer>& optimizer,
                                const TrainingState& state, const CheckpointOptions& options = {}) {
  return detail::write_checkpoint<Precision>(
      dir, detail::model_record(network, state_tensors(network)), optimizer.optimizer(),
      detail::scaler_options_of(optimizer), optimizer.export_state(), state, options);
}

// Restores a checkpoint into `network` and `optimizer`, built as for training (see the top of this
// header). `path` is a sidecar (checkpoint-NNNNNN.json) or a directory, whose newest complete
// checkpoint is taken. Everything is checked before anything changes: the format version, the
// files' sizes, the model's name, parameter count, storage and precision, the optimizer's type and
// (with check_hyperparameters) settings, the network's seed, and every tensor's name, dtype and
// shape. Returns the epoch, global step and extra data saved with it. Throws IoError for a missing,
// damaged or unreadable checkpoint, InvalidArgument (naming the tensor or setting, the expected
// and the found value, and the file) for one that does not fit. Checkpoints saved on the GPU load
// here too.
template <class Network, class Precision, class Optimizer>
TrainingState load_checkpoint(const std::filesystem::path& path, Network& network,
                              optim::PrecisionOptimizer<Precision, Optimizer>& optimizer,
                              const CheckpointOptions& options = {}) {
  std::vector<std::string> parameter_names;
  for (std::size_t p = 0; p < optimizer.size(); ++p) {
    parameter_names.push_back(optimizer.parameter_name(p));
  }
  const detail::ModelRecord record = detail::model_record(network, state_tensors(network));
  auto contents = detail::read_checkpoint<Precision>(
      path, record, optimizer.optimizer(), detail::scaler_options_of(optimizer), parameter_names,
      optim::detail::has_optimizer_state(optimizer.optimizer()), options);

  // Everything fits: copy.
  optimizer.import_state(contents.optimizer);
  detail::restore_network(network, record, contents);
  return std::move(contents.state);
}

}  // namespace coltrain::train
