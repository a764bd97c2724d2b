#pragma once
// ZeroOptimizer<Net, Policy, Optimizer>: ZeRO stage 1 (Rajbhandari et al., 2020; PyTorch's
// ZeroRedundancyOptimizer): the optimizer state is sharded across the ranks of a DataParallel
// instead of replicated, so each rank keeps about 1/p of it (moments, momentum buffers, fp32
// master weights).
//
//   train::DataParallel ddp(net, comm, {.zero_stage = 1});   // gradients reduce-scattered
//   train::ZeroOptimizer<decltype(net), optim::Fp32, optim::Adam> adam(ddp, optim::Adam({}));
//   net.zero_grad(); ... net.backward(grad);
//   ddp.finish_gradient_sync();  // each rank: the average of its shard's gradients
//   adam.step(lr);               // each rank updates its shard; the values are allgathered
//
// The shards are contiguous ranges of the network's parameter arena (train/arena_shards.hpp), so
// the reduce-scatter of the gradients and the allgather of the values work in place, and each
// rank's optimizer is an ordinary PrecisionOptimizer over the pieces of parameters its shard holds.
// Elementwise optimizers (SGD, Adam, AdamW) compute exactly what the unsharded optimizer computes
// on the same averaged gradients.
//
// export_state() gathers the full state (collective), named and shaped as the unsharded
// optimizer's, so checkpoints keep their format, load in PyTorch, and resume at any world size or
// without ZeRO; import_state() takes this rank's shard of a full snapshot (local). The
// save_checkpoint and load_checkpoint overloads at the end do that with checkpoint files, and
// train::Trainer takes a ZeroOptimizer in place of a PrecisionOptimizer.

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/optim/loss_scaler.hpp>
#include <coltrain/optim/parameter_ref.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/train/arena_shards.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/data_parallel.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::train {

template <class Net, optim::PrecisionPolicy Policy, optim::ParamOptimizer Optimizer>
class ZeroOptimizer {
  using T = typename Net::value_type;
  static_assert(std::is_same_v<T, typename Policy::Storage>,
                "ZeroOptimizer: the network's value type must be the policy's storage type");
  using Master = optim::master_t<Policy>;  // the optimizer's state and master weights
  using Snapshot = optim::BasicOptimizerSnapshot<Master>;

 public:
  // Takes this rank's shard of every parameter, as it is now (load a checkpoint first, or import
  // a snapshot afterwards). The DataParallel, its network and communicator must outlive this
  // object. Throws InvalidArgument unless the DataParallel was built with zero_stage = 1.
  ZeroOptimizer(DataParallel<Net>& ddp, Optimizer optimizer,
                optim::DynamicLossScaler::Options scaler_options = {})
      : ddp_(ddp),
        shards_(ddp.shards()),
        probe_options_(optimizer.options()),
        local_(shard_refs(ddp, shards_, pieces_), std::move(optimizer), scaler_options) {
    if (ddp.options().zero_stage != 1) {
      throw InvalidArgument(
          "ZeroOptimizer: the DataParallel must be built with zero_stage = 1, "
          "so that it reduce-scatters the gradients instead of allreducing them");
    }
  }

  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // PrecisionOptimizer's two halves, on this rank's shard. unscale_and_check() tells whether this
  // rank's shard of the gradients is finite; the caller agrees across ranks (ddp.all_finite) and
  // passes the result to apply(), which steps the shard and then gathers every rank's values
  // (collective). step(lr) is both, with the agreement.
  bool unscale_and_check() { return local_.unscale_and_check(); }
  bool apply(bool all_finite, double lr) {
    const bool taken = local_.apply(all_finite, lr);
    if (taken) gather_values();
    return taken;
  }
  bool step(double lr) { return apply(ddp_.all_finite(unscale_and_check()), lr); }
  void abandon_step() { local_.abandon_step(); }

  float loss_scale() const { return local_.loss_scale(); }

  // This rank's optimizer: the pieces of parameters its shard holds, and their state. Its own
  // apply() would step the shard without gathering: step through this class.
  const optim::PrecisionOptimizer<Policy, Optimizer>& local() const { return local_; }
  optim::PrecisionOptimizer<Policy, Optimizer>& local() { return local_; }
  int rank() const { return ddp_.rank(); }
  // The arena elements [first, end) this rank updates.
  std::pair<std::size_t, std::size_t> owned() const { return shards_.owned(ddp_.rank()); }

  // Bytes of optimizer state (moments, momentum buffers, fp32 master weights) this rank holds.
  std::size_t state_bytes() const {
    std::size_t bytes = 0;
    local_.optimizer().for_each_state([&](const std::string&, std::span<const Master> values) {
      bytes += values.size_bytes();
    });
    if constexpr (Policy::kMasterWeights) {
      for (std::size_t i = 0; i < local_.size(); ++i)
        bytes += local_.master_weights(i).size_bytes();
    }
    return bytes;
  }

  // The whole optimizer's state, as the unsharded PrecisionOptimizer over all parameters would
  // export it (names, sizes, values), on every rank. Collective.
  Snapshot export_state() {
    const Snapshot mine = local_.export_state();
    auto& arena = ddp_.network().parameter_arena();
    const std::vector<std::string> names = parameter_names();
    const std::size_t first = owned().first;
    const std::size_t end = owned().second;
    comm::Communicator& comm = ddp_.communicator();

    // One flat arena-shaped array per kind of state: this rank fills its shard, an allgatherv
    // completes it, and the parameters are cut out of it.
    std::map<std::string, const std::vector<Master>*> state_by_name;
    for (const auto& tensor : mine.state) state_by_name.emplace(tensor.name, &tensor.values);
    std::int32_t has_state = mine.state.empty() ? 0 : 1;
    comm.allreduce(std::span(&has_state, 1), comm::ReduceOp::kMax);
    const auto gather = [&](auto&& local_values) {
      std::vector<Master> flat(arena.size(), Master(0));
      for (std::size_t i = 0; i < pieces_.size(); ++i) {
        const std::span<const Master> values = local_values(i);
        std::copy(values.begin(), values.end(), flat.begin() + pieces_[i].arena_first);
      }
      const std::vector<Master> own(flat.begin() + first, flat.begin() + end);
      std::vector<std::size_t> counts;
      for (int r = 0; r < shards_.ranks(); ++r) {
        const auto owned_by_r = shards_.owned(r);
        counts.push_back(owned_by_r.second - owned_by_r.first);
      }
      comm.allgatherv(std::span<const Master>(own), std::span<Master>(flat),
                      std::span<const std::size_t>(counts));
      return flat;
    };
    const auto cut = [&](const std::vector<Master>& flat, std::size_t p) {
      const auto begin = flat.begin() + static_cast<std::ptrdiff_t>(arena.offset(p));
      return std::vector<Master>(begin, begin + static_cast<std::ptrdiff_t>(arena.size(p)));
    };

    Snapshot full;
    if (has_state) {
      const std::vector<std::string> kinds = state_kinds();
      std::vector<std::vector<Master>> flats;
      for (const std::string& kind : kinds) {
        flats.push_back(gather([&](std::size_t i) {
          return std::span<const Master>(*state_by_name.at(pieces_[i].name + "." + kind));
        }));
      }
      for (std::size_t p = 0; p < names.size(); ++p) {
        for (std::size_t k = 0; k < kinds.size(); ++k)
          full.state.push_back({names[p] + "." + kinds[k], cut(flats[k], p)});
      }
    }
    if (has_state && has_step_counts()) {
      // Every piece of a parameter has taken the same steps; a parameter no shard holds (no
      // elements) has taken them all.
      std::map<std::string, std::int64_t> mine_counts(mine.step_counts.begin(),
                                                      mine.step_counts.end());
      std::vector<std::int64_t> counts(names.size(), -1);
      for (std::size_t p = 0; p < names.size(); ++p) {
        if (const auto found = mine_counts.find(names[p] + ".step"); found != mine_counts.end())
          counts[p] = found->second;
      }
      comm.allreduce(std::span<std::int64_t>(counts), comm::ReduceOp::kMax);
      const std::int64_t most = counts.empty() ? 0 : *std::ranges::max_element(counts);
      for (std::size_t p = 0; p < names.size(); ++p)
        full.step_counts.emplace_back(names[p] + ".step", counts[p] < 0 ? most : counts[p]);
    }
    if constexpr (Policy::kMasterWeights) {
      const std::vector<Master> flat =
          gather([&](std::size_t i) { return local_.master_weights(i); });
      for (std::size_t p = 0; p < names.size(); ++p)
        full.masters.push_back({names[p], cut(flat, p)});
    }
    full.loss_scale = mine.loss_scale;
    return full;
  }

  // Restores this rank's shard of a full snapshot (an export of this class, of the unsharded
  // PrecisionOptimizer over the same network, or a checkpoint's). Local: every rank calls it with
  // the same snapshot. Throws InvalidArgument, before anything changes, naming a tensor that the
  // network does not have or whose size does not fit, and what PrecisionOptimizer::import_state
  // throws.
  void import_state(const Snapshot& full) {
    auto& arena = ddp_.network().parameter_arena();
    const std::vector<std::string> names = parameter_names();
    std::map<std::string, std::size_t> index;
    for (std::size_t p = 0; p < names.size(); ++p) index.emplace(names[p], p);
    const auto sized = [&](const std::string& tensor, const std::string& parameter,
                           const std::vector<Master>& values) -> const std::vector<Master>& {
      const auto found = index.find(parameter);
      if (found == index.end()) {
        throw InvalidArgument("ZeroOptimizer::import_state: the snapshot holds '" + tensor +
                              "', which is not the state of a parameter of this network");
      }
      if (values.size() != arena.size(found->second)) {
        throw InvalidArgument("ZeroOptimizer::import_state: '" + tensor + "' has " +
                              std::to_string(values.size()) + " elements, the parameter " +
                              std::to_string(arena.size(found->second)));
      }
      return values;
    };
    const auto piece_of = [&](const std::vector<Master>& values, const Piece& piece) {
      const auto begin = values.begin() + static_cast<std::ptrdiff_t>(piece.parameter_first);
      return std::vector<Master>(begin, begin + static_cast<std::ptrdiff_t>(piece.size));
    };
    const auto held = [&](const std::string& parameter) {
      return std::ranges::any_of(pieces_, [&](const Piece& p) { return p.name == parameter; });
    };

    Snapshot shard;
    const std::vector<std::string> kinds = state_kinds();
    std::map<std::string, const std::vector<Master>*> state;
    for (const auto& tensor : full.state) {
      const std::size_t dot = tensor.name.rfind('.');
      const std::string kind = dot == std::string::npos ? "" : tensor.name.substr(dot + 1);
      if (std::ranges::find(kinds, kind) == kinds.end()) {
        throw InvalidArgument("ZeroOptimizer::import_state: the snapshot holds '" + tensor.name +
                              "', which this optimizer does not keep");
      }
      state.emplace(tensor.name, &sized(tensor.name, tensor.name.substr(0, dot), tensor.values));
    }
    for (const Piece& piece : pieces_) {
      for (const std::string& kind : kinds) {
        const auto found = state.find(piece.name + "." + kind);
        if (found == state.end()) continue;  // PrecisionOptimizer names what is missing
        shard.state.push_back({found->first, piece_of(*found->second, piece)});
      }
    }
    for (const auto& [name, count] : full.step_counts) {
      const std::string parameter = name.size() > 5 ? name.substr(0, name.size() - 5) : "";
      if (!name.ends_with(".step") || !index.contains(parameter)) {
        throw InvalidArgument("ZeroOptimizer::import_state: the snapshot holds step count '" +
                              name + "', which is not one of a parameter of this network");
      }
      if (held(parameter)) shard.step_counts.emplace_back(name, count);
    }
    for (const auto& master : full.masters) {
      const std::vector<Master>& values = sized(master.name, master.name, master.values);
      for (const Piece& piece : pieces_) {
        if (piece.name == master.name)
          shard.masters.push_back({master.name, piece_of(values, piece)});
      }
    }
    shard.loss_scale = full.loss_scale;
    shard.steps_taken = full.steps_taken;
    shard.steps_skipped = full.steps_skipped;
    local_.import_state(shard);
  }

 private:
  // The part of one parameter that this rank's shard holds.
  struct Piece {
    std::string name;
    std::size_t parameter_first;  // its first element within the parameter
    std::size_t arena_first;      // the same element within the arena
    std::size_t size;
  };

  // The shard's pieces of parameters as optimizer views, in state_dict order; fills `pieces`.
  static std::vector<optim::TypedParamRef<T>> shard_refs(DataParallel<Net>& ddp,
                                                         const ArenaShards& shards,
                                                         std::vector<Piece>& pieces) {
    auto& arena = ddp.network().parameter_arena();
    const std::size_t first = shards.owned(ddp.rank()).first;
    const std::size_t end = shards.owned(ddp.rank()).second;
    std::vector<optim::TypedParamRef<T>> refs;
    std::size_t p = 0;
    ddp.network().visit_parameters([&](const std::string& name, auto&) {
      const std::size_t begin = std::max(first, arena.offset(p));
      const std::size_t stop = std::min(end, arena.offset(p) + arena.size(p));
      if (begin < stop) {
        pieces.push_back({name, begin - arena.offset(p), begin, stop - begin});
        refs.push_back({name, std::span<T>(arena.values() + begin, stop - begin),
                        std::span<T>(arena.gradients() + begin, stop - begin)});
      }
      ++p;
    });
    return refs;
  }

  // After a step: every rank's shard of the values to every rank, in place.
  void gather_values() {
    if (shards_.ranks() == 1) return;
    auto& arena = ddp_.network().parameter_arena();
    const std::span<T> values(arena.values(), arena.size());
    comm::Communicator& comm = ddp_.communicator();
    if (shards_.even_end() > 0) comm.allgather(values.first(shards_.even_end()));
    if (shards_.tail() > 0) comm.broadcast(values.subspan(shards_.even_end()), shards_.ranks() - 1);
  }

  std::vector<std::string> parameter_names() {
    std::vector<std::string> names;
    ddp_.network().visit_parameters([&](const std::string& name, auto&) { names.push_back(name); });
    return names;
  }

  // The kinds of state the optimizer keeps per parameter ("exp_avg", "momentum_buffer", ...), in
  // its order: from one step of a fresh optimizer on one element, since a rank whose shard holds
  // no parameter has no state of its own to look at.
  std::vector<std::string> state_kinds() const {
    Optimizer probe(probe_options_);
    Master value = 0;
    const Master grad = 0;
    const optim::MasterParamRef<Master> ref{"p", std::span<Master>(&value, 1),
                                             std::span<const Master>(&grad, 1)};
    probe.step(std::span<const optim::MasterParamRef<Master>>(&ref, 1), 0.0);
    std::vector<std::string> kinds;
    probe.for_each_state([&](const std::string& name, std::span<const Master>) {
      kinds.push_back(name.substr(2));
    });
    return kinds;
  }

  bool has_step_counts() const { return optim::detail::HasStepCounts<Optimizer>; }

  DataParallel<Net>& ddp_;
  ArenaShards shards_;
  typename Optimizer::Options probe_options_;
  std::vector<Piece> pieces_;  // filled by shard_refs before local_ is built
  optim::PrecisionOptimizer<Policy, Optimizer> local_;
};

// save_checkpoint (train/checkpoint.hpp) under ZeRO-1. Collective: every rank gathers the full
// optimizer state, rank 0 writes it, in the format of the unsharded optimizer's. Returns the files
// on rank 0, nothing on the others.
template <class Network, class Precision, class Optimizer>
std::optional<CheckpointFiles> save_checkpoint(
    const std::filesystem::path& dir, Network& network,
    ZeroOptimizer<Network, Precision, Optimizer>& optimizer, const TrainingState& state,
    const CheckpointOptions& options = {}) {
  const auto snapshot = optimizer.export_state();
  if (optimizer.rank() != 0) return std::nullopt;
  return detail::write_checkpoint<Precision>(
      dir, detail::model_record(network, state_tensors(network)), optimizer.local().optimizer(),
      detail::scaler_options_of(optimizer.local()), snapshot, state, options);
}

// load_checkpoint under ZeRO-1: every rank reads the checkpoint (of any world size, sharded or
// not) and keeps its shard of the optimizer state. Local; checks and errors as load_checkpoint's.
template <class Network, class Precision, class Optimizer>
TrainingState load_checkpoint(const std::filesystem::path& path, Network& network,
                              ZeroOptimizer<Network, Precision, Optimizer>& optimizer,
                              const CheckpointOptions& options = {}) {
  std::vector<std::string> parameter_names;
  network.visit_parameters(
      [&](const std::string& name, auto&) { parameter_names.push_back(name); });
  const detail::ModelRecord record = detail::model_record(network, state_tensors(network));
  auto contents = detail::read_checkpoint<Precision>(
      path, record, optimizer.local().optimizer(), detail::scaler_options_of(optimizer.local()),
      parameter_names, optim::detail::has_optimizer_state(optimizer.local().optimizer()), options);
  optimizer.import_state(contents.optimizer);
  detail::restore_network(network, record, contents);
  return std::move(contents.state);
}

}  // namespace coltrain::train
