// What a TCP job costs to start, per rank count: launched as a job of processes
// (scripts/launch_local, torchrun, srun...), every rank builds its communicator from the
// environment, and rank 0 reports the slowest rank's Communicator::from_env(), the time from the
// last rank's start to the last rank's ready communicator (the library's own share: the rest is
// waiting for processes the launcher has not started yet), the first barrier, and the largest
// resident memory (anonymous and shared-memory pages apart) and open descriptors of any rank.
// scripts/bench_rendezvous runs it over a series of rank counts and prints the table of
// docs/benchmarks.md.
//
//   scripts/launch_local 64 build/benchmarks/rendezvous_bench --csv rendezvous.csv

#include <coltrain/comm/communicator.hpp>
#include <coltrain/core/error.hpp>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>

namespace {

using namespace coltrain;

double seconds_since_epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A field of /proc/self/status in MiB ("RssAnon:   1234 kB"); 0 where the kernel has none.
double status_mib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with(field + ":")) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  return 0.0;
}

double open_descriptors() {
  std::error_code error;
  double count = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error))
    ++count;
  return count - 1;  // the iterator's own
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The TCP rendezvous of a job of processes: time, memory and descriptors per rank"};
  std::string csv;
  app.add_option("--csv", csv, "append one row to this CSV file (rank 0; a header if it is new)");
  CLI11_PARSE(app, argc, argv);

  try {
    const double started = seconds_since_epoch();
    auto comm = comm::Communicator::from_env();
    const double ready = seconds_since_epoch();
    comm.barrier();
    const double synchronised = seconds_since_epoch();

    // Maxima over the ranks (of the starts: the last one).
    double maxima[] = {ready - started,
                       synchronised - ready,
                       started,
                       ready,
                       status_mib("VmHWM"),
                       status_mib("RssAnon"),
                       status_mib("RssShmem"),
                       open_descriptors()};
    comm.allreduce(std::span<double>(maxima), comm::ReduceOp::kMax);
    if (comm.rank() != 0) return 0;
    const double after_last_start = maxima[3] - maxima[2];
    std::printf(
        "%d ranks: from_env %.3f s (slowest rank), %.3f s after the last rank started; first "
        "barrier %.3f s; per rank at most %.1f MiB resident (peak; anonymous %.1f, shared memory "
        "%.1f), %.0f descriptors\n",
        comm.size(), maxima[0], after_last_start, maxima[1], maxima[4], maxima[5], maxima[6],
        maxima[7]);
    if (!csv.empty()) {
      const bool fresh = !std::filesystem::exists(csv);
      std::ofstream out(csv, std::ios::app);
      if (fresh)
        out << "ranks,from_env_s,after_last_start_s,first_barrier_s,peak_rss_mib,rss_anon_mib,"
               "rss_shmem_mib,descriptors\n";
      out << comm.size() << ',' << maxima[0] << ',' << after_last_start << ',' << maxima[1] << ','
          << maxima[4] << ',' << maxima[5] << ',' << maxima[6] << ',' << maxima[7] << '\n';
      if (!out) throw Error("rendezvous_bench: cannot write " + csv);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "rendezvous_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
