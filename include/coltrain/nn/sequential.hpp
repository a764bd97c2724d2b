#pragma once
// Sequential<Specs...>: layers applied in order, each bound to the output shape of the one before.
// A network's top level starts with Input<...>; a nested Sequential (a block, a stage) takes its
// input shape from where it is used. Repeat<N, Block> entries are spliced in place. Children are named
// by position, or by Named<"...">, exactly as torch.nn.Sequential and module attributes name them.
// After each child's backward pass, its parameters are reported to the context's gradient-ready
// hook (the protocol is in nn/layer.hpp).

#include <coltrain/core/config.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::nn {

// A bound layer that offers forward_add (the protocol is in nn/layer.hpp).
template <class Layer, class T, class Device>
concept AddsInOutputPass = requires(Layer& layer, tensor::TensorView<const T, Device> in,
                                    const T* addend, tensor::TensorView<T, Device> out,
                                    Context<Device>& ctx) {
  layer.forward_add(in, addend, out, ctx, std::true_type{});
  layer.forward_add(in, addend, out, ctx, std::false_type{});
};

namespace detail {

// Reports the parameters of one child of a container to the context's gradient-ready hook, unless
// the child reports its own or has none (then this is an empty type). The addresses are collected
// on first use, because visit_parameters builds names: a step costs one hook call per parameter.
template <class Layer, bool = (Layer::kParameterCount > 0 && !reports_gradients<Layer>())>
class GradientReport {
 public:
  template <class Device>
  void operator()(Layer&, Context<Device>&) {}
};

template <class Layer>
class GradientReport<Layer, true> {
 public:
  template <class Device>
  void operator()(Layer& layer, Context<Device>& ctx) {
    const auto& hook = ctx.gradient_ready_hook();
    if (!hook) return;
    if (parameters_.empty()) {
      layer.visit_parameters(
          [this](const std::string&, const auto& parameter) { parameters_.push_back(&parameter); },
          "");
    }
    for (const void* parameter : parameters_) hook(parameter);
  }

 private:
  std::vector<const void*> parameters_;
};

template <class... Ts>
struct TypeList {};

template <class A, class B>
struct Concat;
template <class... A, class... B>
struct Concat<TypeList<A...>, TypeList<B...>> {
  using type = TypeList<A..., B...>;
};

// One spec as the list it contributes: Repeat<N, B> gives N copies of B, Input gives nothing.
template <class Spec>
struct Expand {
  using type = TypeList<Spec>;
};
template <std::size_t... Dims>
struct Expand<Input<Dims...>> {
  using type = TypeList<>;
};
template <class Block>
struct Expand<Repeat<0, Block>> {
  using type = TypeList<>;
};
template <std::size_t N, class Block>
struct Expand<Repeat<N, Block>> {
  using type = typename Concat<TypeList<Block>, typename Expand<Repeat<N - 1, Block>>::type>::type;
};

template <class... Specs>
struct ExpandAll {
  using type = TypeList<>;
};
template <class First, class... Rest>
struct ExpandAll<First, Rest...> {
  using type = typename Concat<typename Expand<First>::type, typename ExpandAll<Rest...>::type>::type;
};

template <class... Specs>
struct DeclaredInput {
  using type = void;
};
template <std::size_t... Dims, class... Rest>
struct DeclaredInput<Input<Dims...>, Rest...> {
  using type = StaticShape<Dims...>;
};

// The bound layers of a chain of specs, each bound to its predecessor's output.
template <class In, class T, class Device, class Specs>
struct BindChain;
template <class In, class T, class Device>
struct BindChain<In, T, Device, TypeList<>> {
  using type = TypeList<>;
};
template <class In, class T, class Device, class First, class... Rest>
struct BindChain<In, T, Device, TypeList<First, Rest...>> {
  using Layer = bind_t<First, In, T, Device>;
  using type = typename Concat<TypeList<Layer>, typename BindChain<typename Layer::Output, T, Device,
                                                                   TypeList<Rest...>>::type>::type;
};

template <class In, class T, class Device, class Specs, class Layers>
class SequentialLayer;

template <class In, class T, class Device, class... Specs, class... Layers>
class SequentialLayer<In, T, Device, TypeList<Specs...>, TypeList<Layers...>> {
  static_assert(sizeof...(Layers) > 0, "coltrain::nn::Sequential: needs at least one layer");
  static constexpr std::size_t kCount = sizeof...(Layers);
  using LayerTuple = std::tuple<Layers...>;
  template <std::size_t I>
  using LayerAt = std::tuple_element_t<I, LayerTuple>;
  template <std::size_t I>
  using SpecAt = std::tuple_element_t<I, std::tuple<Specs...>>;

 public:
  using Input = In;
  using Output = typename LayerAt<kCount - 1>::Output;
  static constexpr std::size_t kParameterCount = (std::size_t{0} + ... + Layers::kParameterCount);
  static constexpr std::size_t kForwardMacs = (std::size_t{0} + ... + forward_macs<Layers>());
  static constexpr bool kReportsGradients = true;

  void initialize(Rng& rng) {
    std::apply([&](auto&... layer) { (layer.initialize(rng), ...); }, layers_);
  }

  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    forward_all_but_last(in, ctx);
    std::get<kCount - 1>(layers_).forward(input_of<kCount - 1>(in), out, ctx);
  }

  // Offered when the last layer offers it: that layer adds `addend` in its own output pass.
  template <bool Relu>
  requires AddsInOutputPass<LayerAt<kCount - 1>, T, Device>
  void forward_add(tensor::TensorView<const T, Device> in, const T* addend,
                   tensor::TensorView<T, Device> out, Context<Device>& ctx,
                   std::bool_constant<Relu> relu) {
    forward_all_but_last(in, ctx);
    std::get<kCount - 1>(layers_).forward_add(input_of<kCount - 1>(in), addend, out, ctx, relu);
  }

  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device> out,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    for_each_index_reversed([&]<std::size_t I>() {
      tensor::TensorView<const T, Device> layer_grad_out;
      if constexpr (I + 1 == kCount)
        layer_grad_out = grad_out;
      else
        layer_grad_out = gradients_[I].view();
      tensor::TensorView<T, Device> layer_grad_in;
      if constexpr (I == 0) {
        layer_grad_in = grad_in;
      } else {
        gradients_[I - 1].resize(LayerAt<I - 1>::Output::batch(batch));
        layer_grad_in = gradients_[I - 1].view();
      }
      tensor::TensorView<const T, Device> layer_out;
      if constexpr (I + 1 == kCount)
        layer_out = out;
      else
        layer_out = activations_[I].view();
      std::get<I>(layers_).backward(input_of<I>(in), layer_out, layer_grad_out, layer_grad_in, ctx);
      std::get<I>(reports_)(std::get<I>(layers_), ctx);
    });
  }

  template <class F>
  void visit_parameters(F&& f, const std::string& prefix) {
    for_each_index([&]<std::size_t I>() {
      std::get<I>(layers_).visit_parameters(f, prefix + child_name<SpecAt<I>>(I) + ".");
    });
  }

  template <class F>
  void visit_buffers(F&& f, const std::string& prefix) {
    for_each_index([&]<std::size_t I>() {
      std::get<I>(layers_).visit_buffers(f, prefix + child_name<SpecAt<I>>(I) + ".");
    });
  }

  template <std::size_t I>
  LayerAt<I>& layer() {
    return std::get<I>(layers_);
  }

 private:
  // f.template operator()<I>() for I = 0, 1, ... Count - 1.
  template <std::size_t Count = kCount, class F>
  static void for_each_index(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (f.template operator()<I>(), ...); }
    (std::make_index_sequence<Count>{});
  }

  // Every layer but the last, each into its stored activation.
  void forward_all_but_last(tensor::TensorView<const T, Device> in, Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    for_each_index<kCount - 1>([&]<std::size_t I>() {
      activations_[I].resize(LayerAt<I>::Output::batch(batch));
      std::get<I>(layers_).forward(input_of<I>(in), activations_[I].view(), ctx);
    });
  }
  template <class F>
  static void for_each_index_reversed(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f.template operator()<kCount - 1 - I>(), ...);
    }(std::make_index_sequence<kCount>{});
  }

  template <std::size_t I>
  tensor::TensorView<const T, Device> input_of(tensor::TensorView<const T, Device> in) const {
    if constexpr (I == 0)
      return in;
    else
      return activations_[I - 1].view();
  }

  LayerTuple layers_;
  [[no_unique_address]] std::tuple<GradientReport<Layers>...> reports_;
  // The output of every layer but the last (which writes to the caller's tensor), and its gradient.
  std::array<tensor::Tensor<T, Device>, kCount> activations_;
  std::array<tensor::Tensor<T, Device>, kCount> gradients_;
};

}  // namespace detail

template <class... Specs>
struct Sequential {
  // StaticShape<...> when the first entry is Input<...>, else void.
  using DeclaredInput = typename detail::DeclaredInput<Specs...>::type;

  template <class In, class T, class Device>
  struct BindChecked {
    static_assert(std::is_void_v<DeclaredInput> || std::is_same_v<DeclaredInput, In>,
                  "coltrain::nn::Sequential: its Input<...> differs from the shape it is given");
    using Expanded = typename detail::ExpandAll<Specs...>::type;
    using type = detail::SequentialLayer<In, T, Device, Expanded,
                                         typename detail::BindChain<In, T, Device, Expanded>::type>;
  };
  template <class In, class T, class Device>
  using Bind = typename BindChecked<In, T, Device>::type;
};

}  // namespace coltrain::nn
