// SGD, Adam and AdamW: single steps computed by hand from PyTorch's update rules, the per-index
// state and its checks, for_each_state names, and the argument errors. Parity over many steps
// with PyTorch itself is in test_optimizer_parity.cpp.

#include <coltrain/optim/adam.hpp>
#include <coltrain/optim/sgd.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::Contains;
using coltrain::InvalidArgument;
using coltrain::optim::Adam;
using coltrain::optim::AdamW;
using coltrain::optim::ParamRef;
using coltrain::optim::Sgd;

// One parameter of a test model: owns its values and gradients.
struct Param {
  std::string name;
  std::vector<float> value;
  std::vector<float> grad;
  bool weight_decay = true;

  ParamRef ref() { return {name, value, grad, weight_decay}; }
};

std::vector<ParamRef> refs(std::vector<Param>& params) {
  std::vector<ParamRef> result;
  for (Param& p : params) result.push_back(p.ref());
  return result;
}

template <class Optimizer>
std::map<std::string, std::vector<float>> state_of(const Optimizer& optimizer) {
  std::map<std::string, std::vector<float>> state;
  optimizer.for_each_state([&](std::string name, std::span<const float> values) {
    state[name] = std::vector<float>(values.begin(), values.end());
  });
  return state;
}

// Adam's update in double, written from the paper's form (with PyTorch's eps placement), to check
// the float implementation against.
struct AdamReference {
  double value, m = 0, v = 0;
  int step = 0;

  void update(double grad, double lr, double beta1, double beta2, double eps) {
    ++step;
    m = beta1 * m + (1 - beta1) * grad;
    v = beta2 * v + (1 - beta2) * grad * grad;
    const double m_hat = m / (1 - std::pow(beta1, step));
    const double v_hat = v / (1 - std::pow(beta2, step));
    value -= lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

}  // namespace

TEST_CASE("SGD without momentum subtracts lr times the gradient", "[optim][sgd]") {
  std::vector<Param> params{{"w", {1.0f, -2.0f}, {0.5f, 0.25f}}};
  Sgd sgd(Sgd::Options{.lr = 0.1});
  sgd.step(refs(params));
  CHECK(params[0].value[0] == Approx(0.95f));
  CHECK(params[0].value[1] == Approx(-2.025f));
  CHECK(state_of(sgd).empty());  // no momentum, no state (as PyTorch: momentum_buffer None)
}

TEST_CASE("SGD step(params, lr) overrides options().lr", "[optim][sgd]") {
  std::vector<Param> params{{"w", {1.0f}, {1.0f}}};
  Sgd sgd(Sgd::Options{.lr = 0.1});
  sgd.step(refs(params), 0.5);
  CHECK(params[0].value[0] == Approx(0.5f));
  sgd.step(refs(params));
  CHECK(params[0].value[0] == Approx(0.4f));
  sgd.step(refs(params), 0.0);  // a schedule may reach zero
  CHECK(params[0].value[0] == Approx(0.4f));
}

TEST_CASE("SGD momentum buffer starts as the first gradient, then blends", "[optim][sgd]") {
  SECTION("no dampening") {
    std::vector<Param> params{{"w", {1.0f}, {1.0f}}};
    Sgd sgd(Sgd::Options{.lr = 0.1, .momentum = 0.9});
    sgd.step(refs(params));
    CHECK(params[0].value[0] == Approx(0.9f));  // buf = 1
    sgd.step(refs(params));
    CHECK(params[0].value[0] == Approx(0.71f));  // buf = 0.9 * 1 + 1 = 1.9
    CHECK(state_of(sgd).at("w.momentum_buffer") == std::vector<float>{1.9f});
  }
  SECTION("dampening applies from the second step on") {
    std::vector<Param> params{{"w", {1.0f}, {1.0f}}};
    Sgd sgd(Sgd::Options{.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
    sgd.step(refs(params));
    CHECK(params[0].value[0] == Approx(0.9f));  // buf = 1, not 0.5
    sgd.step(refs(params));
    CHECK(params[0].value[0] == Approx(0.76f));  // buf = 0.9 + 0.5 = 1.4
  }
  SECTION("nesterov") {
    std::vector<Param> params{{"w", {1.0f}, {1.0f}}};
    Sgd sgd(Sgd::Options{.lr = 0.1, .momentum = 0.9, .nesterov = true});
    sgd.step(refs(params));
    CHECK(params[0].value[0] == Approx(0.81f));  // d = 1 + 0.9 * 1
    sgd.step(refs(params));
    CHECK(params[0].value[0] == Approx(0.539f));  // buf = 1.9, d = 1 + 0.9 * 1.9 = 2.71
  }
}

TEST_CASE("SGD weight decay adds wd * value to the gradient unless exempted", "[optim][sgd]") {
  std::vector<Param> params{{"w", {2.0f}, {0.5f}, true}, {"b", {2.0f}, {0.5f}, false}};
  Sgd sgd(Sgd::Options{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
  sgd.step(refs(params));
  CHECK(params[0].value[0] == Approx(1.93f));  // d = 0.5 + 0.1 * 2
  CHECK(params[1].value[0] == Approx(1.95f));
  // The buffer holds the decayed gradient, as PyTorch's clone of d_p.
  const auto state = state_of(sgd);
  CHECK(state.at("w.momentum_buffer")[0] == Approx(0.7f));
  CHECK(state.at("b.momentum_buffer")[0] == Approx(0.5f));
}

TEST_CASE("SGD keeps state per parameter index", "[optim][sgd]") {
  std::vector<Param> params{{"a", {0.0f, 0.0f}, {1.0f, 2.0f}}, {"", {0.0f}, {-1.0f}}};
  Sgd sgd(Sgd::Options{.lr = 1.0, .momentum = 0.5});
  sgd.step(refs(params));
  params[0].grad = {0.0f, 0.0f};
  params[1].grad = {0.0f};
  sgd.step(refs(params));
  CHECK(params[0].value == std::vector<float>{-1.5f, -3.0f});
  CHECK(params[1].value == std::vector<float>{1.5f});
  const auto state = state_of(sgd);
  REQUIRE(state.size() == 2);
  CHECK(state.at("a.momentum_buffer") == std::vector<float>{0.5f, 1.0f});
  CHECK(state.at("1.momentum_buffer") == std::vector<float>{-0.5f});  // unnamed: its index
}

TEST_CASE("SGD allocate_state creates buffers a checkpoint can fill", "[optim][sgd]") {
  std::vector<Param> params{{"w", {1.0f}, {1.0f}}};
  Sgd sgd(Sgd::Options{.lr = 0.1, .momentum = 0.9});
  sgd.allocate_state(refs(params));
  sgd.for_each_state([](const std::string& name, std::span<float> buffer) {
    CHECK(name == "w.momentum_buffer");
    REQUIRE(buffer.size() == 1);
    buffer[0] = 2.0f;
  });
  sgd.step(refs(params));
  CHECK(params[0].value[0] == Approx(1.0f - 0.1f * 2.8f));  // buf = 0.9 * 2 + 1
}

TEST_CASE("SGD rejects invalid options", "[optim][sgd][errors]") {
  CHECK_THROWS_WITH(Sgd(Sgd::Options{.nesterov = true}), Contains("Nesterov"));
  CHECK_THROWS_WITH(Sgd(Sgd::Options{.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                    Contains("zero dampening"));
  CHECK_THROWS_AS(Sgd(Sgd::Options{.lr = -1}), InvalidArgument);
  CHECK_THROWS_AS(Sgd(Sgd::Options{.momentum = -0.1}), InvalidArgument);
  CHECK_THROWS_AS(Sgd(Sgd::Options{.weight_decay = -1e-4}), InvalidArgument);
  CHECK_NOTHROW(Sgd(Sgd::Options{.momentum = 0.9, .nesterov = true}));
}

TEST_CASE("Optimizers reject a parameter whose values and gradients differ", "[optim][errors]") {
  std::vector<Param> params{{"fc.weight", {1.0f, 2.0f}, {1.0f}}};
  Sgd sgd;
  CHECK_THROWS_WITH(sgd.step(refs(params)), Contains("fc.weight") && Contains("2 values"));
  Adam adam;
  CHECK_THROWS_AS(adam.step(refs(params)), InvalidArgument);
  CHECK(params[0].value == std::vector<float>{1.0f, 2.0f});
}

TEST_CASE("Optimizers reject a changed parameter layout", "[optim][errors]") {
  std::vector<Param> params{{"w", {1.0f, 2.0f}, {1.0f, 1.0f}}, {"b", {0.0f}, {1.0f}}};
  Adam adam;
  adam.step(refs(params));
  const std::vector<Param> before = params;

  std::vector<Param> fewer{params[0]};
  CHECK_THROWS_WITH(adam.step(refs(fewer)), Contains("2 parameters before, now 1"));

  std::vector<Param> resized = params;
  resized[1].value = {0.0f, 0.0f};
  resized[1].grad = {1.0f, 1.0f};
  CHECK_THROWS_WITH(adam.step(refs(resized)), Contains("'b'") && Contains("2 elements"));

  std::vector<Param> swapped{params[1], params[0]};
  CHECK_THROWS_AS(adam.step(refs(swapped)), InvalidArgument);

  Sgd sgd(Sgd::Options{.momentum = 0.9});
  sgd.step(refs(params));
  CHECK_THROWS_WITH(sgd.step(refs(resized)), Contains("'b'"));
  CHECK(adam.step_count(0) == 1);  // nothing changed by the failed steps
}

TEST_CASE("Optimizers reject a negative or NaN learning rate", "[optim][errors]") {
  std::vector<Param> params{{"w", {1.0f}, {1.0f}}};
  Sgd sgd;
  CHECK_THROWS_WITH(sgd.step(refs(params), -0.1), Contains("learning rate -0.1"));
  AdamW adamw;
  CHECK_THROWS_AS(adamw.step(refs(params), std::nan("")), InvalidArgument);
  CHECK(params[0].value[0] == 1.0f);
}

TEST_CASE("Adam's first step moves each value by about lr", "[optim][adam]") {
  // With bias correction the first update is lr * g / (|g| + eps): the sign of the gradient.
  std::vector<Param> params{{"w", {1.0f, 1.0f, 1.0f}, {0.5f, -3.0f, 0.0f}}};
  Adam adam(Adam::Options{.lr = 0.1});
  adam.step(refs(params));
  CHECK(params[0].value[0] == Approx(0.9f));
  CHECK(params[0].value[1] == Approx(1.1f));
  CHECK(params[0].value[2] == 1.0f);
  const auto state = state_of(adam);
  CHECK(state.at("w.exp_avg")[0] == Approx(0.05f));
  CHECK(state.at("w.exp_avg_sq")[1] == Approx(0.009f));
  CHECK(adam.step_count(0) == 1);
}

TEST_CASE("Adam matches the double-precision update rule over several steps", "[optim][adam]") {
  const std::vector<float> grads{0.3f, -0.1f, 0.7f, 0.05f, -0.4f};
  std::vector<Param> params{{"w", {0.5f}, {0.0f}}};
  Adam adam(Adam::Options{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6});
  AdamReference reference{0.5};
  for (float g : grads) {
    params[0].grad[0] = g;
    adam.step(refs(params));
    reference.update(g, 0.01, 0.8, 0.99, 1e-6);
    CHECK(params[0].value[0] == Approx(reference.value).epsilon(1e-6));
  }
  CHECK(adam.step_count(0) == 5);
}

TEST_CASE("Adam adds L2 decay to the gradient, AdamW decays the value", "[optim][adam]") {
  SECTION("Adam") {
    std::vector<Param> params{{"w", {2.0f}, {0.5f}}, {"b", {2.0f}, {0.5f}, false}};
    Adam adam(Adam::Options{.lr = 0.1, .weight_decay = 0.5});
    adam.step(refs(params));
    const auto state = state_of(adam);
    CHECK(state.at("w.exp_avg")[0] == Approx(0.1f * 1.5f));  // g = 0.5 + 0.5 * 2
    CHECK(state.at("b.exp_avg")[0] == Approx(0.1f * 0.5f));
    CHECK(params[0].value[0] == Approx(1.9f));  // first step: the sign, whatever the decay
  }
  SECTION("AdamW") {
    std::vector<Param> params{{"w", {2.0f}, {0.5f}}, {"b", {2.0f}, {0.5f}, false}};
    AdamW adamw(AdamW::Options{.lr = 0.1, .weight_decay = 0.5});
    adamw.step(refs(params));
    CHECK(params[0].value[0] == Approx(2.0f * 0.95f - 0.1f));  // value *= 1 - lr * wd, then Adam
    CHECK(params[1].value[0] == Approx(1.9f));
    CHECK(state_of(adamw).at("w.exp_avg")[0] == Approx(0.05f));  // gradient not decayed
  }
  SECTION("defaults") {
    CHECK(Adam::Options{}.weight_decay == 0.0);
    CHECK(AdamW::Options{}.weight_decay == 1e-2);
    CHECK(AdamW::Options{}.lr == 1e-3);
    CHECK(Adam::Options{}.beta2 == 0.999);
    CHECK(Adam::Options{}.eps == 1e-8);
  }
}

TEST_CASE("Adam exposes its state and step counts under PyTorch's names", "[optim][adam]") {
  std::vector<Param> params{{"conv1.weight", {1.0f, 2.0f}, {0.1f, 0.2f}}, {"", {3.0f}, {0.3f}}};
  AdamW adamw;
  CHECK(state_of(adamw).empty());
  CHECK_THROWS_AS(adamw.step_count(0), InvalidArgument);
  adamw.step(refs(params));
  adamw.step(refs(params));
  const auto state = state_of(adamw);
  CHECK(state.size() == 4);
  CHECK(state.at("conv1.weight.exp_avg").size() == 2);
  CHECK(state.count("conv1.weight.exp_avg_sq") == 1);
  CHECK(state.count("1.exp_avg") == 1);
  std::map<std::string, std::int64_t> steps;
  adamw.for_each_step([&](const std::string& name, std::int64_t& step) { steps[name] = step; });
  CHECK(steps == std::map<std::string, std::int64_t>{{"conv1.weight.step", 2}, {"1.step", 2}});
}

TEST_CASE("Adam state can be allocated and restored for a checkpoint", "[optim][adam]") {
  std::vector<Param> trained{{"w", {1.0f}, {0.5f}}};
  Adam original(Adam::Options{.lr = 0.1});
  for (int i = 0; i < 3; ++i) original.step(refs(trained));

  std::vector<Param> resumed = trained;
  Adam restored(Adam::Options{.lr = 0.1});
  restored.allocate_state(refs(resumed));
  const auto saved = state_of(original);
  restored.for_each_state([&](const std::string& name, std::span<float> values) {
    const std::vector<float>& source = saved.at(name);
    std::copy(source.begin(), source.end(), values.begin());
  });
  restored.for_each_step([&](const std::string&, std::int64_t& step) { step = 3; });

  original.step(refs(trained));
  restored.step(refs(resumed));
  CHECK(resumed[0].value == trained[0].value);
}

TEST_CASE("Adam rejects invalid options", "[optim][adam][errors]") {
  CHECK_THROWS_WITH(Adam(Adam::Options{.beta1 = 1.0}), Contains("beta1"));
  CHECK_THROWS_WITH(AdamW(AdamW::Options{.beta2 = -0.1}), Contains("AdamW") && Contains("beta2"));
  CHECK_THROWS_AS(Adam(Adam::Options{.eps = -1e-8}), InvalidArgument);
  CHECK_THROWS_AS(Adam(Adam::Options{.lr = -1e-3}), InvalidArgument);
  CHECK_THROWS_AS(AdamW(AdamW::Options{.weight_decay = -0.01}), InvalidArgument);
  CHECK_NOTHROW(Adam(Adam::Options{.beta1 = 0.0}));
}

// The Fp64 policy's optimizers: every operation in double, so they follow update rules written in
// double to a few ulps, where the float instances follow them to about 1e-6 (hyperparameters
// rounded to float alone would move these values by 1e-9).
TEST_CASE("BasicSgd<double> and BasicAdam<double> compute in double", "[optim][float64]") {
  using coltrain::optim::BasicAdam;
  using coltrain::optim::BasicSgd;
  using coltrain::optim::MasterParamRef;
  const std::vector<double> grads{0.3, -0.1, 0.7, 0.05, -0.4};
  double value = 0.5, grad = 0.0;
  const MasterParamRef<double> ref{"w", std::span<double>(&value, 1),
                                   std::span<const double>(&grad, 1)};
  const std::span<const MasterParamRef<double>> params(&ref, 1);

  SECTION("SGD with Nesterov momentum and weight decay") {
    BasicSgd<double> sgd(BasicSgd<double>::Options{
        .lr = 0.01, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true});
    double expected = 0.5, buf = 0.0;
    for (std::size_t k = 0; k < grads.size(); ++k) {
      grad = grads[k];
      sgd.step(params);
      const double d = grads[k] + 0.1 * expected;
      buf = k == 0 ? d : 0.9 * buf + d;
      expected -= 0.01 * (d + 0.9 * buf);
      CHECK(value == Approx(expected).epsilon(1e-15));
    }
  }
  SECTION("Adam") {
    BasicAdam<double> adam(
        BasicAdam<double>::Options{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6});
    AdamReference reference{0.5};
    for (const double g : grads) {
      grad = g;
      adam.step(params);
      reference.update(g, 0.01, 0.8, 0.99, 1e-6);
      CHECK(value == Approx(reference.value).epsilon(1e-14));
    }
  }
}
