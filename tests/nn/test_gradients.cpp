// Finite-difference gradient checks of every layer, in double.
//
// Each check builds a Network<Sequential<Input<...>, ...>, double>, evaluates an objective of its
// output (sum_i r_i * out_i with fixed random r, or the softmax cross-entropy), and compares
// Network::backward's gradients with central differences:
//   - parameter gradients: every parameter the network visits, perturbed through visit_parameters;
//   - input gradients: a GradProbe (an identity layer that records the gradient reaching it) is
//     placed first, because a network's first layer receives no input gradient; the checked layer
//     is then the second one and its grad_in is what the probe records. Checks without the probe
//     run the layer as the first one, the grad_in-is-empty path.
//
// The numerical derivative of one element is Richardson's extrapolation of two central differences,
// c(h) = (f(x+h) - f(x-h)) / 2h at h and h/2: (4 c(h/2) - c(h)) / 3, whose truncation error is O(h^4);
// h = 1e-4. Objectives with ReLU or max-pool kinks near the point use h = 1e-5, and there an element
// whose c(h) and c(h/2) disagree has a kink within h and is skipped (counted; at most 2% of the
// checked elements may be). A wrong analytic gradient cannot hide that way: both differences agree
// with each other and disagree with it. Elsewhere (all other checks) no element is skipped; ReLU and
// max pooling are checked alone on inputs kept away from the kink (|x| >= 0.1) and from ties
// (distinct values 1e-3 apart).
//
// Tolerance: every checked element must satisfy |numeric - analytic| <= 1e-6 * max(|analytic|,
// 1e-3 * max|analytic over the tensor|), i.e. 1e-6 relative, with small elements held to an absolute
// 1e-9 of the tensor's largest gradient. Set NN_GRADCHECK_REPORT=1 to print the worst error of
// every tensor.

#include <catch2/catch.hpp>

#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/dropout.hpp>
#include <coltrain/nn/flatten.hpp>
#include <coltrain/nn/linear.hpp>
#include <coltrain/nn/loss.hpp>
#include <coltrain/nn/network.hpp>
#include <coltrain/nn/pooling.hpp>
#include <coltrain/nn/residual.hpp>
#include <coltrain/nn/sequential.hpp>
#include <coltrain/models/resnet.hpp>

#include "nn_test_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace nn = coltrain::nn;
namespace tensor = coltrain::tensor;
using nn::Input;
using nn::Sequential;
using nn_test::GradProbe;

// Perturbations: h for smooth objectives, and a smaller one where ReLU or max-pool kinks lie near
// the point (a kink within h spoils an element's difference).
constexpr double kStep = 1e-4;
constexpr double kKinkStep = 1e-5;
constexpr double kTolerance = 1e-6;
constexpr double kFloorFraction = 1e-3;

// A scalar objective of the network's output.
struct Objective {
  // f(out) and d f / d out.
  std::function<double(tensor::TensorView<const double> out, tensor::Tensor<double>& grad)> value_and_grad;
  // f(a) - f(b) for two outputs, computed without cancelling two large sums.
  std::function<double(const std::vector<double>& a, const std::vector<double>& b)> difference;
};

// sum_i r_i * out_i with r uniform in [-1, 1), drawn once per output shape. Differences are summed
// as sum_i r_i (a_i - b_i), so a large output does not drown the perturbation's effect in rounding.
Objective linear_objective(std::uint64_t seed) {
  auto r = std::make_shared<tensor::Tensor<double>>();
  Objective objective;
  objective.value_and_grad = [r, seed](tensor::TensorView<const double> out, tensor::Tensor<double>& grad) {
    if (!(r->shape() == out.shape())) {
      *r = tensor::Tensor<double>(out.shape());
      nn_test::fill_uniform(r->span(), seed, -1.0, 1.0);
    }
    double sum = 0.0;
    for (std::int64_t i = 0; i < out.numel(); ++i) sum += r->data()[i] * out.data()[i];
    grad = tensor::Tensor<double>(out.shape());
    std::copy_n(r->data(), r->numel(), grad.data());
    return sum;
  };
  objective.difference = [r](const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(static_cast<std::int64_t>(a.size()) == r->numel());
    double sum = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) sum += r->data()[i] * (a[i] - b[i]);
    return sum;
  };
  return objective;
}

// The label-smoothed cross-entropy written out from its definition, in long double: the finite
// differences of the loss are taken of this, so that rounding in the difference of two losses stays
// far below the tolerance, and the library's value is compared with it.
long double reference_cross_entropy(const double* logits, std::int64_t batch, std::int64_t classes,
                                    const std::vector<std::int32_t>& labels, double smoothing) {
  long double total = 0;
  for (std::int64_t r = 0; r < batch; ++r) {
    const double* row = logits + r * classes;
    long double max = row[0];
    for (std::int64_t j = 1; j < classes; ++j) max = std::max<long double>(max, row[j]);
    long double sum = 0;
    for (std::int64_t j = 0; j < classes; ++j) sum += std::exp(static_cast<long double>(row[j]) - max);
    const long double log_sum = std::log(sum) + max;
    for (std::int64_t j = 0; j < classes; ++j) {
      const long double target = (j == labels[static_cast<std::size_t>(r)] ? 1.0L - smoothing : 0.0L) +
                                 static_cast<long double>(smoothing) / static_cast<long double>(classes);
      total += target * (log_sum - row[j]);
    }
  }
  return total / static_cast<long double>(batch);
}

Objective cross_entropy_objective(std::vector<std::int32_t> labels, double smoothing) {
  Objective objective;
  objective.value_and_grad = [labels, smoothing](tensor::TensorView<const double> out,
                                                 tensor::Tensor<double>& grad) {
    grad = tensor::Tensor<double>(out.shape());
    return nn::SoftmaxCrossEntropy(smoothing).loss_and_grad<double>(out, labels, grad.view());
  };
  objective.difference = [labels, smoothing](const std::vector<double>& a, const std::vector<double>& b) {
    const std::int64_t batch = static_cast<std::int64_t>(labels.size());
    const std::int64_t classes = static_cast<std::int64_t>(a.size()) / batch;
    return static_cast<double>(reference_cross_entropy(a.data(), batch, classes, labels, smoothing) -
                               reference_cross_entropy(b.data(), batch, classes, labels, smoothing));
  };
  return objective;
}

struct Options {
  int batch = 3;
  int threads = 1;
  std::uint64_t seed = 1;
  bool eval = false;
  // Dropout: hold the mask fixed by resetting the context's step before every forward.
  bool fixed_mask = false;
  // How the input is drawn.
  enum class Fill { kUniform, kAwayFromZero, kDistinct } fill = Fill::kUniform;
  // Elements checked per tensor; larger tensors are sampled (always with the first and last).
  std::size_t max_elements = 160;
  // Draw rank-1 parameters (biases, BatchNorm gamma and beta) and BatchNorm running statistics at
  // random instead of their initial values, so that gamma = 1, beta = 0 cannot mask an error.
  bool randomize_state = true;
  // The objective has kinks near the point (ReLU or max pooling after perturbed values): use the
  // smaller step and skip the elements whose two differences disagree. Otherwise every element
  // counts.
  bool kinks = false;
};

struct TensorReport {
  std::string name;
  double worst = 0.0;        // worst relative error over the checked elements
  double largest = 0.0;      // max |analytic| over the tensor
  std::size_t checked = 0;
  std::size_t kinks = 0;
};

std::vector<std::size_t> sample_indices(std::size_t n, std::size_t max, std::uint64_t seed) {
  std::vector<std::size_t> all(n);
  for (std::size_t i = 0; i < n; ++i) all[i] = i;
  if (n <= max) return all;
  nn::Rng rng(seed);
  // A partial Fisher-Yates shuffle picks max - 2 distinct interior elements.
  for (std::size_t i = 1; i + 1 < n && i < max - 1; ++i) {
    const std::size_t j = i + static_cast<std::size_t>(rng.next() % (n - 1 - i));
    std::swap(all[i], all[j]);
  }
  std::vector<std::size_t> picked(all.begin() + 1, all.begin() + static_cast<std::ptrdiff_t>(max - 1));
  picked.push_back(0);
  picked.push_back(n - 1);
  return picked;
}

using Evaluate = std::function<std::vector<double>()>;
using Difference = std::function<double(const std::vector<double>&, const std::vector<double>&)>;

// Compares `analytic` (the gradient with respect to `values`) with finite differences of the
// objective, perturbing `values` in place (and restoring them). `evaluate` returns what the
// objective is a function of; `difference` is the objective's difference between two of those.
TensorReport check_tensor(const std::string& name, std::span<double> values,
                          const std::vector<double>& analytic, const Evaluate& evaluate,
                          const Difference& difference, const Options& options) {
  TensorReport report;
  report.name = name;
  REQUIRE(values.size() == analytic.size());
  for (double a : analytic) report.largest = std::max(report.largest, std::abs(a));
  const double floor = std::max(kFloorFraction * report.largest, 1e-12);
  for (std::size_t i : sample_indices(values.size(), options.max_elements, options.seed + 17)) {
    const double saved = values[i];
    auto at = [&](double delta) {
      values[i] = saved + delta;
      std::vector<double> f = evaluate();
      values[i] = saved;
      return f;
    };
    const double h = options.kinks ? kKinkStep : kStep;
    const double c1 = difference(at(h), at(-h)) / (2 * h);
    const double c2 = difference(at(h / 2), at(-h / 2)) / h;
    const double scale = std::max(std::abs(analytic[i]), floor);
    ++report.checked;
    if (options.kinks && std::abs(c1 - c2) > 0.5 * kTolerance * scale) {
      ++report.kinks;
      continue;
    }
    const double numeric = (4 * c2 - c1) / 3;
    const double error = std::abs(numeric - analytic[i]) / scale;
    if (error > report.worst) report.worst = error;
    if (error > kTolerance) {
      UNSCOPED_INFO(name << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric
                         << ", relative error " << error);
    }
  }
  return report;
}

void require_reports(const std::string& what, const std::vector<TensorReport>& reports) {
  const bool verbose = std::getenv("NN_GRADCHECK_REPORT") != nullptr;
  for (const TensorReport& r : reports) {
    if (verbose)
      std::printf("[gradcheck] %-40s %-28s worst %.3e over %zu elements (%zu kinks skipped), max|g| %.3e\n",
                  what.c_str(), r.name.c_str(), r.worst, r.checked, r.kinks, r.largest);
    INFO(what << ": " << r.name << " worst relative error " << r.worst << " over " << r.checked
              << " elements, " << r.kinks << " skipped at kinks, max |gradient| " << r.largest);
    CHECK(r.checked > 0);
    CHECK(r.largest > 0.0);  // a vanishing gradient would make the check vacuous
    CHECK(r.worst <= kTolerance);
    CHECK(r.kinks <= r.checked / 50);
  }
}

// Builds Network<Model, double>, fills its input and state, and checks its parameter gradients, and
// its input gradient when the model starts with a GradProbe.
template <class Model>
std::vector<TensorReport> check_network(const Options& options, Objective objective) {
  nn::Network<Model, double> net({.threads = options.threads, .seed = options.seed});
  if (options.eval) net.eval();
  if (options.randomize_state) {
    std::uint64_t salt = 100;
    net.visit_parameters([&](const std::string&, nn::Parameter<double, tensor::Cpu>& p) {
      if (p.value.shape().rank() != 1) return;
      nn::Rng rng(options.seed * 7919 + ++salt);
      for (double& v : p.value.span()) {
        const double magnitude = rng.uniform(0.3, 1.3);
        v = (rng.next() & 1) ? magnitude : -magnitude;
      }
    });
    net.visit_buffers([&](const std::string& name, auto& t) {
      using U = typename std::remove_cvref_t<decltype(t)>::value_type;
      if constexpr (std::is_floating_point_v<U>) {
        if (name.ends_with("running_mean")) nn_test::fill_uniform(t.span(), ++salt, -0.5, 0.5);
        if (name.ends_with("running_var")) nn_test::fill_uniform(t.span(), ++salt, 0.5, 2.0);
      }
    });
  }
  using Net = nn::Network<Model, double>;
  tensor::Tensor<double> input(Net::Input::batch(options.batch));
  switch (options.fill) {
    case Options::Fill::kUniform:
      nn_test::fill_uniform(input.span(), options.seed + 1, -1.0, 1.0);
      break;
    case Options::Fill::kAwayFromZero:
      nn_test::fill_away_from_zero(input.span(), options.seed + 1, 0.1, 1.0);
      break;
    case Options::Fill::kDistinct:
      nn_test::fill_distinct(input.span(), options.seed + 1, 1e-3);
      break;
  }

  const std::uint64_t step = net.context().step();
  auto evaluate = [&] {
    if (options.fixed_mask) net.context().set_step(step);
    const auto out = net.forward(input.view());
    return std::vector<double>(out.span().begin(), out.span().end());
  };

  net.zero_grad();
  if (options.fixed_mask) net.context().set_step(step);
  tensor::Tensor<double> grad_out;
  objective.value_and_grad(net.forward(input.view()), grad_out);
  net.backward(grad_out.view());

  std::vector<std::pair<std::string, nn::Parameter<double, tensor::Cpu>*>> parameters;
  net.visit_parameters([&](const std::string& name, nn::Parameter<double, tensor::Cpu>& p) {
    parameters.emplace_back(name, &p);
  });
  std::vector<std::vector<double>> analytic;
  for (auto& [name, p] : parameters) analytic.emplace_back(p->grad.span().begin(), p->grad.span().end());
  std::optional<std::vector<double>> input_grad;
  if constexpr (std::is_same_v<std::remove_cvref_t<decltype(net.body().template layer<0>())>,
                               nn_test::GradProbeLayer<typename Net::Input, double, tensor::Cpu>>) {
    const auto& captured = net.body().template layer<0>().captured;
    input_grad.emplace(captured.span().begin(), captured.span().end());
  }

  std::vector<TensorReport> reports;
  for (std::size_t k = 0; k < parameters.size(); ++k)
    reports.push_back(check_tensor(parameters[k].first, parameters[k].second->value.span(), analytic[k],
                                   evaluate, objective.difference, options));
  if (input_grad)
    reports.push_back(
        check_tensor("input", input.span(), *input_grad, evaluate, objective.difference, options));
  return reports;
}

template <class Model>
void check(const std::string& what, const Options& options = {},
           std::optional<Objective> objective = std::nullopt) {
  require_reports(what, check_network<Model>(options, objective ? *objective : linear_objective(options.seed + 5)));
}

std::vector<std::int32_t> labels_for(int batch, int classes, std::uint64_t seed) {
  nn::Rng rng(seed);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (auto& l : labels) l = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(classes));
  return labels;
}

// A layer with a deliberately wrong backward: y = 2x, but grad_in = (2 + 1e-5) grad_out and a
// parameter-free layer. The checker must reject it, or its passes mean nothing.
template <class In, class T, class Device>
class WrongGradientLayer {
 public:
  using Input = In;
  using Output = In;
  static constexpr std::size_t kParameterCount = 0;
  void initialize(nn::Rng&) {}
  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out, nn::Context<Device>&) {
    for (std::int64_t i = 0; i < in.numel(); ++i) out.data()[i] = 2 * in.data()[i];
  }
  void backward(tensor::TensorView<const T, Device>, tensor::TensorView<const T, Device>,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                nn::Context<Device>&) {
    if (grad_in.empty()) return;
    for (std::int64_t i = 0; i < grad_out.numel(); ++i) grad_in.data()[i] = (2 + 1e-5) * grad_out.data()[i];
  }
  template <class F>
  void visit_parameters(F&&, const std::string&) {}
  template <class F>
  void visit_buffers(F&&, const std::string&) {}
};

struct WrongGradient {
  template <class In, class T, class Device>
  using Bind = WrongGradientLayer<In, T, Device>;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The checker itself

TEST_CASE("gradients: the checker rejects a gradient that is off by 5e-6 relative", "[nn][gradients]") {
  const auto reports = check_network<Sequential<Input<6>, GradProbe, WrongGradient, nn::Linear<3>>>(
      Options{}, linear_objective(3));
  REQUIRE(reports.back().name == "input");
  CHECK(reports.back().worst > kTolerance);
  CHECK(reports.back().worst < 1e-5);
  CHECK(reports.back().kinks == 0);
}

// ---------------------------------------------------------------------------------------------
// Linear

TEST_CASE("gradients: Linear with bias, input and parameters", "[nn][gradients][linear]") {
  check<Sequential<Input<7>, GradProbe, nn::Linear<5>>>("Linear<5> after a probe", {.batch = 3});
}

TEST_CASE("gradients: Linear without bias, input and parameters", "[nn][gradients][linear]") {
  check<Sequential<Input<7>, GradProbe, nn::Linear<5, false>>>("Linear<5, false> after a probe",
                                                                {.batch = 4});
}

TEST_CASE("gradients: Linear as the first layer, parameters", "[nn][gradients][linear]") {
  check<Sequential<Input<6>, nn::Linear<4>, nn::Linear<3, false>>>("Linear, Linear<false>", {.batch = 5});
}

TEST_CASE("gradients: Linear on 2 threads with the parallel GEMM paths", "[nn][gradients][linear]") {
  // 2 * 37 * 64 * 64 multiply-adds exceed parallel_cpu_product's threshold, so every product
  // (forward, weight gradient, input gradient) is split across the 2 threads, by rows and by
  // columns.
  check<Sequential<Input<64>, GradProbe, nn::Linear<64>>>("Linear<64>, 2 threads, batch 37",
                                                           {.batch = 37, .threads = 2});
}

// ---------------------------------------------------------------------------------------------
// Conv2d: kernel 1 and 3, stride 1 and 2, padding 0 and 1, with and without bias, several input
// channels; batches larger than the thread count and not divisible by the images packed per GEMM.

TEST_CASE("gradients: Conv2d 3x3, stride 1, padding 1, bias", "[nn][gradients][conv2d]") {
  check<Sequential<Input<3, 6, 6>, GradProbe, nn::Conv2d<4, 3, 1, 1>>>("Conv2d<4,3,1,1> on 3x6x6",
                                                                       {.batch = 3});
}

TEST_CASE("gradients: Conv2d 3x3, stride 2, padding 1, no bias, 2 threads", "[nn][gradients][conv2d]") {
  check<Sequential<Input<2, 7, 7>, GradProbe, nn::Conv2d<4, 3, 2, 1, false>>>(
      "Conv2d<4,3,2,1,nobias> on 2x7x7", {.batch = 5, .threads = 2});
}

TEST_CASE("gradients: Conv2d 3x3, stride 1, padding 0, 2 threads", "[nn][gradients][conv2d]") {
  // 3x3 outputs: 29 images per GEMM, so each thread packs its 2 or 3 images into one product.
  check<Sequential<Input<2, 5, 5>, GradProbe, nn::Conv2d<3, 3, 1, 0>>>("Conv2d<3,3,1,0> on 2x5x5",
                                                                       {.batch = 5, .threads = 2});
}

TEST_CASE("gradients: Conv2d 3x3 with a 1x1 output", "[nn][gradients][conv2d]") {
  check<Sequential<Input<2, 3, 3>, GradProbe, nn::Conv2d<3, 3, 1, 0>>>("Conv2d<3,3,1,0> on 2x3x3",
                                                                       {.batch = 7, .threads = 2});
  // Fewer images than threads: one thread idles, and its partial gradients must not be summed.
  check<Sequential<Input<2, 3, 3>, GradProbe, nn::Conv2d<3, 3, 1, 0>>>(
      "Conv2d<3,3,1,0> on 2x3x3, batch 1, 2 threads", {.batch = 1, .threads = 2});
}

TEST_CASE("gradients: Conv2d 1x1, stride 2, bias", "[nn][gradients][conv2d]") {
  check<Sequential<Input<3, 5, 5>, GradProbe, nn::Conv2d<3, 1, 2, 0>>>("Conv2d<3,1,2,0> on 3x5x5",
                                                                       {.batch = 3});
}

TEST_CASE("gradients: Conv2d 1x1, stride 1, no bias", "[nn][gradients][conv2d]") {
  check<Sequential<Input<4, 3, 4>, GradProbe, nn::Conv2d<2, 1, 1, 0, false>>>(
      "Conv2d<2,1,1,0,nobias> on 4x3x4", {.batch = 2});
}

TEST_CASE("gradients: Conv2d packs several images per GEMM, 2 threads", "[nn][gradients][conv2d]") {
  // 4x4 outputs: 16 images per GEMM. Batch 37 on 2 threads gives the threads 18 and 19 images, so
  // groups of 16 + 2 and 16 + 3.
  check<Sequential<Input<2, 4, 4>, GradProbe, nn::Conv2d<5, 3, 1, 1>>>(
      "Conv2d<5,3,1,1> on 2x4x4, batch 37, 2 threads", {.batch = 37, .threads = 2, .max_elements = 120});
}

TEST_CASE("gradients: Conv2d packs several images per GEMM, 1 thread", "[nn][gradients][conv2d]") {
  // Groups of 16 + 16 + 5 on one thread.
  check<Sequential<Input<2, 4, 4>, GradProbe, nn::Conv2d<5, 3, 1, 1>>>(
      "Conv2d<5,3,1,1> on 2x4x4, batch 37, 1 thread", {.batch = 37, .threads = 1, .max_elements = 120});
}

TEST_CASE("gradients: Conv2d on 16-pixel maps reads the padded image in place", "[nn][gradients][conv2d]") {
  // Wide maps take the indirect GEMM (no im2col matrix) forward and for the input gradient.
  using nn::detail::IndirectConvolution;
  using nn::detail::Window;
  static_assert(IndirectConvolution<Window{2, 16, 16, 3, 1, 1, 16, 16}>::kWorthIt);
  static_assert(IndirectConvolution<Window{2, 18, 18, 3, 1, 0, 16, 16}>::kWorthIt);
  static_assert(IndirectConvolution<Window{3, 16, 16, 3, 1, 2, 18, 18}>::kWorthIt);
  static_assert(!IndirectConvolution<Window{2, 8, 8, 3, 1, 1, 8, 8}>::kWorthIt);
  check<Sequential<Input<2, 16, 16>, GradProbe, nn::Conv2d<3, 3, 1, 1>>>(
      "Conv2d<3,3,1,1> on 2x16x16", {.batch = 3, .threads = 2, .max_elements = 150});
  check<Sequential<Input<2, 18, 18>, GradProbe, nn::Conv2d<3, 3, 1, 0, false>>>(
      "Conv2d<3,3,1,0,nobias> on 2x18x18", {.batch = 2, .max_elements = 150});
}

TEST_CASE("gradients: Conv2d weight gradient read from the padded image, grouped images",
          "[nn][gradients][conv2d]") {
  // 8x8 maps: im2col forward, several images per GEMM, and the windowed weight gradient.
  check<Sequential<Input<2, 8, 8>, GradProbe, nn::Conv2d<3, 3, 1, 1>>>(
      "Conv2d<3,3,1,1> on 2x8x8, batch 5, 2 threads", {.batch = 5, .threads = 2, .max_elements = 150});
}

TEST_CASE("gradients: Conv2dReLU on both paths", "[nn][gradients][conv2d]") {
  // Indirect (16-pixel maps) and im2col with grouped images (6x6), with and without bias.
  check<Sequential<Input<2, 16, 16>, GradProbe, nn::Conv2dReLU<3, 3, 1, 1>>>(
      "Conv2dReLU<3,3,1,1> on 2x16x16", {.batch = 3, .threads = 2, .max_elements = 150, .kinks = true});
  check<Sequential<Input<3, 6, 6>, GradProbe, nn::Conv2dReLU<4, 3, 1, 1, false>>>(
      "Conv2dReLU<4,3,1,1,nobias> on 3x6x6", {.batch = 9, .threads = 2, .max_elements = 150, .kinks = true});
  check<Sequential<Input<2, 7, 7>, GradProbe, nn::Conv2dReLU<4, 3, 2, 1>>>(
      "Conv2dReLU<4,3,2,1> on 2x7x7", {.batch = 4, .kinks = true});
}

TEST_CASE("gradients: Conv2d through Winograd F(2x2, 3x3), padding 0, 1 and 2", "[nn][gradients][conv2d]") {
  // 16 channels each way and even outputs: forward, input gradient and weight gradient all go
  // through the transformed tiles; several images per product, split over 2 threads. 64 sampled
  // elements of each tensor: a wrong transform is wrong at most of them, and each costs two
  // forward passes at -O0 under ASan (150 took 31 s of CI).
  using Padded1 = nn::bind_t<nn::Conv2d<16, 3, 1, 1>, nn::Chw<16, 6, 6>, double, tensor::Cpu>;
  static_assert(Padded1::kUsesWinograd && Padded1::kWinogradOutputTile == 2);
  static_assert(!nn::bind_t<nn::Conv2d<16, 3, 1, 1>, nn::Chw<8, 6, 6>, double, tensor::Cpu>::kUsesWinograd);
  static_assert(!nn::bind_t<nn::Conv2d<16, 3, 1, 1>, nn::Chw<16, 7, 7>, double, tensor::Cpu>::kUsesWinograd);
  check<Sequential<Input<16, 6, 6>, GradProbe, nn::Conv2d<16, 3, 1, 1>>>(
      "Conv2d<16,3,1,1> on 16x6x6, batch 5, 2 threads", {.batch = 5, .threads = 2, .max_elements = 64});
  check<Sequential<Input<16, 6, 6>, GradProbe, nn::Conv2d<16, 3, 1, 0, false>>>(
      "Conv2d<16,3,1,0,nobias> on 16x6x6", {.batch = 3, .max_elements = 64});
  check<Sequential<Input<16, 4, 6>, GradProbe, nn::Conv2d<16, 3, 1, 2>>>(
      "Conv2d<16,3,1,2> on 16x4x6", {.batch = 2, .threads = 2, .max_elements = 64});
  check<Sequential<Input<16, 6, 6>, GradProbe, nn::Conv2dReLU<16, 3, 1, 1, false>>>(
      "Conv2dReLU<16,3,1,1,nobias> on 16x6x6", {.batch = 4, .threads = 2, .max_elements = 64, .kinks = true});
}

TEST_CASE("gradients: Conv2d through Winograd F(4x4, 3x3)", "[nn][gradients][conv2d]") {
  // Sizes that are multiples of 4 take the larger tiles; one and two rows of tiles, several images
  // per product, 2 threads.
  static_assert(nn::bind_t<nn::Conv2d<16, 3, 1, 1>, nn::Chw<16, 8, 8>, double,
                           tensor::Cpu>::kWinogradOutputTile == 4);
  static_assert(nn::bind_t<nn::Conv2d<16, 3, 1, 1>, nn::Chw<16, 4, 8>, double,
                           tensor::Cpu>::kWinogradOutputTile == 4);
  check<Sequential<Input<16, 8, 8>, GradProbe, nn::Conv2d<16, 3, 1, 1>>>(
      "Conv2d<16,3,1,1> on 16x8x8, batch 5, 2 threads",
      {.batch = 5, .threads = 2, .max_elements = 64});
  check<Sequential<Input<16, 4, 8>, GradProbe, nn::Conv2dReLU<24, 3, 1, 1, false>>>(
      "Conv2dReLU<24,3,1,1,nobias> on 16x4x8",
      {.batch = 3, .threads = 2, .max_elements = 64, .kinks = true});
}

TEST_CASE("gradients: Conv2d as the first layer, stacked convolutions", "[nn][gradients][conv2d]") {
  check<Sequential<Input<3, 6, 6>, nn::Conv2d<4, 3, 2, 1>, nn::Conv2d<3, 1, 1, 0, false>,
                   nn::Conv2d<2, 3, 1, 1, false>>>("Conv2d first, then two more", {.batch = 3, .threads = 2});
}

// ---------------------------------------------------------------------------------------------
// Pooling. Max pooling gets pairwise distinct inputs at least 1e-3 apart (no ties, and no tie is
// crossed by a perturbation); the sizes of the 2-thread cases exceed the layers' parallel threshold.

TEST_CASE("gradients: MaxPool2d kernel 3, stride 2, padding 1", "[nn][gradients][pooling]") {
  check<Sequential<Input<2, 7, 7>, GradProbe, nn::MaxPool2d<3, 2, 1>>>(
      "MaxPool2d<3,2,1> on 2x7x7", {.batch = 3, .fill = Options::Fill::kDistinct});
}

TEST_CASE("gradients: MaxPool2d kernel 2, overlapping windows with stride 1", "[nn][gradients][pooling]") {
  check<Sequential<Input<2, 5, 6>, GradProbe, nn::MaxPool2d<2, 1>>>(
      "MaxPool2d<2,1> on 2x5x6", {.batch = 2, .fill = Options::Fill::kDistinct});
}

TEST_CASE("gradients: MaxPool2d on 2 threads", "[nn][gradients][pooling]") {
  check<Sequential<Input<8, 12, 12>, GradProbe, nn::MaxPool2d<3, 2, 1>>>(
      "MaxPool2d<3,2,1> on 8x12x12, batch 37, 2 threads",
      {.batch = 37, .threads = 2, .fill = Options::Fill::kDistinct, .max_elements = 120});
}

TEST_CASE("gradients: MaxPool2d after a convolution, parameters", "[nn][gradients][pooling]") {
  check<Sequential<Input<2, 6, 6>, nn::Conv2d<3, 3, 1, 1>, nn::MaxPool2d<3, 2, 1>>>(
      "Conv2d then MaxPool2d<3,2,1>", {.batch = 3, .kinks = true});
}

TEST_CASE("gradients: AvgPool2d kernel 3, stride 2, padding 1", "[nn][gradients][pooling]") {
  check<Sequential<Input<2, 7, 7>, GradProbe, nn::AvgPool2d<3, 2, 1>>>("AvgPool2d<3,2,1> on 2x7x7",
                                                                       {.batch = 3});
}

TEST_CASE("gradients: AvgPool2d kernel 2, default stride", "[nn][gradients][pooling]") {
  check<Sequential<Input<3, 4, 6>, GradProbe, nn::AvgPool2d<2>>>("AvgPool2d<2> on 3x4x6", {.batch = 2});
}

TEST_CASE("gradients: AvgPool2d on 2 threads", "[nn][gradients][pooling]") {
  check<Sequential<Input<8, 12, 12>, GradProbe, nn::AvgPool2d<3, 2, 1>>>(
      "AvgPool2d<3,2,1> on 8x12x12, batch 37, 2 threads",
      {.batch = 37, .threads = 2, .max_elements = 120});
}

TEST_CASE("gradients: GlobalAvgPool", "[nn][gradients][pooling]") {
  check<Sequential<Input<3, 4, 5>, GradProbe, nn::GlobalAvgPool>>("GlobalAvgPool on 3x4x5", {.batch = 3});
}

TEST_CASE("gradients: GlobalAvgPool on 2 threads, after a convolution", "[nn][gradients][pooling]") {
  check<Sequential<Input<8, 12, 12>, GradProbe, nn::GlobalAvgPool>>(
      "GlobalAvgPool on 8x12x12, batch 37, 2 threads", {.batch = 37, .threads = 2, .max_elements = 120});
  check<Sequential<Input<2, 5, 5>, nn::Conv2d<3, 3, 1, 1>, nn::GlobalAvgPool, nn::Linear<2>>>(
      "Conv2d, GlobalAvgPool, Linear", {.batch = 3});
}

// ---------------------------------------------------------------------------------------------
// BatchNorm2d: training mode (batch statistics, which couple the samples) and evaluation mode
// (running statistics, drawn at random here).

TEST_CASE("gradients: BatchNorm2d in training mode", "[nn][gradients][batch_norm]") {
  check<Sequential<Input<3, 4, 4>, GradProbe, nn::BatchNorm2d<>>>("BatchNorm2d, training", {.batch = 5});
}

TEST_CASE("gradients: BatchNorm2d in evaluation mode", "[nn][gradients][batch_norm]") {
  check<Sequential<Input<3, 4, 4>, GradProbe, nn::BatchNorm2d<>>>("BatchNorm2d, eval",
                                                                  {.batch = 5, .eval = true});
}

TEST_CASE("gradients: BatchNorm2d on 2 threads", "[nn][gradients][batch_norm]") {
  // 37 x 8 x 12 x 12 values exceed the layer's parallel threshold: the batch splits across threads.
  check<Sequential<Input<8, 12, 12>, GradProbe, nn::BatchNorm2d<>>>(
      "BatchNorm2d, training, batch 37, 2 threads", {.batch = 37, .threads = 2, .max_elements = 120});
  check<Sequential<Input<8, 12, 12>, GradProbe, nn::BatchNorm2d<>>>(
      "BatchNorm2d, eval, batch 37, 2 threads",
      {.batch = 37, .threads = 2, .eval = true, .max_elements = 120});
}

TEST_CASE("gradients: BatchNorm2d after a convolution, both modes", "[nn][gradients][batch_norm]") {
  // No bias before BatchNorm: in training mode its gradient is zero (the batch mean absorbs it).
  using Model =
      Sequential<Input<2, 5, 5>, nn::Conv2d<3, 3, 1, 1, false>, nn::BatchNorm2d<>, nn::Conv2d<2, 1>>;
  check<Model>("Conv2d, BatchNorm2d, Conv2d, training", {.batch = 4});
  check<Model>("Conv2d, BatchNorm2d, Conv2d, eval", {.batch = 4, .eval = true});
}

TEST_CASE("gradients: BatchNormReLU2d, both modes", "[nn][gradients][batch_norm]") {
  check<Sequential<Input<3, 4, 4>, GradProbe, nn::BatchNormReLU2d<>>>("BatchNormReLU2d, training",
                                                                      {.batch = 5, .kinks = true});
  check<Sequential<Input<3, 4, 4>, GradProbe, nn::BatchNormReLU2d<>>>(
      "BatchNormReLU2d, eval", {.batch = 5, .eval = true, .kinks = true});
  check<Sequential<Input<8, 12, 12>, GradProbe, nn::BatchNormReLU2d<>>>(
      "BatchNormReLU2d, training, batch 37, 2 threads",
      {.batch = 37, .threads = 2, .max_elements = 120, .kinks = true});
}

// ---------------------------------------------------------------------------------------------
// ReLU, Dropout, Flatten

TEST_CASE("gradients: ReLU", "[nn][gradients][activation]") {
  // Inputs at least 0.1 from the kink.
  check<Sequential<Input<20>, GradProbe, nn::ReLU>>("ReLU on 20",
                                                    {.batch = 3, .fill = Options::Fill::kAwayFromZero});
  check<Sequential<Input<2, 3, 3>, GradProbe, nn::ReLU>>("ReLU on 2x3x3",
                                                         {.batch = 2, .fill = Options::Fill::kAwayFromZero});
}

TEST_CASE("gradients: ReLU on 2 threads, and between linear layers", "[nn][gradients][activation]") {
  check<Sequential<Input<1000>, GradProbe, nn::ReLU>>(
      "ReLU on 1000, batch 37, 2 threads",
      {.batch = 37, .threads = 2, .fill = Options::Fill::kAwayFromZero, .max_elements = 120});
  check<Sequential<Input<6>, nn::Linear<12>, nn::ReLU, nn::Linear<3>>>("Linear, ReLU, Linear",
                                                                       {.batch = 4, .kinks = true});
}

TEST_CASE("gradients: Dropout in training, with the mask held fixed", "[nn][gradients][dropout]") {
  // The mask depends on the context's step, which every training forward advances; the check
  // resets it before each forward.
  check<Sequential<Input<50>, GradProbe, nn::Dropout<0.3>>>("Dropout<0.3>, training",
                                                            {.batch = 3, .fixed_mask = true});
  check<Sequential<Input<6>, nn::Linear<40>, nn::Dropout<0.5>, nn::Linear<3>>>(
      "Linear, Dropout<0.5>, Linear, training", {.batch = 4, .threads = 2, .fixed_mask = true});
}

TEST_CASE("gradients: Dropout drops the gradient where it dropped the value", "[nn][gradients][dropout]") {
  nn::Network<Sequential<Input<200>, GradProbe, nn::Dropout<0.4>>, double> net;
  tensor::Tensor<double> x(tensor::Shape{2, 200});
  nn_test::fill_away_from_zero(x.span(), 3, 0.5, 1.0);
  const auto y = net.forward(x.view());
  tensor::Tensor<double> g(tensor::Shape{2, 200});
  g.fill(1.0);
  net.backward(g.view());
  const auto& dx = net.body().layer<0>().captured;
  std::size_t dropped = 0;
  for (std::int64_t i = 0; i < 400; ++i) {
    if (y.data()[i] == 0.0) {
      ++dropped;
      CHECK(dx.data()[i] == 0.0);
    } else {
      CHECK(dx.data()[i] == Approx(1.0 / 0.6).epsilon(1e-15));
    }
  }
  CHECK(dropped > 0);
  CHECK(dropped < 400);
}

TEST_CASE("gradients: Dropout in evaluation mode is the identity", "[nn][gradients][dropout]") {
  check<Sequential<Input<10>, GradProbe, nn::Dropout<0.5>, nn::Linear<3>>>("Dropout<0.5>, eval",
                                                                          {.batch = 3, .eval = true});
}

TEST_CASE("gradients: Flatten", "[nn][gradients][flatten]") {
  check<Sequential<Input<2, 3, 4>, GradProbe, nn::Flatten, nn::Linear<5>>>("Flatten, Linear", {.batch = 3});
  check<Sequential<Input<2, 4, 4>, nn::Conv2d<3, 3, 2, 1>, nn::Flatten, nn::Linear<4>>>(
      "Conv2d, Flatten, Linear", {.batch = 3});
}

// ---------------------------------------------------------------------------------------------
// Residual blocks and nested Sequentials

TEST_CASE("gradients: Residual with identity shortcut", "[nn][gradients][residual]") {
  using Body = Sequential<nn::Conv2d<4, 3, 1, 1>, nn::ReLU, nn::Conv2d<4, 3, 1, 1, false>>;
  check<Sequential<Input<4, 5, 5>, GradProbe, nn::Residual<Body>>>("Residual<identity>", {.batch = 3, .kinks = true});
}

TEST_CASE("gradients: Residual with identity shortcut and ReLU after", "[nn][gradients][residual]") {
  using Body = Sequential<nn::Conv2d<4, 3, 1, 1, false>, nn::BatchNorm2d<>, nn::ReLU,
                          nn::Conv2d<4, 3, 1, 1, false>, nn::BatchNorm2d<>>;
  check<Sequential<Input<4, 5, 5>, GradProbe, nn::Residual<Body, nn::IdentityShortcut, nn::ReLU>>>(
      "Residual<identity, ReLU>", {.batch = 3, .kinks = true});
}

TEST_CASE("gradients: Residual with projection shortcut and ReLU after", "[nn][gradients][residual]") {
  using Body = Sequential<nn::Conv2d<6, 3, 2, 1, false>, nn::BatchNorm2d<>, nn::ReLU,
                          nn::Conv2d<6, 3, 1, 1, false>, nn::BatchNorm2d<>>;
  check<Sequential<Input<3, 6, 6>, GradProbe, nn::Residual<Body, nn::Projection<6, 2>, nn::ReLU>>>(
      "Residual<projection, ReLU>", {.batch = 3, .kinks = true});
}

TEST_CASE("gradients: Residual with projection shortcut, no activation, eval mode",
          "[nn][gradients][residual]") {
  using Body = Sequential<nn::Conv2d<6, 3, 2, 1>, nn::BatchNorm2d<>>;
  check<Sequential<Input<3, 6, 6>, GradProbe, nn::Residual<Body, nn::Projection<6, 2>>>>(
      "Residual<projection>, eval", {.batch = 2, .eval = true});
}

TEST_CASE("gradients: Residual as the first layer", "[nn][gradients][residual]") {
  using Body = Sequential<nn::Conv2d<3, 3, 1, 1>, nn::ReLU, nn::Conv2d<3, 3, 1, 1>>;
  check<Sequential<Input<3, 4, 4>, nn::Residual<Body, nn::IdentityShortcut, nn::ReLU>, nn::Conv2d<2, 1>>>(
      "Residual first", {.batch = 3, .kinks = true});
}

TEST_CASE("gradients: nested Sequential", "[nn][gradients][sequential]") {
  using Inner = Sequential<nn::Linear<5>, nn::ReLU, Sequential<nn::Linear<4>, nn::Named<"x", nn::Linear<6>>>>;
  check<Sequential<Input<7>, GradProbe, Inner, nn::Repeat<2, Sequential<nn::Linear<6>>>, nn::Linear<3>>>(
      "nested Sequential with Repeat", {.batch = 3, .kinks = true});
}

TEST_CASE("gradients: a small ResNet with the models' basic blocks, cross-entropy",
          "[nn][gradients][residual]") {
  using Model = Sequential<Input<3, 8, 8>, GradProbe, nn::Conv2d<4, 3, 1, 1, false>, nn::BatchNorm2d<>,
                           nn::ReLU, coltrain::models::BasicBlock<4, 1, false>,
                           coltrain::models::BasicBlock<8, 2, true>, nn::GlobalAvgPool, nn::Linear<3>>;
  check<Model>("mini ResNet, cross-entropy", {.batch = 4, .threads = 2, .max_elements = 60, .kinks = true},
               cross_entropy_objective(labels_for(4, 3, 9), 0.0));
}

// ---------------------------------------------------------------------------------------------
// SoftmaxCrossEntropy

TEST_CASE("gradients: SoftmaxCrossEntropy with respect to the logits", "[nn][gradients][loss]") {
  for (const double smoothing : {0.0, 0.1, 1.0}) {
    INFO("label smoothing " << smoothing);
    tensor::Tensor<double> logits(tensor::Shape{6, 5});
    nn_test::fill_uniform(logits.span(), 21, -3.0, 3.0);
    const auto labels = labels_for(6, 5, 22);
    const nn::SoftmaxCrossEntropy loss(smoothing);
    tensor::Tensor<double> grad(logits.shape());
    const double value = loss.loss_and_grad<double>(logits.view(), labels, grad.view());
    CHECK(value == Approx(loss.loss<double>(logits.view(), labels)).epsilon(1e-15));
    CHECK(value == Approx(static_cast<double>(reference_cross_entropy(logits.data(), 6, 5, labels,
                                                                      smoothing)))
                       .epsilon(1e-13));
    const std::vector<double> analytic(grad.span().begin(), grad.span().end());
    const Objective objective = cross_entropy_objective(labels, smoothing);
    const auto report = check_tensor(
        "logits", logits.span(), analytic,
        [&] { return std::vector<double>(logits.span().begin(), logits.span().end()); },
        objective.difference, Options{});
    require_reports("SoftmaxCrossEntropy(" + std::to_string(smoothing) + ")", {report});
    // The loss scale multiplies the gradient.
    tensor::Tensor<double> scaled(logits.shape());
    loss.loss_and_grad<double>(logits.view(), labels, scaled.view(), 256.0);
    for (std::int64_t i = 0; i < grad.numel(); ++i)
      CHECK(scaled.data()[i] == Approx(256.0 * grad.data()[i]).epsilon(1e-14));
  }
}

TEST_CASE("gradients: SoftmaxCrossEntropy through a network", "[nn][gradients][loss]") {
  check<Sequential<Input<8>, GradProbe, nn::Linear<5>>>("Linear + cross-entropy", {.batch = 6},
                                                         cross_entropy_objective(labels_for(6, 5, 4), 0.0));
  check<Sequential<Input<8>, GradProbe, nn::Linear<5>>>(
      "Linear + cross-entropy, smoothing 0.2", {.batch = 6}, cross_entropy_objective(labels_for(6, 5, 4), 0.2));
}
