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
#include <coltrain/core/host_memory.hpp>
#include <coltrain/core/json.hpp>
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

// Floats in coltrain's host memory: kAsTensors on huge pages from 2 MiB, as coltrain's tensors are
// (single copy between ranks of a host goes only there by default); kHuge rounds a smaller array
// up to 2 MiB to put it there too; kSmall on 4 KiB pages, as most other programs' memory is.
enum class Pages { kAsTensors, kHuge, kSmall };
class HostFloats {
 public:
  HostFloats(std::size_t count, float value, Pages pages = Pages::kAsTensors)
      : data_(static_cast<float*>(allocate(count * sizeof(float), pages))), count_(count) {
    std::fill(data_, data_ + count, value);
  }
  ~HostFloats() { coltrain::free_host_memory(data_); }
  HostFloats(const HostFloats&) = delete;
  HostFloats& operator=(const HostFloats&) = delete;
  std::span<float> first(std::size_t count) const { return {data_, count}; }
  std::size_t size() const { return count_; }

 private:
  static void* allocate(std::size_t bytes, Pages pages) {
    if (pages == Pages::kAsTensors) return coltrain::allocate_uninitialized_host_memory(bytes);
    if (pages == Pages::kSmall) return coltrain::allocate_uninitialized_host_memory(bytes, false);
    return coltrain::allocate_uninitialized_host_memory(std::max(bytes, coltrain::kHugePageBytes),
                                                        true);
  }

  float* data_;
  std::size_t count_;
};

// ", single copy for exchanges of 92681 B and more (huge pages), ..." for the closing line.
std::string single_copy_text(const TuningFile& file) {
  auto text = [](const CallSizeRange& range) -> std::string {
    if (range.empty()) return "never";
    if (range.below == CallSizeRange::kUnbounded) return std::to_string(range.from) + " B and more";
    return std::to_string(range.from) + " B to " + std::to_string(range.below) + " B";
  };
  std::string out;
  if (file.single_copy_exchanges)
    out += ", single copy for exchanges: " + text(*file.single_copy_exchanges) + " (huge pages)";
  if (file.single_copy_exchanges_on_small_pages)
    out += ", " + text(*file.single_copy_exchanges_on_small_pages) + " (4 KiB pages)";
  return out;
}

// Elements of a collective of `bytes` bytes of floats (the collective's whole array, as the cost
// model counts it): a multiple of the ranks where each rank gets a share.
std::size_t caller_count(Collective collective, std::size_t bytes, std::size_t p) {
  std::size_t count = std::max<std::size_t>(1, bytes / sizeof(float));
  if (collective == Collective::kAllgather || collective == Collective::kReduceScatter ||
      collective == Collective::kAlltoall)
    count = std::max(p, count / p * p);
  return count;
}

// One collective call on `comm`, of `bytes` bytes of floats (the collective's whole array, as the
// cost model counts it: the allreduce vector, the gathered output, one rank's alltoall input).
class Caller {
 public:
  Caller(Communicator& comm, Collective collective, std::size_t bytes)
      : comm_(comm),
        collective_(collective),
        input_(caller_count(collective, bytes, static_cast<std::size_t>(comm.size())), 1.0f),
        output_(input_.size(), 0.0f) {}
  void operator()(Algorithm a) {
    const auto p = static_cast<std::size_t>(comm_.size());
    std::span<const float> in = input_.first(input_.size());
    std::span<float> out = output_.first(output_.size());
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
  HostFloats input_, output_;
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

// The median round of each of `ways` ways of making a call (µs per call, the slowest rank's):
// each warmed up and its round sized to about settings.seconds_per_point, then settings.rounds
// rounds that alternate them. `call(w)` makes one call the w-th way; `prepare(w)`, where given,
// sets that way up before its calls (untimed).
std::vector<double> alternating_medians(
    Communicator& comm, std::size_t ways, const Settings& settings,
    const std::function<void(std::size_t)>& call,
    const std::function<void(std::size_t)>& prepare = [](std::size_t) {}) {
  std::vector<int> calls(ways);
  for (std::size_t w = 0; w < ways; ++w) {  // warm up, and size each round
    prepare(w);
    call(w);
    comm.barrier(Algorithm::kHalvingDoubling);
    coltrain::Stopwatch once;
    call(w);
    const double us = slowest(comm, once.microseconds());
    calls[w] = static_cast<int>(
        std::clamp(settings.seconds_per_point * 1e6 / std::max(us, 0.5), 1.0, 10000.0));
  }
  std::vector<std::vector<double>> rounds(ways);
  for (int round = 0; round < settings.rounds; ++round) {
    for (std::size_t w = 0; w < ways; ++w) {
      prepare(w);
      comm.barrier(Algorithm::kHalvingDoubling);
      coltrain::Stopwatch watch;
      for (int c = 0; c < calls[w]; ++c) call(w);
      rounds[w].push_back(slowest(comm, watch.microseconds() / calls[w]));
    }
  }
  std::vector<double> medians;
  for (std::vector<double>& r : rounds) {
    std::nth_element(r.begin(), r.begin() + static_cast<long>(r.size() / 2), r.end());
    medians.push_back(r[r.size() / 2]);
  }
  return medians;
}

// Every algorithm of `collective` at `bytes`, in rounds that alternate them.
std::vector<Measurement> measure_point(Communicator& comm, Collective collective, std::size_t bytes,
                                       const Settings& settings) {
  Caller call(comm, collective, bytes);
  const std::vector<Algorithm> algorithms = candidates(comm.backend(), collective);
  const std::vector<double> us = alternating_medians(comm, algorithms.size(), settings,
                                                     [&](std::size_t i) { call(algorithms[i]); });
  std::vector<Measurement> out;
  for (std::size_t i = 0; i < algorithms.size(); ++i)
    out.push_back({collective, algorithms[i], call.bytes(), us[i]});
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

// The sizes where single copy pays, from one page kind's times: the run of consecutive sizes
// over which it gained most in all (the sum of log(rings / single copy), at least 5%), its ends
// halfway (geometrically) to the sizes outside it; open above where it reaches the largest size.
CallSizeRange single_copy_range(const std::vector<std::size_t>& sizes,
                                const std::vector<double>& single_copy_us,
                                const std::vector<double>& rings_us) {
  double best = std::log(1.05), sum = 0;
  std::size_t start = 0, best_first = 0, best_last = 0;
  bool found = false;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    if (sum <= 0) {
      sum = 0;
      start = s;
    }
    sum += std::log(rings_us[s] / single_copy_us[s]);
    if (sum > best) {
      best = sum;
      best_first = start;
      best_last = s;
      found = true;
    }
  }
  if (!found) return kNoCallSizes;
  auto between = [&](std::size_t s) {
    return static_cast<std::size_t>(
        std::sqrt(static_cast<double>(sizes[s]) * static_cast<double>(sizes[s + 1])));
  };
  CallSizeRange range;
  range.from = best_first == 0 ? 0 : between(best_first - 1);
  if (best_last + 1 < sizes.size()) range.below = between(best_last);
  return range;
}

// The allreduce sizes where single copy beat the rings between the ranks of a host, on huge pages
// and on 4 KiB pages, measured within each host: ring allreduces on prefixes of one buffer of each
// kind (as a trainer's gradient buckets are views of one), the four ways alternating, each size's
// median round, the slowest rank of any host. Unset where they would mean nothing (printed: no two
// ranks of a host can use single copy, ...); the 4 KiB-page one also where the kernel puts all
// memory on huge pages.
struct SingleCopyRanges {
  std::optional<CallSizeRange> on_huge_pages, on_small_pages;
};
SingleCopyRanges tune_single_copy(Communicator& comm, const Settings& settings) {
  if (comm.backend() != Backend::kTcp) return {};
  const HostLayout& layout = comm.host_layout();
  const std::vector<int>& neighbours = layout.ranks_on(layout.host_of(comm.rank()));
  int measures = neighbours.size() > 1 ? 1 : 0;
  for (int peer : neighbours)
    if (peer != comm.rank() && !comm.single_copy_with(peer)) measures = 0;
  std::vector<std::size_t> sizes;
  for (std::size_t bytes = std::size_t{64} << 10; bytes <= settings.max_bytes; bytes *= 2)
    sizes.push_back(bytes);
  int any = measures;
  comm.allreduce(std::span(&any, 1), ReduceOp::kMax, Algorithm::kRing);
  const char* why_not = nullptr;
  if (any == 0)
    why_not =
        "no two ranks of a host reach each other by single copy (COLTRAIN_SHM=0, "
        "COLTRAIN_SHM_SINGLE_COPY=0, one rank per host, or a host that refuses "
        "process_vm_readv)";
  else if (!comm.options().single_copy_where_it_pays)
    why_not = "COLTRAIN_SHM_SINGLE_COPY=always sends every large piece by single copy";
  else if (!coltrain::huge_pages_wanted())
    why_not = "COLTRAIN_HUGE_PAGES=0";
  else if (sizes.size() < 2)
    why_not = "--max-bytes is below 128 KiB";
  if (why_not != nullptr) {
    if (comm.rank() == 0) std::printf("tcp  single copy: not measured: %s\n", why_not);
    return {};
  }

  std::optional<Communicator> split;
  if (layout.hosts() > 1) split = comm.split(layout.host_of(comm.rank()), comm.rank());
  Communicator& host = split ? *split : comm;
  // A host measures only if every rank of it can: its ranks call the same collectives.
  int host_measures = measures;
  host.allreduce(std::span(&host_measures, 1), ReduceOp::kMin, Algorithm::kRing);
  TuningFile by_single_copy, by_rings;
  by_single_copy.single_copy_exchanges = CallSizeRange{};
  by_single_copy.single_copy_exchanges_on_small_pages = CallSizeRange{};
  by_rings.single_copy_exchanges = kNoCallSizes;
  by_rings.single_copy_exchanges_on_small_pages = kNoCallSizes;
  const std::size_t count = settings.max_bytes / sizeof(float);
  const HostFloats huge_input(count, 1.0f, Pages::kHuge), huge_output(count, 0.0f, Pages::kHuge);
  const HostFloats small_input(count, 1.0f, Pages::kSmall);
  const HostFloats small_output(count, 0.0f, Pages::kSmall);
  // The ways: {huge pages, 4 KiB pages} x {single copy, rings}.
  struct Way {
    const HostFloats* input;
    const HostFloats* output;
    const TuningFile* tuning;
  };
  const std::array<Way, 4> ways = {Way{&huge_input, &huge_output, &by_single_copy},
                                   Way{&huge_input, &huge_output, &by_rings},
                                   Way{&small_input, &small_output, &by_single_copy},
                                   Way{&small_input, &small_output, &by_rings}};
  // us[w][s]: zeros from hosts that measured nothing.
  std::vector<double> us(ways.size() * sizes.size(), 0.0);
  for (std::size_t s = 0; s < sizes.size() && host_measures; ++s) {
    const std::size_t n = sizes[s] / sizeof(float);
    const std::vector<double> medians = alternating_medians(
        host, ways.size(), settings,
        [&](std::size_t w) {
          host.allreduce(std::span<const float>(ways[w].input->first(n)), ways[w].output->first(n),
                         ReduceOp::kSum, Algorithm::kRing);
        },
        [&](std::size_t w) { host.use_tuning(*ways[w].tuning); });
    for (std::size_t w = 0; w < ways.size(); ++w) us[w * sizes.size() + s] = medians[w];
  }
  comm.allreduce(std::span(us), ReduceOp::kMax, Algorithm::kRing);
  int measured = host_measures;
  comm.allreduce(std::span(&measured, 1), ReduceOp::kMax, Algorithm::kRing);
  if (measured == 0) {
    if (comm.rank() == 0)
      std::printf("tcp  single copy: not measured: no host whose every rank has it\n");
    return {};
  }
  auto series = [&](std::size_t w) {
    return std::vector<double>(us.begin() + static_cast<long>(w * sizes.size()),
                               us.begin() + static_cast<long>((w + 1) * sizes.size()));
  };
  if (comm.rank() == 0) {
    for (std::size_t s = 0; s < sizes.size(); ++s)
      std::printf(
          "tcp  single copy     %10zu B  huge pages: single copy %9.1f us, rings %9.1f us;"
          "  4 KiB pages: %9.1f us, %9.1f us\n",
          sizes[s], us[s], us[sizes.size() + s], us[2 * sizes.size() + s],
          us[3 * sizes.size() + s]);
    std::fflush(stdout);
  }
  SingleCopyRanges out;
  out.on_huge_pages = single_copy_range(sizes, series(0), series(1));
  if (!coltrain::detail::transparent_huge_pages_always())
    out.on_small_pages = single_copy_range(sizes, series(2), series(3));
  return out;
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
    for (Communicator& comm : comms) {
      // The ranges first: the algorithms' rules are measured with them in force.
      const SingleCopyRanges ranges = tune_single_copy(comm, settings);
      if (ranges.on_huge_pages) {
        file.single_copy_exchanges = ranges.on_huge_pages;
        file.single_copy_exchanges_on_small_pages = ranges.on_small_pages;
        // What the communicator had (COLTRAIN_TUNING_FILE's rules, or none) and the ranges.
        TuningFile in_force = comm.options().tuning_file.empty()
                                  ? TuningFile{}
                                  : load_tuning_file(comm.options().tuning_file);
        in_force.single_copy_exchanges = ranges.on_huge_pages;
        in_force.single_copy_exchanges_on_small_pages = ranges.on_small_pages;
        comm.use_tuning(in_force);
      }
      tune(comm, settings, gamma, file);
    }
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
      std::printf("wrote %s: %zu rules, cost models for %zu backends%s\n", settings.out.c_str(),
                  file.rules.size(), file.cost_models.size(), single_copy_text(file).c_str());
    }
    comms.front().barrier();
    return 0;
  } catch (const coltrain::Error& e) {
    std::fprintf(stderr, "coltrain_tune: %s\n", e.what());
    return 1;
  }
}
