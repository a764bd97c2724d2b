#pragma once
// How layers are written and composed.
//
// A layer *spec* is an empty type the user writes (Linear<128>, Conv2d<32, 3>, ReLU). It becomes a
// concrete layer when bound to the shape of one input sample, a storage type and a device:
// `Spec::template Bind<In, T, Device>`. A bound layer provides
//
//   using Input = In;  using Output = StaticShape<...>;          // computed at compile time
//   static constexpr std::size_t kParameterCount;
//   static constexpr std::size_t kForwardMacs;                     // optional, see forward_macs()
//   void initialize(Rng&);
//   void forward(TensorView<const T, D> in, TensorView<T, D> out, Context<D>&);
//   void backward(TensorView<const T, D> in, TensorView<const T, D> out,
//                 TensorView<const T, D> grad_out, TensorView<T, D> grad_in, Context<D>&);
//   template <class F>
//   void visit_parameters(F&& f, const std::string& prefix);  // f(name, Parameter&)
//   template <class F>
//   void visit_buffers(F&& f, const std::string& prefix);     // f(name, Tensor&)
// (Inside a Network, f is a ParameterVisitor or BufferVisitor, nn/state_visitors.hpp: a buffer is a
// tensor of compute_t<T> or std::int64_t.)
//
// Optionally, a layer whose last pass writes its output element by element may offer
//   void forward_add(TensorView<const T, D> in, const T* addend, TensorView<T, D> out, Context<D>&,
//                    std::bool_constant<Relu>);
// out = forward(in) + addend (then ReLU when Relu) in that pass, and promise that its backward()
// never reads `out` (it may then be given an empty view). A residual block whose body ends in such
// a layer (Sequential forwards the offer of its last child) adds its shortcut there, so the body's
// own output is never written and read back (AddsInOutputPass in nn/sequential.hpp).
//
// Tensors carry the batch as their first axis. backward() adds to the parameter gradients and
// writes grad_in unless grad_in is empty (the first layer's input needs no gradient). A shape that
// does not fit is a static_assert in the bound layer, with a message that names the layer.
//
// Gradient-ready reports. When the context has a gradient-ready hook (Context::gradient_ready_hook,
// which data-parallel training sets), every parameter is reported to it exactly once per backward
// pass, as soon as its gradient is final: a container (Sequential, Residual) reports each child's
// parameters right after that child's backward(), in the child's visit_parameters order. A child
// that is itself a container reports its own parameters and declares
//   static constexpr bool kReportsGradients = true;
// so that the container around it does not report them again. Leaf layers do nothing. A new layer
// that holds containers must declare kReportsGradients and report its other parameters itself, or
// the containers' parameters would be reported twice.

#include <coltrain/core/config.hpp>
#include <coltrain/tensor/shape.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

namespace coltrain::nn {

using tensor::Chw;
using tensor::Flat;
using tensor::StaticShape;

// A string usable as a template argument: Named<"conv1", Conv2d<32, 3>>.
template <std::size_t N>
struct FixedString {
  constexpr FixedString(const char (&text)[N]) { std::copy_n(text, N, value); }  // NOLINT: implicit on purpose
  constexpr std::string_view view() const { return {value, N - 1}; }
  char value[N];
};

// Gives a layer the name its PyTorch twin's attribute has ("conv1"), so that parameters are named
// "conv1.weight" instead of by position ("0.weight", as in torch.nn.Sequential).
template <FixedString Name, class Spec>
struct Named {
  static constexpr std::string_view kName = Name.view();
  using Inner = Spec;
  template <class In, class T, class Device>
  using Bind = typename Spec::template Bind<In, T, Device>;
};

// The shape of one input sample; the first entry of a network's top-level Sequential.
template <std::size_t... Dims>
struct Input {
  using Shape = StaticShape<Dims...>;
};

// N copies of Block, spliced into the enclosing Sequential (so they are numbered 0..N-1 there, as
// torch.nn.Sequential(*blocks) numbers them).
template <std::size_t N, class Block>
struct Repeat {};

// The name a spec has at position `index` of a Sequential.
template <class Spec>
std::string child_name(std::size_t index) {
  if constexpr (requires { Spec::kName; })
    return std::string(Spec::kName);
  else
    return std::to_string(index);
}

// Multiply-accumulates per sample of a bound layer's forward pass (GEMM-like layers declare
// kForwardMacs; the rest count as 0), for FLOP rates: training costs about 3x the forward pass.
template <class Layer>
constexpr std::size_t forward_macs() {
  if constexpr (requires { Layer::kForwardMacs; })
    return Layer::kForwardMacs;
  else
    return 0;
}

// Whether a bound layer reports its own parameters' gradients (a container; see the protocol).
template <class Layer>
constexpr bool reports_gradients() {
  if constexpr (requires { Layer::kReportsGradients; })
    return Layer::kReportsGradients;
  else
    return false;
}

template <class Spec, class In, class T, class Device>
using bind_t = typename Spec::template Bind<In, T, Device>;

class Rng;

// The protocol's part that a layer without parameters or buffers (ReLU, pooling, Flatten) has
// nothing to say in: derive from it and write forward() and backward(). The derived layer names
// its own Input or Output where it uses them (a dependent base's names are not found unqualified).
template <class In, class Out>
struct ParameterFreeLayer {
  using Input = In;
  using Output = Out;
  static constexpr std::size_t kParameterCount = 0;

  void initialize(Rng&) {}
  template <class F>
  void visit_parameters(F&&, const std::string&) {}
  template <class F>
  void visit_buffers(F&&, const std::string&) {}
};

}  // namespace coltrain::nn
