#pragma once
// Network<Spec, T, Device>: a whole model as one type. Spec is a Sequential that starts with
// Input<...>; T is the storage type of parameters and activations (float; double for gradient
// checks; half or bfloat16 under mixed precision); Device is tensor::Cpu (or tensor::Cuda).
//
//   using Net = Sequential<Input<1, 28, 28>, Flatten, Linear<128>, ReLU, Linear<10>>;
//   Network<Net> net({.threads = 2});
//   auto logits = net.forward(images);   // [batch, 10]
//   net.backward(grad_logits);           // parameter gradients accumulate
//
// Parameters and buffers are visited in PyTorch's state_dict order and names. The parameters'
// values and gradients live in one ParameterArena (nn/parameter_arena.hpp), so that data-parallel
// training reduces and gathers them in place.

#include <coltrain/core/config.hpp>
#include <coltrain/core/denormals.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/nn/context.hpp>
#include <coltrain/nn/init.hpp>
#include <coltrain/nn/layer.hpp>
#include <coltrain/nn/parameter.hpp>
#include <coltrain/nn/parameter_arena.hpp>
#include <coltrain/nn/state_visitors.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::nn {

struct NetworkOptions {
  int threads = 1;          // CPU threads for the kernels (the caller's thread counts)
  std::uint64_t seed = 0;   // parameter initialisation and dropout masks
};

template <class Spec, class T = float, class Device = tensor::Cpu>
class Network {
  static_assert(!std::is_void_v<typename Spec::DeclaredInput>,
                "coltrain::nn::Network: the model must start with Input<...>, e.g. "
                "Sequential<Input<1, 28, 28>, ...>");

 public:
  using Input = typename Spec::DeclaredInput;
  using Body = bind_t<Spec, Input, T, Device>;
  using Output = typename Body::Output;
  using value_type = T;
  using device_type = Device;
  static constexpr std::size_t kParameterCount = Body::kParameterCount;
  static constexpr std::size_t kForwardMacs = Body::kForwardMacs;  // per sample

  explicit Network(NetworkOptions options = {}) : context_(options.threads, options.seed) {
    Rng rng(options.seed);
    body_.initialize(rng);
    gather_parameters_into_arena();
  }
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // Runs the model on a batch [batch, Input...] and returns the output [batch, Output...], which
  // stays valid until the next forward(). The input is copied, so the caller may reuse its buffer.
  tensor::TensorView<const T, Device> forward(tensor::TensorView<const T, Device> input) {
    check_shape(input.shape(), Input::batch(input.shape().rank() ? input.extent(0) : 0), "input");
    const std::int64_t batch = input.extent(0);
    const FlushDenormalsScope flush;
    input_.resize(input.shape());
    context_.copy(input.data(), input_.data(), input.numel());
    output_.resize(Output::batch(batch));
    if (training()) context_.set_step(context_.step() + 1);  // a fresh dropout mask per step
    body_.forward(input_.view(), output_.view(), context_);
    return output_.view();
  }

  // Back-propagates d(loss)/d(output) of the last forward(); parameter gradients accumulate. Each
  // parameter is reported to context().gradient_ready_hook(), when set, as soon as its gradient is
  // final: layer by layer, last layer first (see the protocol in nn/layer.hpp).
  void backward(tensor::TensorView<const T, Device> grad_output) {
    check_shape(grad_output.shape(), output_.shape(), "output gradient");
    const FlushDenormalsScope flush;
    body_.backward(input_.view(), output_.view(), grad_output, {}, context_);
  }

  void zero_grad() { context_.zero(arena_.gradients(), static_cast<std::int64_t>(arena_.size())); }

  void train() { context_.set_mode(Mode::kTrain); }
  void eval() { context_.set_mode(Mode::kEval); }
  bool training() const { return context_.training(); }

  // f(const std::string& name, Parameter<T, Device>&), in state_dict order.
  template <class F>
  void visit_parameters(F&& f) {
    const ParameterVisitor<T, Device> visitor(f);
    body_.visit_parameters(visitor, "");
  }
  // f(const std::string& name, Tensor<U, Device>&) for non-learnable state (BatchNorm statistics:
  // U is compute_t<T> or std::int64_t).
  template <class F>
  void visit_buffers(F&& f) {
    const BufferVisitor<T, Device> visitor(f);
    body_.visit_buffers(visitor, "");
  }

  Context<Device>& context() { return context_; }
  Body& body() { return body_; }
  // Every parameter's values and gradients, in one allocation each; parameter p (state_dict
  // order) at offset(p).
  ParameterArena<T, Device>& parameter_arena() { return arena_; }

 private:
  // Called once, before anything can hold a parameter's address: the layers allocated and
  // initialised their parameters themselves; from here on each is a window on the arena.
  void gather_parameters_into_arena() {
    std::vector<std::size_t> sizes;
    visit_parameters([&](const std::string&, Parameter<T, Device>& p) {
      sizes.push_back(static_cast<std::size_t>(p.value.numel()));
    });
    arena_ = ParameterArena<T, Device>(sizes);
    std::vector<tensor::Tensor<T, Device>> initial;  // kept until the (device: async) copies end
    std::size_t index = 0;
    visit_parameters([&](const std::string&, Parameter<T, Device>& p) {
      const std::size_t offset = arena_.offset(index++);
      const tensor::Shape shape = p.value.shape();
      initial.push_back(std::move(p.value));
      context_.copy(initial.back().data(), arena_.values() + offset, shape.numel());
      p.value = tensor::Tensor<T, Device>::borrowing(arena_.values() + offset, shape);
      p.grad = tensor::Tensor<T, Device>::borrowing(arena_.gradients() + offset, shape);
    });
    if constexpr (requires { context_.synchronize(); }) context_.synchronize();
  }

  static void check_shape(const tensor::Shape& got, const tensor::Shape& expected, const char* what) {
    if (got == expected && got.rank() > 0) return;
    throw InvalidArgument(std::string("the network's ") + what + " has shape " + got.to_string() +
                          ", expected " + expected.to_string() + " ([batch, sample shape...])");
  }

  Context<Device> context_;
  Body body_;
  ParameterArena<T, Device> arena_;
  tensor::Tensor<T, Device> input_;
  tensor::Tensor<T, Device> output_;
};

}  // namespace coltrain::nn
