#pragma once
// allreduce_bench's command line: what to measure (collective, backends, algorithms, sizes, dtype,
// op, memory) and how (iterations, warm-up, latency, checks), and where to write the results.

#include <coltrain/comm/device/staged_collectives.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <CLI/CLI.hpp>

#include <cstddef>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::bench {

using coltrain::DataType;
using coltrain::comm::Algorithm;
using coltrain::comm::Collective;
using coltrain::comm::Communicator;
using coltrain::comm::ReduceOp;

inline constexpr const char* kBackendNames[] = {"mpi", "tcp", "nccl", "gloo"};
inline constexpr const char* kAlgorithmNames[] = {
    "native", "ring",         "tree",       "halving_doubling", "pairwise",
    "bruck",  "hierarchical", "rank_order", "automatic"};
inline constexpr const char* kCsvHeader =
    "collective,backend,algo,ranks,bytes,count,dtype,op,time_us,p50_us,p99_us,algbw_gbs,busbw_gbs,"
    "wrong";

enum class MemoryKind { kHost, kPinned, kDevice };

struct Options {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{32} << 20;
  std::size_t factor = 2;
  int iterations = 20;
  int warmup = 5;
  int check = 1;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Collective collective = Collective::kAllreduce;
  std::vector<std::string> backends{"mpi", "tcp"};
  std::vector<std::string> algorithms{std::begin(kAlgorithmNames), std::end(kAlgorithmNames)};
  MemoryKind memory = MemoryKind::kHost;
  coltrain::comm::StagingOptions staging;  // device buffers on the mpi and tcp backends
  bool latency = false;
  bool in_place = false;
  coltrain::comm::WireCompression compression = coltrain::comm::WireCompression::kNone;
  bool progress = false;
  int root = 0;
  std::string csv_path;
  std::string json_path;
  std::string command;  // as typed, for the JSON file
};

// A CLI11 check that accepts what one of coltrain's parse functions accepts, with its message.
template <class Parse>
CLI::Validator accepted_by(Parse parse, std::string name) {
  return CLI::Validator(
      [parse](std::string& text) -> std::string {
        try {
          parse(text);
          return {};
        } catch (const coltrain::Error& e) {
          return e.message();
        }
      },
      std::move(name));
}

// Pinned and device memory come from CUDA.
inline CLI::Validator memory_available() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "host" || coltrain::BuildConfig::kWithCuda) return {};
        return "--mem " + text + " needs a build with CUDA; this one has none (use --mem host)";
      },
      "");
}

// The size sweep and check options both benchmarks take, nccl-tests' letters: -b, -e, -f, -n, -w,
// -c. `iterations_help` says what -n counts in the benchmark at hand.
struct SweepOptions {
  std::size_t& min_bytes;
  std::size_t& max_bytes;
  std::size_t& factor;
  int& iterations;
  int& warmup;
  int& check;
};
inline void add_sweep_options(CLI::App& app, const SweepOptions& sweep,
                              const char* iterations_help) {
  app.add_option("-b,--minbytes", sweep.min_bytes, "smallest size (suffixes K, M, G: x1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-e,--maxbytes", sweep.max_bytes, "largest size (suffixes K, M, G: x1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-f,--stepfactor", sweep.factor, "multiply the size by this at each step")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("-n,--iters", sweep.iterations, iterations_help)
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", sweep.warmup, "untimed operations first")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  app.add_option("-c,--check", sweep.check, "check every element after the timed runs (0/1)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
}

// Parses the command line into `options`; CLI11 throws its ParseError for bad or missing values.
inline void parse_options(CLI::App& app, Options& options, int argc, char** argv) {
  std::string dtype = "f32";
  std::string op = "sum";
  std::string collective = "allreduce";
  std::string memory = "host";
  add_sweep_options(app,
                    {options.min_bytes, options.max_bytes, options.factor, options.iterations,
                     options.warmup, options.check},
                    "timed operations per size");
  app.add_option("-d,--datatype", dtype,
                 "element type: f32, f64, f16, bf16, i32, i64 (or float32, double...)")
      ->check(accepted_by(
          [](const std::string& text) {
            if (coltrain::parse_data_type(text) == DataType::kUInt8) {
              throw coltrain::InvalidArgument(
                  "u8 is not reducible; use f32, f64, f16, bf16, i32 or i64");
            }
          },
          "DTYPE"))
      ->capture_default_str();
  app.add_option("-o,--op", op, "reduction: sum, prod, min, max, avg")
      ->check(accepted_by(coltrain::comm::parse_reduce_op, "OP"))
      ->capture_default_str();
  app.add_option("--collective", collective, "the collective to measure")
      ->check(CLI::IsMember(
          {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall"}))
      ->capture_default_str();
  app.add_option("--backend", options.backends, "backends to compare, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember(
          std::vector<std::string>(std::begin(kBackendNames), std::end(kBackendNames))))
      ->capture_default_str();
  app.add_option("--algo", options.algorithms, "algorithms to run on each backend, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember(
          std::vector<std::string>(std::begin(kAlgorithmNames), std::end(kAlgorithmNames))))
      ->capture_default_str();
  app.add_option("--mem", memory, "where the buffers live: host, pinned or device")
      ->check(CLI::IsMember({"host", "pinned", "device"}) & memory_available())
      ->capture_default_str();
  app.add_option("--staging-chunk", options.staging.chunk_bytes,
                 "largest staging chunk of device buffers on mpi and tcp (suffixes K, M, G: x1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--latency", options.latency,
               "time each operation on its own and report the median and 99th percentile");
  app.add_flag("--inplace", options.in_place, "operate in place instead of out of place");
  std::string compression = "none";
  app.add_option("--compression", compression,
                 "f32 allreduce on the mpi and tcp backends, automatic algorithm: send as bf16 or "
                 "fp16 (sizes and bandwidths count the f32 data)")
      ->check(accepted_by(coltrain::comm::parse_wire_compression, "FORMAT"))
      ->capture_default_str();
  app.add_flag("--progress", options.progress,
               "show the progress line on stderr even when it is a pipe (mpiexec makes it one)");
  app.add_option("-r,--root", options.root, "root rank of broadcast and reduce")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  app.add_option("--csv", options.csv_path, "write the results to this CSV file");
  app.add_option("--json", options.json_path, "write the results to this JSON file");

  app.parse(argc, argv);
  if (options.min_bytes > options.max_bytes) {
    throw CLI::ValidationError(
        "-b/-e", "the smallest size (-b " + std::to_string(options.min_bytes) +
                     ") exceeds the largest (-e " + std::to_string(options.max_bytes) + ")");
  }
  options.dtype = coltrain::parse_data_type(dtype);
  options.op = coltrain::comm::parse_reduce_op(op);
  options.collective = coltrain::comm::parse_collective(collective);
  options.compression = coltrain::comm::parse_wire_compression(compression);
  options.memory = memory == "host"     ? MemoryKind::kHost
                   : memory == "pinned" ? MemoryKind::kPinned
                                        : MemoryKind::kDevice;
  for (int i = 0; i < argc; ++i) options.command += std::string(i ? " " : "") + argv[i];
}

inline const char* name_of(MemoryKind memory) {
  switch (memory) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kPinned:
      return "pinned";
    case MemoryKind::kDevice:
      return "device";
  }
  return "invalid";
}

}  // namespace coltrain::bench
