// coltrain_tune: measures the collectives on the machines it runs on and writes a tuning file
// (comm/tuning/tuning_file.hpp) that Algorithm::kAutomatic then chooses from. Launched like any
// job: under mpiexec or srun it measures the MPI backend and coltrain's TCP transport over the same
// ranks; under torchrun-style variables, the TCP transport alone. For each collective, size and
// algorithm it times the calls in rounds that alternate the algorithms, keeps the median round of
// the slowest rank, and writes per size range the fastest; it also fits the cost model's constants
// to every measurement, for the sizes and job shapes the rules do not cover. An existing file gains
// or replaces the rules of this job's shape and keeps the others, so running it at each job size a
// cluster uses builds one file for all of them (docs/collectives.md, "Tuning from measurement").
//
//   mpiexec -n 8 coltrain_tune --out cluster.tuning.json
//   COLTRAIN_TUNING_FILE=cluster.tuning.json mpiexec -n 8 ./my_program

#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/tuning/cost_model.hpp>
#include <coltrain/comm/tuning/tuning_file.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>
#include <coltrain/version.hpp>

#if COLTRAIN_WITH_MPI
#include <coltrain/comm/rendezvous/tcp_over_mpi.hpp>
#endif

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using namespace coltrain::comm;

struct Settings {
  std::filesystem::path out;
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{16} << 20;
  int rounds = 5;
  // Calls per round: about this long, 1 to 10,000 calls. A microsecond call timed 50 times was
  // noise: on 2 ranks ring kept 256 B-4 KiB over TCP where halving-doubling is 20% faster.
  double seconds_per_point = 0.02;
  std::vector<std::string> collectives = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                          "reduce",    "alltoall",  "barrier"};
};

// One collective call on `comm`, of `bytes` bytes of floats (the collective's whole array, as the
// cost model counts it: the allreduce vector, the gathered output, one rank's alltoall input).
class Caller {
 public:
  Caller(Communicator& comm, Collective collective, std::size_t bytes)
      : comm_(comm), collective_(collective) {
    const auto p = static_cast<std::size_t>(comm.size());
    std::size_t count = std::max<std::size_t>(1, bytes / sizeof(float));
    if (collective == Collective::kAllgather || collective == Collective::kReduceScatter ||
        collective == Collective::kAlltoall)
      count = std::max(p, count / p * p);
    input_.assign(count, 1.0f);
    output_.assign(count, 0.0f);
  }
  void operator()(Algorithm a) {
    const auto p = static_cast<std::size_t>(comm_.size());
    std::span<const float> in(input_);
    std::span<float> out(output_);
    switch (collective_) {
      case Collective::kAllreduce:
        return comm_.allreduce(in, out, ReduceOp::kSum, a);
      case Collective::kBroadcast:
        return comm_.broadcast(out, 0, a);
      case Collective::kAllgather:
        return comm_.allgather(in.first(in.size() / p), out, a);
      case Collective::kReduceScatter:
        return comm_.reduce_scatter(in, out.first(out.size() / p), ReduceOp::kSum, a);
      case Collective::kReduce:
        return comm_.reduce(in, out, 0, ReduceOp::kSum, a);
      case Collective::kAlltoall:
        return comm_.alltoall(in, out, a);
      case Collective::kBarrier:
        return comm_.barrier(a);
      default:
        throw coltrain::InvalidArgument("coltrain_tune does not measure " +
                                        std::string(name_of(collective_)));
    }
  }
  std::size_t bytes() const {
    return collective_ == Collective::kBarrier ? 0 : input_.size() * sizeof(float);
  }

 private:
  Communicator& comm_;
  Collective collective_;
  std::vector<float> input_, output_;
};

// The slowest rank's value.
double slowest(Communicator& comm, double mine) {
  comm.allreduce(std::span(&mine, 1), ReduceOp::kMax, Algorithm::kRing);
  return mine;
}

struct Measurement {
  Collective collective;
  Algorithm algorithm;
  std::size_t bytes;
  double us;  // median round, slowest rank
};

std::vector<Algorithm> candidates(Backend backend, Collective collective) {
  std::vector<Algorithm> out;
  for (Algorithm a : algorithms_for(collective))
    if (a != Algorithm::kNative || backend == Backend::kMpi) out.push_back(a);
  return out;
}

// Every algorithm of `collective` at `bytes`, in `rounds` rounds that alternate them.
std::vector<Measurement> measure_point(Communicator& comm, Collective collective, std::size_t bytes,
                                       const Settings& settings) {
  Caller call(comm, collective, bytes);
  const std::vector<Algorithm> algorithms = candidates(comm.backend(), collective);
  std::vector<int> calls(algorithms.size());
  for (std::size_t i = 0; i < algorithms.size(); ++i) {  // warm up, and size each round
    call(algorithms[i]);
    comm.barrier(Algorithm::kHalvingDoubling);
    coltrain::Stopwatch once;
    call(algorithms[i]);
    const double us = slowest(comm, once.microseconds());
    calls[i] = static_cast<int>(
        std::clamp(settings.seconds_per_point * 1e6 / std::max(us, 0.5), 1.0, 10000.0));
  }
  std::vector<std::vector<double>> rounds(algorithms.size());
  for (int round = 0; round < settings.rounds; ++round) {
    for (std::size_t i = 0; i < algorithms.size(); ++i) {
      comm.barrier(Algorithm::kHalvingDoubling);
      coltrain::Stopwatch watch;
      for (int c = 0; c < calls[i]; ++c) call(algorithms[i]);
      rounds[i].push_back(slowest(comm, watch.microseconds() / calls[i]));
    }
  }
  std::vector<Measurement> out;
  for (std::size_t i = 0; i < algorithms.size(); ++i) {
    std::vector<double>& r = rounds[i];
    std::nth_element(r.begin(), r.begin() + static_cast<long>(r.size() / 2), r.end());
    out.push_back({collective, algorithms[i], call.bytes(), r[r.size() / 2]});
  }
  return out;
}

// Per size, the fastest; the algorithm of the size below keeps the rule while it is within 5% of
// the fastest (algorithms that tie, such as ring and halving-doubling on 2 ranks, would otherwise
// trade places with the noise). A new winner takes over halfway (geometrically) between the sizes
// measured.
std::vector<SizeRule> rules_from(const std::vector<Measurement>& points) {
  std::vector<std::size_t> sizes;
  for (const Measurement& m : points)
    if (std::find(sizes.begin(), sizes.end(), m.bytes) == sizes.end()) sizes.push_back(m.bytes);
  std::sort(sizes.begin(), sizes.end());
  std::vector<SizeRule> rules;
  std::size_t previous = 0;
  for (std::size_t bytes : sizes) {
    const Measurement* best = nullptr;
    const Measurement* current = nullptr;
    for (const Measurement& m : points) {
      if (m.bytes != bytes) continue;
      if (best == nullptr || m.us < best->us) best = &m;
      if (!rules.empty() && m.algorithm == rules.back().algorithm) current = &m;
    }
    if (rules.empty()) {
      rules.push_back({0, best->algorithm});
    } else if (current == nullptr || current->us > 1.05 * best->us) {
      const auto from = static_cast<std::size_t>(
          std::sqrt(static_cast<double>(previous) * static_cast<double>(bytes)));
      rules.push_back({std::max(from, rules.back().from_bytes + 1), best->algorithm});
    }
    previous = bytes;
  }
  return rules;
}

// The relative error of `model` over the measurements it predicts.
double misfit(const CostModel& model, const std::vector<Measurement>& points, int p) {
  double sum = 0;
  for (const Measurement& m : points) {
    const double predicted = predict_us(model, m.collective, m.algorithm, p, m.bytes);
    if (!std::isfinite(predicted) || m.us <= 0) continue;
    const double error = std::log(std::max(predicted, 1e-3) / m.us);
    sum += error * error;
  }
  return sum;
}

// Fits alpha and beta of `link` (gamma measured apart) by a pattern search in log space: the
// model takes minima of algorithm shapes, so it is not linear in its constants.
void fit(CostModel& model, LinkCosts CostModel::*link, const std::vector<Measurement>& points,
         int p) {
  if (points.empty()) return;
  double step = 2.0;
  for (int iteration = 0; iteration < 200 && step > 1.01; ++iteration) {
    bool improved = false;
    for (double LinkCosts::*constant : {&LinkCosts::alpha_us, &LinkCosts::beta_us_per_byte}) {
      for (double factor : {step, 1.0 / step}) {
        CostModel trial = model;
        (trial.*link).*constant *= factor;
        if (misfit(trial, points, p) < misfit(model, points, p)) {
          model = trial;
          improved = true;
        }
      }
    }
    if (!improved) step = std::sqrt(step);
  }
}

// Microseconds per byte that sums one float array into another here (the reduction's gamma).
double measure_gamma() {
  std::vector<float> a(std::size_t{1} << 20, 1.0f), b(a.size(), 2.0f);
  std::vector<double> runs;
  for (int run = 0; run < 7; ++run) {
    coltrain::Stopwatch watch;
    reduce_into(a.data(), a.data(), b.data(), a.size(), ReduceOp::kSum);
    runs.push_back(watch.microseconds() / static_cast<double>(a.size() * sizeof(float)));
  }
  std::nth_element(runs.begin(), runs.begin() + 3, runs.end());
  return runs[3];
}

CollectiveRules shape_rules(const Communicator& comm, Collective collective,
                            std::vector<SizeRule> sizes) {
  return {comm.backend(), collective, comm.size(), comm.host_layout().hosts(), std::move(sizes)};
}

// Measures `comm`'s backend and puts its rules and fitted constants into `file`.
void tune(Communicator& comm, const Settings& settings, double gamma, TuningFile& file) {
  const Backend backend = comm.backend();
  std::vector<Measurement> own, native;
  for (const std::string& name : settings.collectives) {
    const Collective collective = parse_collective(name);
    std::vector<Measurement> points;
    for (std::size_t bytes = settings.min_bytes; bytes <= settings.max_bytes; bytes *= 4) {
      // What automatic would run here before this file: marked, so that a sweep also says how
      // the choice it had fares (scripts/bench_shaped_links).
      const Algorithm automatic = comm.choose(collective, bytes);
      for (const Measurement& m : measure_point(comm, collective, bytes, settings)) {
        points.push_back(m);
        if (comm.rank() == 0)
          std::printf("%-4s %-15s %10zu B  %-17s %12.1f us%s\n", name_of(backend).data(),
                      name.c_str(), m.bytes, name_of(m.algorithm).data(), m.us,
                      m.algorithm == automatic ? "  (automatic)" : "");
      }
      if (collective == Collective::kBarrier) break;
    }
    std::fflush(stdout);
    std::erase_if(file.rules, [&](const CollectiveRules& r) {
      return r.backend == backend && r.collective == collective && r.ranks == comm.size() &&
             r.hosts == comm.host_layout().hosts();
    });
    file.rules.push_back(shape_rules(comm, collective, rules_from(points)));
    for (const Measurement& m : points) {
      if (m.algorithm == Algorithm::kHierarchical) continue;  // its own formula, over hosts
      (m.algorithm == Algorithm::kNative ? native : own).push_back(m);
    }
  }
  CostModel model = default_cost_model(backend);
  model.point_to_point.gamma_us_per_byte = gamma;
  model.native.gamma_us_per_byte = gamma;
  fit(model, &CostModel::point_to_point, own, comm.size());
  fit(model, &CostModel::native, native, comm.size());
  // On one host the links the algorithms used are the links inside a host.
  if (comm.host_layout().hosts() == 1) model.same_host = model.point_to_point;
  file.cost_models[backend] = model;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Measures coltrain's collectives on this job's ranks and writes a tuning file "
      "for COLTRAIN_TUNING_FILE. Launch it like the jobs it tunes (mpiexec, srun, "
      "torchrun-style variables)."};
  Settings settings;
  app.add_option("--out", settings.out, "the tuning file (rules of other job shapes it has stay)")
      ->required();
  app.add_option("--min-bytes", settings.min_bytes, "smallest size (suffixes K, M: x1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber);
  app.add_option("--max-bytes", settings.max_bytes, "largest size, reached in steps of 4")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber);
  app.add_option("--rounds", settings.rounds, "rounds per point; the median counts")
      ->check(CLI::Range(1, 101));
  app.add_option("--collectives", settings.collectives, "collectives to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"allreduce", "broadcast", "allgather", "reduce_scatter", "reduce",
                             "alltoall", "barrier"}));
  CLI11_PARSE(app, argc, argv);
  try {
    // The file first: one that cannot be read or is not a tuning file stops the job before it
    // measures anything, and is left as it is.
    TuningFile file;
    if (std::filesystem::exists(settings.out)) file = load_tuning_file(settings.out);
    const double gamma = measure_gamma();
    Communicator first = Communicator::from_env();
    std::vector<Communicator> comms;
    comms.push_back(std::move(first));
#if COLTRAIN_WITH_MPI
    if (comms.front().backend() == Backend::kMpi) comms.push_back(tcp_over_mpi(MPI_COMM_WORLD));
#endif
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    for (Communicator& comm : comms) tune(comm, settings, gamma, file);
    coltrain::Json run = coltrain::Json::object({{"date", coltrain::utc_now()},
                                                 {"host_of_rank_0", std::string(host)},
                                                 {"ranks", comms.front().size()},
                                                 {"hosts", comms.front().host_layout().hosts()},
                                                 {"coltrain", COLTRAIN_VERSION_STRING},
                                                 {"max_bytes", settings.max_bytes}});
    // The runs so far (an earlier file's record is kept) and this one.
    coltrain::Json history =
        file.measured.empty() ? coltrain::Json::array() : coltrain::Json::parse(file.measured);
    if (!history.is_array()) history = coltrain::Json::array({history});
    history.push_back(run);
    file.measured = history.dump();
    if (comms.front().rank() == 0) {
      save_tuning_file(settings.out, file);
      std::printf("wrote %s: %zu rules, cost models for %zu backends\n", settings.out.c_str(),
                  file.rules.size(), file.cost_models.size());
    }
    comms.front().barrier();
    return 0;
  } catch (const coltrain::Error& e) {
    std::fprintf(stderr, "coltrain_tune: %s\n", e.what());
    return 1;
  }
}
