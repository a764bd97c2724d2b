// One rank of the job that tests/faults/fault_injection.sh breaks: allreduces over TCP in a loop,
// writes READY_FILE after 20 calls, and exits 1 with the error when a call fails (as it must once
// the script kills or stops another rank).
//   usage: fault_worker READY_FILE COUNT [MISMATCH_RANK MISMATCH_CALL]
// COUNT floats per call; with MISMATCH_RANK, that rank passes COUNT + 1 at call MISMATCH_CALL.
#include <coltrain/comm.hpp>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <span>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) {
    std::cerr << "usage: fault_worker READY_FILE COUNT [MISMATCH_RANK MISMATCH_CALL]\n";
    return 2;
  }
  const auto count = static_cast<std::size_t>(std::atol(argv[2]));
  const int odd_rank = argc == 5 ? std::atoi(argv[3]) : -1;
  const int odd_call = argc == 5 ? std::atoi(argv[4]) : -1;
  try {
    auto comm = coltrain::comm::Communicator::from_env(coltrain::comm::Backend::kTcp);
    std::vector<float> data(count + 1, 1.0f);
    // Bounded: about a minute at most, far longer than the script waits before it strikes.
    for (int call = 0; call < 60'000; ++call) {
      const bool odd = comm.rank() == odd_rank && call == odd_call;
      comm.allreduce(std::span(data.data(), odd ? count + 1 : count));
      if (call == 20) std::ofstream(argv[1]) << "ready\n";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
  return 0;
}
