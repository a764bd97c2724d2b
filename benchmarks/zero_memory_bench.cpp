// ZeRO-1's memory: the optimizer state (Adam's two moments) each rank holds, sharded against
// replicated, for ResNet-20 and ResNet-18, counted two ways: the bytes of the state tensors, and
// the growth of the process's resident memory across the first optimizer step (which allocates
// the state). Rank 0 prints the largest rank's figures.
//
//   COLTRAIN_BACKEND=tcp scripts/launch_local 2 build/benchmarks/zero_memory_bench
#include <coltrain/coltrain.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace coltrain;

// Resident set size in bytes, from /proc/self/statm.
std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

template <class Net>
void backward_pass(Net& net) {
  tensor::Tensor<float> images(Net::Input::batch(2));
  nn::Rng rng(7);
  for (float& v : images.span()) v = static_cast<float>(rng.uniform(-1.0, 1.0));
  const std::vector<std::int32_t> labels = {1, 2};
  net.zero_grad();
  const auto logits = net.forward(images.view());
  tensor::Tensor<float> grad(logits.shape());
  nn::SoftmaxCrossEntropy().loss_and_grad<float>(logits, labels, grad.view(), 1.0f);
  net.backward(grad.view());
}

struct Footprint {
  std::int64_t state_bytes = 0;
  std::int64_t resident_growth = 0;
};

// The largest value over the ranks.
std::int64_t largest(comm::Communicator& comm, std::int64_t value) {
  comm.allreduce(std::span(&value, 1), comm::ReduceOp::kMax);
  return value;
}

template <class Spec>
Footprint replicated(comm::Communicator& comm) {
  nn::Network<Spec> net({.seed = 1});
  train::DataParallel ddp(net, comm);
  optim::PrecisionOptimizer<optim::Fp32, optim::Adam> adam(optim::parameters_of(net),
                                                           optim::Adam(optim::Adam::Options{}));
  backward_pass(net);
  ddp.finish_gradient_sync();
  const std::int64_t before = resident_bytes();
  adam.apply(ddp.all_finite(adam.unscale_and_check()), 1e-3);
  Footprint f;
  f.resident_growth = largest(comm, resident_bytes() - before);
  adam.optimizer().for_each_state(
      [&](const std::string&, std::span<const float> v) { f.state_bytes += v.size_bytes(); });
  f.state_bytes = largest(comm, f.state_bytes);
  return f;
}

template <class Spec>
Footprint sharded(comm::Communicator& comm) {
  nn::Network<Spec> net({.seed = 1});
  train::DataParallel ddp(net, comm, {.zero_stage = 1});
  train::ZeroOptimizer<nn::Network<Spec>, optim::Fp32, optim::Adam> adam(
      ddp, optim::Adam(optim::Adam::Options{}));
  backward_pass(net);
  ddp.finish_gradient_sync();
  const std::int64_t before = resident_bytes();
  adam.step(1e-3);
  Footprint f;
  f.resident_growth = largest(comm, resident_bytes() - before);
  f.state_bytes = largest(comm, static_cast<std::int64_t>(adam.state_bytes()));
  return f;
}

template <class Spec>
void report(comm::Communicator& comm, const char* model) {
  const Footprint full = replicated<Spec>(comm);
  const Footprint shard = sharded<Spec>(comm);
  if (comm.rank() != 0) return;
  const double p = comm.size();
  const double state_ratio = static_cast<double>(shard.state_bytes) / full.state_bytes;
  const double resident_ratio =
      static_cast<double>(shard.resident_growth) / static_cast<double>(full.resident_growth);
  std::printf("| %s | %d | %.2f | %.2f | %.3f | %.2f | %.2f | %.3f | %.3f |\n", model, comm.size(),
              full.state_bytes / 1e6, shard.state_bytes / 1e6, state_ratio,
              full.resident_growth / 1e6, shard.resident_growth / 1e6, resident_ratio, 1.05 / p);
}

}  // namespace

int main() {
  try {
    comm::Communicator comm = comm::Communicator::from_env();
    if (comm.rank() == 0) {
      std::printf(
          "| model | ranks | replicated state (MB) | sharded, largest rank (MB) | ratio | "
          "replicated RSS growth (MB) | sharded RSS growth (MB) | ratio | target (1.05/p) |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    }
    report<models::ResNet<20>>(comm, "ResNet-20");
    report<models::ResNet18>(comm, "ResNet-18");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_memory_bench: %s\n", e.what());
    return 1;
  }
}
