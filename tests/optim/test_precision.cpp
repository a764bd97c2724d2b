// Precision policies and PrecisionOptimizer: fp32 steps the model directly; fp16 unscales into fp32
// master gradients, steps the masters and rounds them into the model, and skips overflowed steps
// leaving everything untouched; bf16 keeps masters without loss scaling.

#include <coltrain/core/dtype.hpp>
#include <coltrain/optim/adam.hpp>
#include <coltrain/optim/gradient_clipping.hpp>
#include <coltrain/optim/precision.hpp>
#include <coltrain/optim/sgd.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using Catch::Matchers::Contains;
using coltrain::bfloat16;
using coltrain::half;
using coltrain::InvalidArgument;
using coltrain::optim::Adam;
using coltrain::optim::Fp32;
using coltrain::optim::MixedBf16;
using coltrain::optim::MixedFp16;
using coltrain::optim::PrecisionOptimizer;
using coltrain::optim::PrecisionPolicy;
using coltrain::optim::Sgd;
using coltrain::optim::TypedParamRef;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct HalfWithoutMasters {
  using Storage = half;
  static constexpr bool kMasterWeights = false;
  static constexpr bool kLossScaling = true;
  static constexpr std::string_view kName = "broken";
};

struct DoubleStorage {
  using Storage = double;
  static constexpr bool kMasterWeights = true;
  static constexpr bool kLossScaling = false;
  static constexpr std::string_view kName = "fp64";
};

// fp32 storage with loss scaling: gradients are unscaled in place, as GradScaler.unscale_.
struct Fp32Scaled {
  using Storage = float;
  static constexpr bool kMasterWeights = false;
  static constexpr bool kLossScaling = true;
  static constexpr std::string_view kName = "fp32-scaled";
};

static_assert(PrecisionPolicy<Fp32> && PrecisionPolicy<MixedFp16> && PrecisionPolicy<MixedBf16>);
static_assert(PrecisionPolicy<Fp32Scaled>);
static_assert(!PrecisionPolicy<HalfWithoutMasters>, "16-bit storage needs fp32 master weights");
static_assert(!PrecisionPolicy<DoubleStorage>);
static_assert(!PrecisionPolicy<int>);
static_assert(std::is_same_v<MixedFp16::Storage, half> && MixedFp16::kLossScaling);
static_assert(std::is_same_v<MixedBf16::Storage, bfloat16> && !MixedBf16::kLossScaling);
static_assert(MixedFp16::kName == "fp16" && MixedBf16::kName == "bf16" && Fp32::kName == "fp32");

// A model parameter in storage type T.
template <class T>
struct Param {
  std::string name;
  std::vector<T> value;
  std::vector<T> grad;

  Param(std::string n, std::vector<float> values)
      : name(std::move(n)), value(values.size()), grad(values.size(), T(0.0f)) {
    for (std::size_t i = 0; i < values.size(); ++i) value[i] = T(values[i]);
  }
  TypedParamRef<T> ref() { return {name, value, grad}; }
  void set_grads(std::vector<float> grads) {
    for (std::size_t i = 0; i < grads.size(); ++i) grad[i] = T(grads[i]);
  }
  std::vector<float> values() const {
    std::vector<float> result;
    for (T v : value) result.push_back(static_cast<float>(v));
    return result;
  }
};

template <class T>
std::vector<TypedParamRef<T>> refs(std::vector<Param<T>>& params) {
  std::vector<TypedParamRef<T>> result;
  for (Param<T>& p : params) result.push_back(p.ref());
  return result;
}

std::vector<float> span_values(std::span<const float> values) {
  return std::vector<float>(values.begin(), values.end());
}

}  // namespace

TEST_CASE("Fp32 steps the model's values directly", "[optim][precision]") {
  std::vector<Param<float>> params{{"w", {1.0f, 2.0f}}};
  PrecisionOptimizer<Fp32, Sgd> trainer(refs(params), Sgd(Sgd::Options{.lr = 0.1}));
  CHECK(trainer.loss_scale() == 1.0f);
  params[0].set_grads({1.0f, -1.0f});
  CHECK(trainer.step(0.5));
  CHECK(params[0].value == std::vector<float>{0.5f, 2.5f});
  CHECK(params[0].grad == std::vector<float>{1.0f, -1.0f});  // not unscaled, not zeroed

  SECTION("non-finite gradients skip the step") {
    params[0].set_grads({kInf, 1.0f});
    CHECK_FALSE(trainer.step(0.5));
    CHECK(params[0].value == std::vector<float>{0.5f, 2.5f});
  }
}

TEST_CASE("fp32 storage with loss scaling unscales the gradients in place", "[optim][precision]") {
  std::vector<Param<float>> params{{"w", {1.0f}}};
  PrecisionOptimizer<Fp32Scaled, Sgd> trainer(refs(params), Sgd(),
                                              {.init_scale = 4.0f, .growth_interval = 1});
  params[0].set_grads({8.0f});
  CHECK(trainer.step(0.25));
  CHECK(params[0].grad[0] == 2.0f);
  CHECK(params[0].value[0] == 0.5f);
  CHECK(trainer.loss_scale() == 8.0f);  // grew after one clean step
}

TEST_CASE("MixedFp16 updates fp32 masters and rounds them into the fp16 model",
          "[optim][precision]") {
  std::vector<Param<half>> params{{"fc.weight", {1.0f, 0.5f}}, {"fc.bias", {-2.0f}}};
  PrecisionOptimizer<MixedFp16, Sgd> trainer(refs(params), Sgd());
  REQUIRE(trainer.loss_scale() == 65536.0f);
  REQUIRE(trainer.size() == 2);

  // The backward pass of a scaled loss: true gradients times 65536. 1.0 in fp16 is a true gradient
  // of 2^-16, which fp16 could not hold unscaled without losing precision.
  params[0].set_grads({1.0f, -2.0f});
  params[1].set_grads({4.0f});
  CHECK(trainer.step(1000.0));

  // master = value - 1000 * g / 65536, exact in float; the model holds it rounded to fp16.
  const float expected0 = 1.0f - 1000.0f / 65536.0f;  // 0.9847412109375
  CHECK(trainer.master_weights(0)[0] == expected0);
  CHECK(trainer.master_weights(0)[1] == 0.5f + 2000.0f / 65536.0f);
  CHECK(trainer.master_weights(1)[0] == -2.0f - 4000.0f / 65536.0f);
  CHECK(params[0].values()[0] == static_cast<float>(half(expected0)));
  CHECK(params[0].values()[0] == 0.98486328125f);  // the nearest fp16
  CHECK(params[1].values()[0] == static_cast<float>(half(-2.0f - 4000.0f / 65536.0f)));
  // The model's gradients are the model's business: left as they were.
  CHECK(static_cast<float>(params[0].grad[1]) == -2.0f);
}

TEST_CASE("Master weights accumulate updates too small for fp16", "[optim][precision]") {
  // The spacing of fp16 just below 1 is 2^-11: an update of 1e-4 rounds away in fp16 arithmetic.
  std::vector<Param<half>> params{{"w", {1.0f}}};
  PrecisionOptimizer<MixedFp16, Sgd> trainer(refs(params), Sgd());
  for (int i = 0; i < 10; ++i) {
    params[0].set_grads({1.0f});    // a true gradient of 2^-16 at the scale 2^16
    REQUIRE(trainer.step(6.5536));  // an update of 6.5536 * 2^-16 = 1e-4
  }
  CHECK(trainer.master_weights(0)[0] == Approx(0.999f).epsilon(1e-6));
  CHECK(params[0].values()[0] == static_cast<float>(half(trainer.master_weights(0)[0])));
  CHECK(params[0].values()[0] < 1.0f);
}

TEST_CASE("An overflowed fp16 step is skipped and leaves everything untouched",
          "[optim][precision]") {
  std::vector<Param<half>> params{{"w", {1.0f, 2.0f}}};
  PrecisionOptimizer<MixedFp16, Adam> trainer(refs(params), Adam(Adam::Options{.lr = 0.1}));
  params[0].set_grads({1.0f, 1.0f});
  REQUIRE(trainer.step(0.1));
  const std::vector<float> values = params[0].values();
  const std::vector<float> masters = span_values(trainer.master_weights(0));
  auto moments_of = [&] {
    std::vector<float> moments;
    trainer.optimizer().for_each_state([&](const std::string&, std::span<const float> s) {
      moments.insert(moments.end(), s.begin(), s.end());
    });
    return moments;
  };
  const std::vector<float> moments = moments_of();

  params[0].set_grads({1.0f, 70000.0f});  // the second rounds to Inf in fp16
  CHECK_FALSE(trainer.unscale_and_check());
  CHECK_FALSE(trainer.apply(false, 0.1));
  CHECK(params[0].values() == values);
  CHECK(span_values(trainer.master_weights(0)) == masters);
  CHECK(moments_of() == moments);
  CHECK(trainer.optimizer().step_count(0) == 1);
  CHECK(trainer.loss_scale() == 32768.0f);
  CHECK(trainer.scaler().growth_tracker() == 0);

  SECTION("the next finite step is taken at the halved scale") {
    params[0].set_grads({1.0f, 1.0f});
    CHECK(trainer.step(0.1));
    CHECK(trainer.optimizer().step_count(0) == 2);
    CHECK(trainer.scaler().growth_tracker() == 1);
  }
}

TEST_CASE("Ranks that agree on overflow all skip, even with finite local gradients",
          "[optim][precision]") {
  std::vector<Param<half>> params{{"w", {1.0f}}};
  PrecisionOptimizer<MixedFp16, Sgd> trainer(refs(params), Sgd());
  params[0].set_grads({1.0f});
  const bool local = trainer.unscale_and_check();
  CHECK(local);
  const bool all_finite = false;  // another rank overflowed
  CHECK_FALSE(trainer.apply(all_finite, 0.1));
  CHECK(params[0].values()[0] == 1.0f);
  CHECK(trainer.master_weights(0)[0] == 1.0f);
  CHECK(trainer.loss_scale() == 32768.0f);
}

TEST_CASE("MixedBf16 keeps masters and does not scale", "[optim][precision]") {
  std::vector<Param<bfloat16>> params{{"w", {1.0f, -1.0f}}};
  PrecisionOptimizer<MixedBf16, Sgd> trainer(refs(params), Sgd());
  CHECK(trainer.loss_scale() == 1.0f);
  params[0].set_grads({0.5f, 0.25f});  // unscaled gradients
  CHECK(trainer.step(0.01));
  CHECK(trainer.master_weights(0)[0] == 1.0f - 0.01f * 0.5f);
  CHECK(trainer.master_weights(0)[1] == -1.0f - 0.01f * 0.25f);
  CHECK(params[0].values()[0] == static_cast<float>(bfloat16(1.0f - 0.01f * 0.5f)));
  CHECK(trainer.loss_scale() == 1.0f);

  SECTION("an Inf gradient skips the step") {
    params[0].set_grads({kInf, 0.0f});
    CHECK_FALSE(trainer.step(0.01));
    CHECK(trainer.master_weights(0)[0] == 1.0f - 0.01f * 0.5f);
  }
}

TEST_CASE("Masters written from a checkpoint are rounded into the model", "[optim][precision]") {
  std::vector<Param<half>> params{{"w", {1.0f, 2.0f}}};
  PrecisionOptimizer<MixedFp16, Sgd> trainer(refs(params), Sgd());
  trainer.master_weights(0)[0] = 0.1f;
  trainer.master_weights(0)[1] = 3.0f;
  trainer.round_masters_into_model();
  CHECK(params[0].values() == std::vector<float>{static_cast<float>(half(0.1f)), 3.0f});
  CHECK_THROWS(trainer.master_weights(1));
}

TEST_CASE("PrecisionOptimizer can be moved", "[optim][precision]") {
  std::vector<Param<half>> params{{"a_long_parameter_name.weight", {1.0f}}};
  PrecisionOptimizer<MixedFp16, Sgd> first(refs(params), Sgd(Sgd::Options{.momentum = 0.9}));
  PrecisionOptimizer<MixedFp16, Sgd> trainer = std::move(first);
  params[0].set_grads({32768.0f});  // a true gradient of 0.5 at the scale 2^16
  CHECK(trainer.step(0.1));
  CHECK(trainer.master_weights(0)[0] == Approx(0.95f));
  int buffers = 0;
  trainer.optimizer().for_each_state([&](const std::string& name, std::span<const float>) {
    CHECK(name == "a_long_parameter_name.weight.momentum_buffer");
    ++buffers;
  });
  CHECK(buffers == 1);
}

TEST_CASE("PrecisionOptimizer errors", "[optim][precision][errors]") {
  std::vector<half> value(2, half(0.0f));
  std::vector<half> grad(3, half(0.0f));
  const std::vector<TypedParamRef<half>> bad{{"layer.weight", value, grad}};
  CHECK_THROWS_WITH((PrecisionOptimizer<MixedFp16, Sgd>(bad, Sgd())), Contains("layer.weight"));

  std::vector<Param<half>> params{{"w", {1.0f}}};
  PrecisionOptimizer<MixedFp16, Sgd> trainer(refs(params), Sgd());
  CHECK_THROWS_WITH(trainer.apply(true, 0.1), Contains("unscale_and_check() first"));
  trainer.unscale_and_check();
  CHECK_THROWS_WITH(trainer.unscale_and_check(), Contains("twice"));
  CHECK_THROWS_AS(trainer.apply(true, -0.1), InvalidArgument);
  CHECK(trainer.loss_scale() == 65536.0f);  // the failed apply changed nothing
  CHECK(trainer.apply(true, 0.1));
}

// Clipping's two halves (train::Trainer's clip_grad_norm): the norm of the unscaled fp32
// gradients, then every one scaled; PyTorch's coefficient, clamped at 1.
TEST_CASE("gradient norm and scaling between unscale_and_check and apply", "[optim][precision]") {
  SECTION("fp16: the masters' gradients, after the loss scale is divided out") {
    std::vector<Param<half>> params{{"w", {1.0f, 1.0f}}, {"b", {1.0f}}};
    PrecisionOptimizer<MixedFp16, Sgd> trainer(refs(params), Sgd(), {.init_scale = 8.0f});
    params[0].set_grads({24.0f, 32.0f});  // 8 x (3, 4)
    params[1].set_grads({0.0f});
    CHECK_THROWS_WITH(trainer.gradient_sum_of_squares(), Contains("unscale_and_check() first"));
    REQUIRE(trainer.unscale_and_check());
    CHECK(trainer.gradient_sum_of_squares() == 25.0);
    trainer.scale_gradients(0.5f);
    CHECK(trainer.gradient_sum_of_squares() == Approx(6.25));
    CHECK(trainer.apply(true, 1.0));
    CHECK(static_cast<float>(params[0].value[0]) == Approx(1.0f - 1.5f));
    CHECK(static_cast<float>(params[0].value[1]) == Approx(1.0f - 2.0f));
  }
  SECTION("fp32: the gradients in place") {
    std::vector<Param<float>> params{{"w", {0.0f, 0.0f}}};
    PrecisionOptimizer<Fp32, Sgd> trainer(refs(params), Sgd());
    params[0].set_grads({6.0f, 8.0f});
    CHECK_THROWS_WITH(trainer.scale_gradients(0.5f), Contains("unscale_and_check() first"));
    REQUIRE(trainer.unscale_and_check());
    CHECK(trainer.gradient_sum_of_squares() == 100.0);
    trainer.scale_gradients(0.1f);
    CHECK(trainer.apply(true, 1.0));
    CHECK(params[0].value[0] == Approx(-0.6f));
    CHECK(params[0].value[1] == Approx(-0.8f));
  }
  SECTION("the coefficient") {
    using coltrain::optim::clip_coefficient;
    CHECK(clip_coefficient(10.0, 5.0) == Approx(5.0 / (10.0 + 1e-6)));
    CHECK(clip_coefficient(1.0, 5.0) == 1.0);
    CHECK(clip_coefficient(0.0, 5.0) == 1.0);
    CHECK(clip_coefficient(kInf, 5.0) == 0.0);
    CHECK_THROWS_WITH(clip_coefficient(1.0, 0.0), Contains("max_norm must be > 0"));
    CHECK_THROWS_AS(clip_coefficient(1.0, std::nan("")), InvalidArgument);
  }
}
