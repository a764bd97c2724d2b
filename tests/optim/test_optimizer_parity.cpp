// Parity with PyTorch 1.13: replays the runs optimizer_references.py recorded with torch.optim's
// SGD, Adam and AdamW (single-tensor path) driven by torch's LR schedulers, feeding the same
// gradients and taking the learning rate from coltrain's own closed-form schedules.
//
// Tolerances. Parameters and optimizer state agree within 1e-6 relative (about 8 float ulps; the
// worst seen is 3e-7). Values below 0.1 in magnitude are compared at an absolute 1e-7 instead,
// about one ulp of the O(1) terms they are computed from, except the second moments (sums of
// squares, which cannot cancel), which are compared purely relatively. The loops round where
// PyTorch's tensor operations round, but PyTorch's AVX2 kernels fuse `a + alpha * b` into one
// FMA where these portable loops round twice, and such one-ulp differences carry from step to
// step and are largest, relatively, where a value passes near zero. Learning rates agree within
// 1e-12 relative: the gap between PyTorch's recursive schedulers and the closed forms.

#include <coltrain/core/json.hpp>
#include <coltrain/optim/adam.hpp>
#include <coltrain/optim/lr_schedule.hpp>
#include <coltrain/optim/sgd.hpp>

#include <catch2/catch.hpp>

#include "../support/parity.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace {

using coltrain::Json;
using coltrain::optim::Adam;
using coltrain::optim::AdamW;
using coltrain::optim::ConstantLr;
using coltrain::optim::CosineAnnealingLr;
using coltrain::optim::LinearWarmup;
using coltrain::optim::MultiStepLr;
using coltrain::optim::ParamRef;
using coltrain::optim::Sgd;
using coltrain::optim::StepLr;
using coltrain::testing::parity_reference;
using coltrain::testing::require_close;
using Schedule = std::function<double(std::int64_t)>;

constexpr double kValueRel = 1e-6;
constexpr double kValueFloor = 0.1;
constexpr double kSecondMomentFloor = 0.0;
constexpr double kLrRel = 1e-12;
constexpr double kLrFloor = 1e-6;

double number(const Json& spec, const char* key) { return spec[key].get<double>(); }
std::int64_t integer(const Json& spec, const char* key) { return spec[key].get<std::int64_t>(); }
std::vector<std::int64_t> integers(const Json& spec, const char* key) {
  std::vector<std::int64_t> out;
  for (const Json& value : spec[key].elements()) out.push_back(value.get<std::int64_t>());
  return out;
}

// The schedule a config describes, built from coltrain's closed forms.
Schedule make_schedule(const Json& spec) {
  const auto type = spec["type"].get<std::string>();
  if (type == "constant") {
    return ConstantLr{number(spec, "base_lr"), number(spec, "factor"),
                      integer(spec, "total_iters")};
  }
  if (type == "step") {
    return StepLr{number(spec, "base_lr"), integer(spec, "step_size"), number(spec, "gamma")};
  }
  if (type == "multi_step") {
    return MultiStepLr{number(spec, "base_lr"), integers(spec, "milestones"),
                       number(spec, "gamma")};
  }
  if (type == "cosine") {
    return CosineAnnealingLr{number(spec, "base_lr"), integer(spec, "t_max"),
                             number(spec, "eta_min")};
  }
  if (type == "warmup") {
    return LinearWarmup<Schedule>{integer(spec, "warmup_steps"), number(spec, "start_factor"),
                                  make_schedule(spec["inner"])};
  }
  FAIL("unknown schedule type " << type);
  return {};
}

struct Param {
  std::string name;
  std::vector<float> value;
  std::vector<float> grad;
  bool weight_decay;
};

template <class Optimizer>
void replay(const std::string& case_name, Optimizer& optimizer) {
  const auto reference = parity_reference(case_name + ".safetensors");
  const Json config = Json::parse(reference.metadata().at("config"));
  const Schedule schedule = make_schedule(config["schedule"]);
  const std::int64_t steps = integer(config, "steps");
  const std::vector<double> torch_lrs = reference.read<double>("lr");
  REQUIRE(torch_lrs.size() == static_cast<std::size_t>(steps));

  std::vector<Param> params;
  for (const Json& p : config["params"]) {
    const auto name = p["name"].get<std::string>();
    std::vector<float> initial = reference.read<float>("initial." + name);
    params.push_back(
        {name, initial, std::vector<float>(initial.size()), p["weight_decay"].get<bool>()});
  }
  std::vector<ParamRef> refs;
  for (Param& p : params) refs.push_back({p.name, p.value, p.grad, p.weight_decay});

  std::vector<double> lrs;
  for (std::int64_t k = 0; k < steps; ++k) {
    lrs.push_back(schedule(k));
    for (Param& p : params) {
      // Into the existing buffer: the ParamRefs point at it.
      reference.read_into("grad." + std::to_string(k) + "." + p.name, std::span<float>(p.grad));
    }
    optimizer.step(refs, lrs.back());
    for (const Param& p : params) {
      const std::string key = "value." + std::to_string(k) + "." + p.name;
      require_close(p.value, reference.read<float>(key), kValueRel, kValueFloor,
                    case_name + " " + key);
    }
  }
  require_close(lrs, torch_lrs, kLrRel, kLrFloor, case_name + " learning rates");

  // The final state, under the names a checkpoint will use; both sides must hold the same set.
  std::set<std::string> torch_state;
  for (const auto& entry : reference.entries()) {
    if (entry.name.starts_with("state.") && !entry.name.ends_with(".step")) {
      torch_state.insert(entry.name.substr(6));
    }
  }
  std::set<std::string> ours;
  optimizer.for_each_state([&](const std::string& name, std::span<const float> values) {
    ours.insert(name);
    INFO(case_name << ": state " << name);
    REQUIRE(reference.contains("state." + name));
    const double floor = name.ends_with(".exp_avg_sq") ? kSecondMomentFloor : kValueFloor;
    require_close(std::vector<float>(values.begin(), values.end()),
                  reference.read<float>("state." + name), kValueRel, floor,
                  case_name + " state " + name);
  });
  CHECK(ours == torch_state);
}

template <class Optimizer>
void replay_adam(const std::string& case_name) {
  const auto reference = parity_reference(case_name + ".safetensors");
  const Json config = Json::parse(reference.metadata().at("config"));
  const Json& o = config["options"];
  Optimizer optimizer(typename Optimizer::Options{.lr = number(o, "lr"),
                                                  .beta1 = number(o, "beta1"),
                                                  .beta2 = number(o, "beta2"),
                                                  .eps = number(o, "eps"),
                                                  .weight_decay = number(o, "weight_decay")});
  replay(case_name, optimizer);
  // PyTorch 1.13 keeps each parameter's step count as a float tensor.
  optimizer.for_each_step([&](const std::string& name, std::int64_t step) {
    const std::vector<float> torch_step = reference.read<float>("state." + name);
    REQUIRE(torch_step.size() == 1);
    CHECK(static_cast<float>(step) == torch_step[0]);
  });
}

void replay_sgd(const std::string& case_name) {
  const auto reference = parity_reference(case_name + ".safetensors");
  const Json config = Json::parse(reference.metadata().at("config"));
  const Json& o = config["options"];
  Sgd optimizer(Sgd::Options{.lr = number(o, "lr"),
                             .momentum = number(o, "momentum"),
                             .dampening = number(o, "dampening"),
                             .weight_decay = number(o, "weight_decay"),
                             .nesterov = o["nesterov"].get<bool>()});
  replay(case_name, optimizer);
}

}  // namespace

TEST_CASE("SGD matches PyTorch (sgd_plain)", "[optim][parity][sgd]") { replay_sgd("sgd_plain"); }

TEST_CASE("SGD with weight decay matches PyTorch (sgd_weight_decay)", "[optim][parity][sgd]") {
  replay_sgd("sgd_weight_decay");
}

TEST_CASE("SGD with momentum matches PyTorch (sgd_momentum)", "[optim][parity][sgd]") {
  replay_sgd("sgd_momentum");
}

TEST_CASE("SGD with momentum, dampening and weight decay matches PyTorch (sgd_dampening)",
          "[optim][parity][sgd]") {
  replay_sgd("sgd_dampening");
}

TEST_CASE("SGD with Nesterov momentum and weight decay matches PyTorch (sgd_nesterov)",
          "[optim][parity][sgd]") {
  replay_sgd("sgd_nesterov");
}

TEST_CASE("Adam matches PyTorch (adam)", "[optim][parity][adam]") { replay_adam<Adam>("adam"); }

TEST_CASE("Adam with L2 weight decay matches PyTorch (adam_l2)", "[optim][parity][adam]") {
  replay_adam<Adam>("adam_l2");
}

TEST_CASE("AdamW matches PyTorch (adamw)", "[optim][parity][adam]") { replay_adam<AdamW>("adamw"); }

TEST_CASE("AdamW with strong weight decay matches PyTorch (adamw_strong_decay)",
          "[optim][parity][adam]") {
  replay_adam<AdamW>("adamw_strong_decay");
}

TEST_CASE("AdamW without weight decay matches PyTorch (adamw_no_decay)", "[optim][parity][adam]") {
  replay_adam<AdamW>("adamw_no_decay");
}

TEST_CASE("LR schedules match torch.optim.lr_scheduler", "[optim][parity][schedule]") {
  const auto reference = parity_reference("schedules.safetensors");
  const Json configs = Json::parse(reference.metadata().at("config"));
  REQUIRE(configs.size() >= 8);
  for (const auto& [name, spec] : configs.items()) {
    const Schedule schedule = make_schedule(spec);
    const std::vector<double> torch_lrs = reference.read<double>(name);
    std::vector<double> ours;
    for (std::size_t t = 0; t < torch_lrs.size(); ++t) {
      ours.push_back(schedule(static_cast<std::int64_t>(t)));
    }
    require_close(ours, torch_lrs, kLrRel, kLrFloor, "schedule " + name);
  }
}
