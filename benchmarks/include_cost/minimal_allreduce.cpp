// The newcomer's program of issue 45: coltrain's collectives from the launcher's environment and
// one allreduce. scripts/bench_include compiles it header-only and with separate compilation.
#include <coltrain/comm.hpp>

#include <span>
#include <vector>

int main() {
  auto comm = coltrain::comm::Communicator::from_env();
  std::vector<float> values(1024, 1.0f);
  comm.allreduce(std::span(values));
  return 0;
}
