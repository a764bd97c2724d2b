#pragma once
// Residual<Body, Shortcut, After>: out = After(Body(x) + Shortcut(x)), the building block of ResNets.
// Shortcut is IdentityShortcut (x itself; the body must keep the shape) or any layer spec, usually
// Projection<Out, Stride> (a 1x1 convolution and BatchNorm, "option B" of He et al.). After is
// NoActivation or ReLU (the basic block's final ReLU). Parameter names follow the PyTorch blocks of
// the CIFAR ResNets: the body's layers directly under the block ("conv1", "bn1"...), the shortcut's
// under "shortcut." ("shortcut.0.weight").

#include <coltrain/core/config.hpp>
#include <coltrain/nn/activation.hpp>
#include <coltrain/nn/batch_norm.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/conv2d.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/sequential.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace coltrain::nn {

struct IdentityShortcut {};
struct NoActivation {};

// out = a + b, or relu(a + b) (NaN passes, as torch.relu); out may alias a or b.
template <class T, bool Relu>
void add_tensors(Context<tensor::Cpu>& ctx, const T* a, const T* b, T* out, std::int64_t n,
                 std::bool_constant<Relu>) {
  using S = compute_t<T>;
  detail::parallel_range(ctx, n, n, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const S sum = detail::to_compute_value<S>(a[i]) + detail::to_compute_value<S>(b[i]);
      out[i] = detail::to_storage_value<T>(Relu && sum < S(0) ? S(0) : sum);
    }
  });
}

// The projection shortcut: Conv2d 1x1 with stride and no bias, then BatchNorm2d.
template <std::size_t OutChannels, std::size_t Stride>
using Projection = Sequential<Conv2d<OutChannels, 1, Stride, 0, false>, BatchNorm2d<>>;

template <class BodySpec, class ShortcutSpec, class AfterSpec, class In, class T, class Device>
class ResidualLayer {
  static constexpr bool kIdentity = std::is_same_v<ShortcutSpec, IdentityShortcut>;
  static constexpr bool kActivation = !std::is_same_v<AfterSpec, NoActivation>;
  // ReLU after the sum is applied in the same pass as the addition; its backward needs only the
  // block's output, so the sum is never stored.
  static constexpr bool kFusedRelu = std::is_same_v<AfterSpec, ReLU>;
  using BodyLayer = bind_t<BodySpec, In, T, Device>;
  using Out = typename BodyLayer::Output;
  // A body that ends in a BatchNorm adds the shortcut (and applies the ReLU) in its output pass:
  // the body's own output is then neither written nor read back.
  static constexpr bool kSumInBody =
      (kFusedRelu || !kActivation) && AddsInOutputPass<BodyLayer, T, Device>;
  static_assert(!kIdentity || std::is_same_v<In, Out>,
                "coltrain::nn::Residual: the body changes the sample shape, so the identity shortcut "
                "cannot be added to it; use a projection shortcut, Residual<Body, Projection<C, S>>");

  struct NoLayer {
    using Output = Out;
    static constexpr std::size_t kParameterCount = 0;
  };
  template <class Spec>
  struct BindOrNone {
    using type = bind_t<Spec, In, T, Device>;
  };
  using ShortcutLayer =
      typename std::conditional_t<kIdentity, std::type_identity<NoLayer>, BindOrNone<ShortcutSpec>>::type;
  static_assert(std::is_same_v<typename ShortcutLayer::Output, Out>,
                "coltrain::nn::Residual: the shortcut's output shape differs from the body's");
  template <class Spec>
  struct BindAfter {
    using type = bind_t<Spec, Out, T, Device>;
  };
  using AfterLayer =
      typename std::conditional_t<kActivation, BindAfter<AfterSpec>, std::type_identity<NoLayer>>::type;
  static_assert(AfterLayer::kParameterCount == 0,
                "coltrain::nn::Residual: After must be a parameter-free activation such as ReLU; put "
                "layers with parameters in the body or after the block");

 public:
  using Input = In;
  using Output = Out;
  static constexpr std::size_t kParameterCount =
      BodyLayer::kParameterCount + ShortcutLayer::kParameterCount;
  static constexpr std::size_t kForwardMacs = forward_macs<BodyLayer>() + forward_macs<ShortcutLayer>();
  static constexpr bool kReportsGradients = true;

  void initialize(Rng& rng) {
    body_.initialize(rng);
    if constexpr (!kIdentity) shortcut_.initialize(rng);
  }

  void forward(tensor::TensorView<const T, Device> in, tensor::TensorView<T, Device> out,
               Context<Device>& ctx) {
    const std::int64_t batch = in.extent(0);
    const tensor::Shape shape = Out::batch(batch);
    const T* added = in.data();
    if constexpr (!kIdentity) {
      shortcut_out_.resize(shape);
      shortcut_.forward(in, shortcut_out_.view(), ctx);
      added = shortcut_out_.data();
    }
    if constexpr (kSumInBody) {
      body_.forward_add(in, added, out, ctx, std::bool_constant<kFusedRelu>{});
      return;
    }
    body_out_.resize(shape);
    body_.forward(in, body_out_.view(), ctx);
    if constexpr (kFusedRelu) {
      add<true>(ctx, body_out_.data(), added, out.data(), body_out_.numel());
    } else if constexpr (kActivation) {
      sum_.resize(shape);
      add(ctx, body_out_.data(), added, sum_.data(), body_out_.numel());
      after_.forward(sum_.view(), out, ctx);
    } else {
      add(ctx, body_out_.data(), added, out.data(), body_out_.numel());
    }
  }

  void backward(tensor::TensorView<const T, Device> in, tensor::TensorView<const T, Device> out,
                tensor::TensorView<const T, Device> grad_out, tensor::TensorView<T, Device> grad_in,
                Context<Device>& ctx) {
    tensor::TensorView<const T, Device> grad_sum = grad_out;
    if constexpr (kActivation) {
      grad_sum_.resize(grad_out.shape());
      after_.backward(kFusedRelu ? out : sum_.view(), out, grad_out, grad_sum_.view(), ctx);
      grad_sum = grad_sum_.view();
    }
    const bool want_input_grad = !grad_in.empty();
    // The shortcut goes first: its parameters come last in state_dict order, so layers finish
    // their gradients in reverse state_dict order, the order in which data-parallel buckets fill.
    // The body then writes grad_in, and the shortcut's share is added to it.
    if constexpr (!kIdentity) {
      tensor::TensorView<T, Device> shortcut_grad;
      if (want_input_grad) {
        grad_shortcut_in_.resize(in.shape());
        shortcut_grad = grad_shortcut_in_.view();
      }
      shortcut_.backward(in, shortcut_out_.view(), grad_sum, shortcut_grad, ctx);
      shortcut_report_(shortcut_, ctx);
    }
    // With the sum in the body, its last layer does not read its output, which was never stored.
    body_.backward(in,
                   kSumInBody ? tensor::TensorView<const T, Device>{}
                              : tensor::TensorView<const T, Device>(body_out_.view()),
                   grad_sum, grad_in, ctx);
    body_report_(body_, ctx);
    if (want_input_grad) {
      const T* shortcut_share = kIdentity ? grad_sum.data() : grad_shortcut_in_.data();
      add(ctx, grad_in.data(), shortcut_share, grad_in.data(), grad_in.numel());
    }
  }

  template <class F>
  void visit_parameters(F&& f, const std::string& prefix) {
    body_.visit_parameters(f, prefix);
    if constexpr (!kIdentity) shortcut_.visit_parameters(f, prefix + "shortcut.");
  }
  template <class F>
  void visit_buffers(F&& f, const std::string& prefix) {
    body_.visit_buffers(f, prefix);
    if constexpr (!kIdentity) shortcut_.visit_buffers(f, prefix + "shortcut.");
  }

 private:
  template <bool Relu = false>
  static void add(Context<Device>& ctx, const T* a, const T* b, T* out, std::int64_t n) {
    // Unqualified: the device's overload is found by argument-dependent lookup (the CUDA one is in
    // cuda/nn/residual.cuh).
    add_tensors(ctx, a, b, out, n, std::bool_constant<Relu>{});
  }

  BodyLayer body_;
  [[no_unique_address]] std::conditional_t<kIdentity, NoLayer, ShortcutLayer> shortcut_;
  [[no_unique_address]] std::conditional_t<kActivation, AfterLayer, NoLayer> after_;
  [[no_unique_address]] detail::GradientReport<BodyLayer> body_report_;
  [[no_unique_address]] detail::GradientReport<ShortcutLayer> shortcut_report_;
  tensor::Tensor<T, Device> body_out_, shortcut_out_, sum_, grad_sum_, grad_shortcut_in_;
};

template <class Body, class Shortcut = IdentityShortcut, class After = NoActivation>
struct Residual {
  template <class In, class T, class Device>
  using Bind = ResidualLayer<Body, Shortcut, After, In, T, Device>;
};

}  // namespace coltrain::nn
