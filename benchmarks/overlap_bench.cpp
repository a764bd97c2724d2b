// How much a non-blocking allreduce costs a computation it overlaps. Each round times, on every
// rank: the computation alone, the blocking allreduce alone, and iallreduce + the same computation
// + wait. The overhead is (overlapped - computation) / computation, medians over the rounds,
// slowest rank. The computation is --compute cpu (a fixed amount of floating-point work on this
// thread, calibrated once to take --compute-ms) or sleep (the thread waits --compute-ms, as it
// does while a GPU or the disk works): the first needs a core the progress thread does not.
//
//   COLTRAIN_BACKEND=tcp scripts/launch_local 2 build/benchmarks/overlap_bench --bytes 16M
#include <coltrain/coltrain.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace {

using coltrain::comm::Communicator;

// Work whose length is proportional to `iterations`; the result keeps it from being optimised away.
double compute(std::size_t iterations) {
  double x = 1.0;
  for (std::size_t i = 0; i < iterations; ++i) x = std::sqrt(x * 1.0000001 + 1e-9);
  return x;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The slowest rank's time.
double slowest(Communicator& comm, double seconds) {
  comm.allreduce(std::span(&seconds, 1), coltrain::comm::ReduceOp::kMax);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("overlap_bench: a non-blocking allreduce against the computation it overlaps");
  std::string bytes_text = "16M";
  double compute_ms = 20;
  int rounds = 15;
  std::string kind = "cpu";
  app.add_option("--bytes", bytes_text, "allreduce size (suffixes K, M: x1024)");
  app.add_option("--compute-ms", compute_ms, "the computation's length alone, in ms");
  app.add_option("--rounds", rounds, "rounds; medians are reported");
  app.add_option("--compute", kind, "the computation: cpu (work on this thread) or sleep")
      ->check(CLI::IsMember({"cpu", "sleep"}));
  CLI11_PARSE(app, argc, argv);
  try {
    std::size_t bytes = std::stoull(bytes_text);
    if (bytes_text.back() == 'K') bytes <<= 10;
    if (bytes_text.back() == 'M') bytes <<= 20;
    Communicator comm = Communicator::from_env();
    const coltrain::Logger logger(comm.rank(), comm.size());

    // Calibrate on rank 0's machine, then share, so every rank does the same work.
    std::size_t iterations = 1 << 20;
    double per_iteration = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const coltrain::Stopwatch watch;
      volatile double sink = compute(iterations);
      static_cast<void>(sink);
      per_iteration = watch.seconds() / static_cast<double>(iterations);
    }
    double shared = per_iteration;
    comm.broadcast(std::span(&shared, 1), 0);
    iterations = static_cast<std::size_t>(compute_ms * 1e-3 / shared);
    const bool sleeping = kind == "sleep";
    const auto work = [&] {
      if (sleeping) {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(compute_ms));
        return 1.0;
      }
      return compute(iterations);
    };

    std::vector<float> data(bytes / sizeof(float), 1.0f);
    std::vector<double> alone, communication, overlapped;
    double sink = 0;
    for (int round = 0; round < rounds; ++round) {
      comm.barrier();
      coltrain::Stopwatch watch;
      sink += work();
      alone.push_back(slowest(comm, watch.seconds()));

      comm.barrier();
      watch.restart();
      comm.allreduce(std::span(data));
      communication.push_back(slowest(comm, watch.seconds()));

      comm.barrier();
      watch.restart();
      coltrain::comm::Request request = comm.iallreduce(std::span(data));
      sink += work();
      request.wait();
      overlapped.push_back(slowest(comm, watch.seconds()));
    }
    const double c = median(alone), a = median(communication), o = median(overlapped);
    char line[256];
    std::snprintf(line, sizeof line,
                  "%s, %d ranks, %zu bytes, %s computation %.2f ms, allreduce %.2f ms, overlapped "
                  "%.2f ms: %+.1f%% over the computation (medians of %d rounds)%s",
                  std::string(name_of(comm.backend())).c_str(), comm.size(), bytes, kind.c_str(),
                  c * 1e3, a * 1e3, o * 1e3, (o - c) / c * 100, rounds, sink > 0 ? "" : " ");
    logger.print_root(line);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "overlap_bench: %s\n", e.what());
    return 1;
  }
}
