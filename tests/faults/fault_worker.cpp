// One rank of the job that tests/faults/fault_injection.sh breaks: allreduces over TCP in a loop,
// writes READY_FILE after 20 calls, and exits 1 with the error when a call fails (as it must once
// the script kills or stops another rank).   usage: fault_worker READY_FILE
#include <coltrain/comm.hpp>

#include <chrono>
#include <exception>
#include <fstream>
#include <iostream>
#include <span>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fault_worker READY_FILE\n";
    return 2;
  }
  try {
    auto comm = coltrain::comm::Communicator::from_env(coltrain::comm::Backend::kTcp);
    std::vector<float> data(1024, 1.0f);
    // Bounded: about a minute at most, far longer than the script waits before it strikes.
    for (int call = 0; call < 60'000; ++call) {
      comm.allreduce(std::span(data));
      if (call == 20) std::ofstream(argv[1]) << "ready\n";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
  return 0;
}
