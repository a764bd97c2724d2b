// state_dict files and checkpoints: PyTorch's names, dtypes and shapes; strict loading with errors
// that name the tensor, the expected and found values and the file; the checkpoint's files and
// sidecar; pruning to the last `keep`; crash safety (a save interrupted between its files, leftover
// temporary files, a damaged newer set) leaving the previous checkpoint loadable; and the checks
// load_checkpoint makes before it changes anything.

#include <catch2/catch.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/nn.hpp>
#include <coltrain/optim.hpp>
#include <coltrain/tensor/safetensors.hpp>
#include <coltrain/train/checkpoint.hpp>
#include <coltrain/train/state_dict.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../support/temp_dir.hpp"
#include "train_test_helpers.hpp"

namespace {

namespace fs = std::filesystem;
using namespace coltrain;
using Catch::Matchers::Contains;
using coltrain::testing::TempDir;
using train_test::TinyNet;
using train_test::Trainer;

using SgdTrainer = Trainer<optim::Fp32, optim::Sgd>;
const optim::Sgd kSgd({.momentum = 0.9});

std::map<std::string, std::pair<DataType, std::vector<std::int64_t>>> entries_of(
    const fs::path& file) {
  std::map<std::string, std::pair<DataType, std::vector<std::int64_t>>> out;
  const tensor::SafetensorsReader reader(file);
  for (const auto& e : reader.entries()) out[e.name] = {e.dtype, e.shape};
  return out;
}

Json read_json(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

// The value at a JSON pointer of object keys ("/extra/note"), added (as null) where missing.
Json& member_at(Json& json, std::string_view pointer) {
  Json* at = &json;
  while (!pointer.empty()) {
    pointer.remove_prefix(1);  // '/'
    const std::size_t slash = pointer.find('/');
    at = &(*at)[pointer.substr(0, slash)];
    pointer = slash == std::string_view::npos ? std::string_view() : pointer.substr(slash);
  }
  return *at;
}

std::vector<std::string> sorted_names(const TempDir& dir) {
  std::vector<std::string> names = dir.names();
  std::ranges::sort(names);
  return names;
}

using Entry = tensor::SafetensorsEntry;

// Copies a safetensors file, each tensor passed through `edit(writer, entry, bytes)`.
template <class Edit>
void rewrite(const fs::path& from, const fs::path& to, Edit&& edit) {
  const tensor::SafetensorsReader reader(from);
  tensor::SafetensorsWriter writer;
  for (const Entry& e : reader.entries()) edit(writer, e, reader.bytes(e.name));
  writer.write(to);
}

}  // namespace

TEST_CASE("A state_dict file has PyTorch's names, dtypes and shapes", "[train][state_dict]") {
  TempDir dir("coltrain_ckpt");
  nn::Network<TinyNet> net({.seed = 1});
  train::save_state_dict(dir / "model.safetensors", net);
  const std::map<std::string, std::pair<DataType, std::vector<std::int64_t>>> expected = {
      {"conv.weight", {DataType::kFloat32, {4, 2, 3, 3}}},
      {"conv.bias", {DataType::kFloat32, {4}}},
      {"bn.weight", {DataType::kFloat32, {4}}},
      {"bn.bias", {DataType::kFloat32, {4}}},
      {"bn.running_mean", {DataType::kFloat32, {4}}},
      {"bn.running_var", {DataType::kFloat32, {4}}},
      {"bn.num_batches_tracked", {DataType::kInt64, {}}},
      {"fc.weight", {DataType::kFloat32, {5, 144}}},
      {"fc.bias", {DataType::kFloat32, {5}}}};
  CHECK(entries_of(dir / "model.safetensors") == expected);
  CHECK(tensor::SafetensorsReader(dir / "model.safetensors").metadata().at("format") == "pt");

  // 16-bit storage: parameters as stored; BatchNorm's statistics in the compute type (float).
  nn::Network<TinyNet, half> net16({.seed = 1});
  train::save_state_dict(dir / "model16.safetensors", net16);
  const auto entries16 = entries_of(dir / "model16.safetensors");
  CHECK(entries16.at("conv.weight").first == DataType::kFloat16);
  CHECK(entries16.at("bn.running_var").first == DataType::kFloat32);
  CHECK(entries16.at("bn.num_batches_tracked").first == DataType::kInt64);
}

TEST_CASE("A state_dict round-trips, and loading is strict", "[train][state_dict]") {
  TempDir dir("coltrain_ckpt");
  SgdTrainer trained(kSgd);
  trained.train(0, 20);
  const fs::path file = dir / "model.safetensors";
  train::save_state_dict(file, trained.net);

  nn::Network<TinyNet> fresh({.seed = 99});
  const auto untouched = train_test::state_bytes(fresh);
  auto expect_rejected = [&](const fs::path& bad, const std::string& message) {
    CHECK_THROWS_WITH(train::load_state_dict(bad, fresh),
                      Contains(message) && Contains(bad.string()));
    CHECK(train_test::state_bytes(fresh) == untouched);  // nothing copied
  };

  rewrite(file, dir / "missing.safetensors",
          [](tensor::SafetensorsWriter& writer, const Entry& e, std::span<const std::byte> bytes) {
            if (e.name != "bn.running_var") writer.add_bytes(e.name, e.dtype, e.shape, bytes);
          });
  expect_rejected(dir / "missing.safetensors", "lacks 1 tensor(s) of the model: 'bn.running_var'");

  rewrite(file, dir / "extra.safetensors",
          [](tensor::SafetensorsWriter& writer, const Entry& e, std::span<const std::byte> bytes) {
            writer.add_bytes(e.name, e.dtype, e.shape, bytes);
            if (e.name == "fc.bias") writer.add("extra.weight", {1}, std::vector<float>{1.0f});
          });
  expect_rejected(dir / "extra.safetensors", "the model does not have: 'extra.weight'");

  rewrite(file, dir / "dtype.safetensors",
          [](tensor::SafetensorsWriter& writer, const Entry& e, std::span<const std::byte> bytes) {
            if (e.name == "bn.num_batches_tracked") {
              writer.add(e.name, {}, std::vector<std::int32_t>{20});
            } else {
              writer.add_bytes(e.name, e.dtype, e.shape, bytes);
            }
          });
  expect_rejected(dir / "dtype.safetensors",
                  "tensor 'bn.num_batches_tracked' of the model is I32 in the file, expected I64");
  rewrite(file, dir / "shape.safetensors",
          [](tensor::SafetensorsWriter& writer, const Entry& e, std::span<const std::byte> bytes) {
            writer.add_bytes(e.name, e.dtype,
                             e.name == "fc.weight" ? std::vector<std::int64_t>{144, 5} : e.shape,
                             bytes);
          });
  expect_rejected(
      dir / "shape.safetensors",
      "tensor 'fc.weight' of the model has shape [144, 5] in the file, expected [5, 144]");

  train::load_state_dict(file, fresh);
  CHECK(train_test::state_bytes(fresh) == train_test::state_bytes(trained.net));
  const std::int64_t tracked =
      tensor::SafetensorsReader(file).read<std::int64_t>("bn.num_batches_tracked")[0];
  CHECK(tracked == 20);
}

TEST_CASE("A checkpoint is three files: weights, optimizer state and a sidecar",
          "[train][checkpoint]") {
  TempDir dir("coltrain_ckpt");
  Trainer<optim::MixedFp16, optim::Adam> run(optim::Adam({.lr = 1e-3}), {.growth_interval = 50});
  run.train(0, 60);
  std::vector<fs::path> written;
  const auto files = train::save_checkpoint(
      dir.path(), run.net, run.optimizer,
      {.epoch = 3, .global_step = 60, .extra = Json::object({{"best_top1", 0.5}})},
      {.model_name = "tiny", .on_file_written = [&](const fs::path& p) { written.push_back(p); }});
  CHECK(sorted_names(dir) == std::vector<std::string>{"checkpoint-000001.json",
                                                      "checkpoint-000001.model.safetensors",
                                                      "checkpoint-000001.optimizer.safetensors"});
  CHECK(written == std::vector<fs::path>{files.model, files.optimizer, files.sidecar});

  const auto model = entries_of(files.model);
  CHECK(model.size() == 9);
  CHECK(model.at("fc.weight").first == DataType::kFloat16);
  const auto state = entries_of(files.optimizer);
  CHECK(state.size() == 6 * 3);  // exp_avg, exp_avg_sq and the fp32 master of 6 parameters
  CHECK(state.at("conv.weight.exp_avg") ==
        std::pair(DataType::kFloat32, std::vector<std::int64_t>{4, 2, 3, 3}));
  CHECK(state.at("fc.bias.exp_avg_sq").second == std::vector<std::int64_t>{5});
  CHECK(state.at("fc.weight.master_weight") ==
        std::pair(DataType::kFloat32, std::vector<std::int64_t>{5, 144}));

  const Json sidecar = read_json(files.sidecar);
  CHECK(sidecar["format"] == "coltrain.checkpoint");
  CHECK(sidecar["format_version"] == train::kCheckpointFormatVersion);
  CHECK(sidecar["epoch"] == 3);
  CHECK(sidecar["global_step"] == 60);
  CHECK(sidecar["files"]["model"]["name"] == "checkpoint-000001.model.safetensors");
  CHECK(sidecar["files"]["optimizer"]["bytes"] == fs::file_size(files.optimizer));
  CHECK(sidecar["model"]["name"] == "tiny");
  CHECK(sidecar["model"]["parameter_count"] == nn::Network<TinyNet>::kParameterCount);
  CHECK(sidecar["model"]["storage"] == "F16");
  CHECK(sidecar["precision"] == "fp16");
  CHECK(sidecar["optimizer"]["type"] == "Adam");
  CHECK(sidecar["optimizer"]["hyperparameters"]["beta2"] == 0.999);
  CHECK(sidecar["optimizer"]["step_counts"]["conv.weight.step"] ==
        run.optimizer.optimizer().step_count(0));
  CHECK(sidecar["loss_scaler"]["scale"] == run.optimizer.scaler().scale());
  CHECK(sidecar["loss_scaler"]["growth_tracker"] == run.optimizer.scaler().growth_tracker());
  CHECK(sidecar["loss_scaler"]["growth_interval"] == 50);
  CHECK(sidecar["rng"]["network_seed"] == train_test::kSeed);
  CHECK(sidecar["rng"]["context_step"] == 60);
  CHECK(sidecar["extra"]["best_top1"] == 0.5);
}

TEST_CASE("Saving keeps the newest `keep` checkpoints", "[train][checkpoint]") {
  TempDir dir("coltrain_ckpt");
  SgdTrainer run(kSgd);
  for (int i = 1; i <= 4; ++i) {
    run.train(10 * (i - 1), 10 * i);
    const auto files = train::save_checkpoint(dir.path(), run.net, run.optimizer,
                                              {.epoch = i, .global_step = 10 * i});
    CHECK(files.sequence == i);
  }
  CHECK(sorted_names(dir) ==
        std::vector<std::string>{"checkpoint-000003.json", "checkpoint-000003.model.safetensors",
                                 "checkpoint-000003.optimizer.safetensors",
                                 "checkpoint-000004.json", "checkpoint-000004.model.safetensors",
                                 "checkpoint-000004.optimizer.safetensors"});
  train::save_checkpoint(dir.path(), run.net, run.optimizer, {.epoch = 5, .global_step = 50},
                         {.keep = 1});
  CHECK(dir.names().size() == 3);
  REQUIRE(train::find_latest_checkpoint(dir.path()).has_value());
  CHECK(train::find_latest_checkpoint(dir.path())->sequence == 5);
  CHECK_THROWS_AS(train::save_checkpoint(dir.path(), run.net, run.optimizer, {}, {.keep = 0}),
                  InvalidArgument);
}

TEST_CASE("A crash during a save leaves the previous checkpoint loadable", "[train][checkpoint]") {
  TempDir dir("coltrain_ckpt");
  SgdTrainer run(kSgd);
  run.train(0, 30);
  train::save_checkpoint(dir.path(), run.net, run.optimizer, {.epoch = 1, .global_step = 30});
  const auto at_checkpoint = train_test::state_bytes(run.net);
  const auto state_at_checkpoint = train_test::optimizer_values(run.optimizer);
  run.train(30, 60);

  struct Crash : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  // The process dies after the weights, then (another time) after the optimizer file: no sidecar,
  // so neither newer set counts.
  for (const std::string after : {".model.safetensors", ".optimizer.safetensors"}) {
    INFO("crash after " << after);
    const train::CheckpointOptions crash_after{.on_file_written = [&](const fs::path& p) {
      if (p.string().ends_with(after)) throw Crash("simulated crash");
    }};
    CHECK_THROWS_AS(train::save_checkpoint(dir.path(), run.net, run.optimizer,
                                           {.epoch = 2, .global_step = 60}, crash_after),
                    Crash);
    REQUIRE(train::find_latest_checkpoint(dir.path()).has_value());
    CHECK(train::find_latest_checkpoint(dir.path())->sequence == 1);
  }
  // What a crash can also leave: temporary files (a sidecar half written under its temporary
  // name) and a newer set cut short.
  { std::ofstream(dir / ".checkpoint-000009.json.tmp.4242.0") << R"({"format": "colt)"; }
  { std::ofstream(dir / "checkpoint-000009.model.safetensors") << "truncated"; }
  const auto latest = train::find_latest_checkpoint(dir.path());
  REQUIRE(latest.has_value());
  CHECK(latest->sequence == 1);

  SgdTrainer resumed(kSgd);
  const auto state = train::load_checkpoint(dir.path(), resumed.net, resumed.optimizer);
  CHECK(state.global_step == 30);
  CHECK(train_test::state_bytes(resumed.net) == at_checkpoint);
  const auto restored = train_test::optimizer_values(resumed.optimizer);
  REQUIRE(restored.size() == state_at_checkpoint.size());
  for (std::size_t i = 0; i < restored.size(); ++i) {
    CHECK(train_test::same_bits(restored[i].second, state_at_checkpoint[i].second));
  }

  // The next save clears the debris and does not reuse its numbers.
  const auto next =
      train::save_checkpoint(dir.path(), run.net, run.optimizer, {.epoch = 2, .global_step = 60});
  CHECK(next.sequence == 10);
  CHECK(sorted_names(dir) ==
        std::vector<std::string>{"checkpoint-000001.json", "checkpoint-000001.model.safetensors",
                                 "checkpoint-000001.optimizer.safetensors",
                                 "checkpoint-000010.json", "checkpoint-000010.model.safetensors",
                                 "checkpoint-000010.optimizer.safetensors"});

  // A committed set whose file was cut short afterwards is passed over, with a reason on request.
  fs::resize_file(next.optimizer, fs::file_size(next.optimizer) - 4);
  CHECK(train::find_latest_checkpoint(dir.path())->sequence == 1);
  CHECK_THROWS_WITH(train::load_checkpoint(next.sidecar, resumed.net, resumed.optimizer),
                    Contains("has " + std::to_string(fs::file_size(next.optimizer)) + " bytes") &&
                        Contains(next.optimizer.string()));
}

TEST_CASE("Loading checks the checkpoint against the network and optimizer first",
          "[train][checkpoint]") {
  TempDir dir("coltrain_ckpt");
  SgdTrainer run(kSgd);
  run.train(0, 10);
  const auto files = train::save_checkpoint(
      dir.path(), run.net, run.optimizer, {.epoch = 1, .global_step = 10}, {.model_name = "tiny"});

  SgdTrainer target(kSgd);
  const auto untouched = train_test::state_bytes(target.net);
  auto rejected = [&](auto&& load, const std::string& message) {
    CHECK_THROWS_WITH(load(), Contains(message) && Contains(files.sidecar.string()));
    CHECK(train_test::state_bytes(target.net) == untouched);
  };

  rejected(
      [&] {
        train::load_checkpoint(dir.path(), target.net, target.optimizer,
                               {.model_name = "resnet20"});
      },
      "the checkpoint's model is 'tiny', this one's is 'resnet20'");
  Trainer<optim::Fp32, optim::Sgd> other_seed(kSgd, {}, 5);
  CHECK_THROWS_WITH(train::load_checkpoint(dir.path(), other_seed.net, other_seed.optimizer),
                    Contains("network seed") && Contains("is 17, this one's is 5"));
  Trainer<optim::Fp32, optim::Sgd> other_momentum(optim::Sgd({.momentum = 0.8}));
  CHECK_THROWS_WITH(
      train::load_checkpoint(dir.path(), other_momentum.net, other_momentum.optimizer),
      Contains("optimizer setting 'momentum' is 0.9, this one's is 0.8"));
  Trainer<optim::Fp32, optim::Adam> adam(optim::Adam{});
  CHECK_THROWS_WITH(train::load_checkpoint(dir.path(), adam.net, adam.optimizer),
                    Contains("the checkpoint's optimizer is SGD, this one's is Adam"));
  Trainer<optim::MixedBf16, optim::Sgd> bf16(kSgd);
  CHECK_THROWS_WITH(train::load_checkpoint(dir.path(), bf16.net, bf16.optimizer),
                    Contains("storage type is F32, this one's is BF16"));
  using Wider = nn::Sequential<nn::Input<2, 6, 6>, nn::Named<"conv", nn::Conv2d<4, 3, 1, 1>>,
                               nn::Named<"bn", nn::BatchNorm2d<>>, nn::ReLU, nn::Flatten,
                               nn::Named<"fc", nn::Linear<6>>>;
  nn::Network<Wider> wider({.seed = train_test::kSeed});
  auto wider_params = optim::parameters_of(wider);
  optim::PrecisionOptimizer<optim::Fp32, optim::Sgd> wider_sgd(wider_params, kSgd);
  CHECK_THROWS_WITH(
      train::load_checkpoint(dir.path(), wider, wider_sgd),
      Contains("parameter count is " + std::to_string(nn::Network<TinyNet>::kParameterCount) +
               ", this one's is " + std::to_string(nn::Network<Wider>::kParameterCount)));

  // A checkpoint without optimizer state (saved before the first step) cannot reset a stepped
  // optimizer.
  TempDir early_dir("coltrain_ckpt");
  SgdTrainer early(kSgd);
  train::save_checkpoint(early_dir.path(), early.net, early.optimizer, {});
  CHECK_THROWS_WITH(train::load_checkpoint(early_dir.path(), run.net, run.optimizer),
                    Contains("load into a freshly constructed one"));

  // A sidecar from a newer coltrain, and a directory without checkpoints.
  Json sidecar = read_json(files.sidecar);
  sidecar["format_version"] = train::kCheckpointFormatVersion + 1;
  std::ofstream(files.sidecar) << sidecar.dump();
  CHECK_THROWS_WITH(train::load_checkpoint(files.sidecar, target.net, target.optimizer),
                    Contains("written by a newer coltrain"));
  TempDir empty("coltrain_ckpt");
  CHECK_THROWS_AS(train::load_checkpoint(empty.path(), target.net, target.optimizer), IoError);
  CHECK(train_test::state_bytes(target.net) == untouched);
}

// Found by reading the sidecar parser while writing tests/fuzz/fuzz_checkpoint.cpp: a sidecar is a
// file on disk, and a damaged or hostile one must be an IoError that names the file and the field,
// never a crash, a JsonError that escapes unwrapped, or a value that loads as a different one.
TEST_CASE("A damaged sidecar is an IoError naming the field, never a crash or a wrapped value",
          "[train][checkpoint][fuzz]") {
  TempDir dir("coltrain_ckpt");
  SgdTrainer run(kSgd);
  run.train(0, 2);
  const auto files =
      train::save_checkpoint(dir.path(), run.net, run.optimizer, {.epoch = 1, .global_step = 2});
  const Json saved = read_json(files.sidecar);
  auto load_edited = [&](const std::string& sidecar_text) {
    std::ofstream(files.sidecar, std::ios::trunc) << sidecar_text;
    SgdTrainer target(kSgd);
    train::load_checkpoint(files.sidecar, target.net, target.optimizer);
  };
  auto edited = [&](const std::string& pointer, const Json& value) {
    Json sidecar = saved;
    member_at(sidecar, pointer) = value;
    return sidecar.dump();
  };

  // 100,000 nested arrays under "extra" overflowed the stack when load_checkpoint copied them.
  std::string deep = saved.dump();
  const std::size_t extra = deep.find("\"extra\":{}");
  REQUIRE(extra != std::string::npos);
  deep.replace(extra, 10, "\"extra\":" + std::string(100'000, '[') + std::string(100'000, ']'));
  const std::size_t too_deep = extra + 8 + train::detail::kSidecarMaxDepth - 1;
  try {
    load_edited(deep);
    FAIL("a sidecar nested 100,000 levels deep loaded");
  } catch (const IoError& e) {
    CHECK_THAT(e.what(), Contains("nests arrays or objects deeper than 64 levels") &&
                             Contains(files.sidecar.string()));
    CHECK(e.context().offset == too_deep);
  }
  // A sidecar cut short: the error points at its end, where the JSON stops.
  try {
    load_edited(saved.dump().substr(0, 40));
    FAIL("a sidecar cut short loaded");
  } catch (const IoError& e) {
    CHECK_THAT(e.what(), Contains("the sidecar is not valid JSON"));
    CHECK(e.context().offset == 40);
  }
  // Brackets inside strings are text, not nesting.
  CHECK_NOTHROW(load_edited(edited("/extra/note", std::string(1000, '['))));

  // "extra" that is not an object made the trainer's resume throw the JSON library's type error.
  CHECK_THROWS_AS(load_edited(edited("/extra", Json::array())), IoError);
  CHECK_THROWS_WITH(load_edited(edited("/extra", Json::array())),
                    Contains("the sidecar's /extra is missing or not an object"));
  // 2^64 - 1 was read as epoch -1, 2^32 + 1 as format version 1.
  CHECK_THROWS_WITH(load_edited(edited("/epoch", std::numeric_limits<std::uint64_t>::max())),
                    Contains("the sidecar's /epoch is missing or not a 64-bit integer"));
  CHECK_THROWS_WITH(load_edited(edited("/global_step", -3)),
                    Contains("the sidecar's /global_step is negative (-3)"));
  CHECK_THROWS_WITH(load_edited(edited("/format_version", (std::int64_t{1} << 32) + 1)),
                    Contains("format version 4294967297 was written by a newer coltrain"));
  CHECK_THROWS_WITH(load_edited(edited("/format_version", 0)),
                    Contains("format version 0 is not one coltrain writes"));
  CHECK_NOTHROW(load_edited(saved.dump()));
}
