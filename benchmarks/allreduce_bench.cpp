// Collective microbenchmark in the style of nccl-tests: every backend (MPI, coltrain's TCP, NCCL,
// Gloo) and every algorithm measured by one tool with one method, so that the comparison is fair.
//
//   mpiexec -n 2 build/benchmarks/allreduce_bench --backend mpi,tcp,gloo
//       --algo native,ring,tree,halving_doubling,automatic -b 8 -e 128M -f 4 --csv out.csv
//
// Method, per backend, algorithm and size: w warm-up operations, an MPI barrier, then n operations
// back to back; time = elapsed / n, the maximum over ranks. --latency times each operation on its
// own, after a barrier, and adds the median and 99th percentile (the maximum over ranks of each).
// algbw = size / time and busbw = algbw x (allreduce 2(p-1)/p, allgather and reduce_scatter
// (p-1)/p, broadcast and reduce 1) with GB = 1e9 and size the full array, as nccl-tests defines
// them. Inputs are small integers, so every summation order gives the same bits; after the timed
// runs one more operation on fresh inputs is compared element by element, and #wrong sums bad
// elements over ranks. The exit status is 1 when any element is wrong, 2 on an error.
// With --mem device, the mpi and tcp backends run coltrain's collectives through
// Communicator's staging (pinned host memory, pipelined chunks of at most --staging-chunk).
#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/staged_collectives.hpp>
#include <coltrain/comm/tcp_over_mpi.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>
#include <coltrain/core/terminal.hpp>
#include <coltrain/core/timer.hpp>
#include <coltrain/tensor/storage.hpp>

#include <mpi.h>
#include <CLI/CLI.hpp>

#if !COLTRAIN_WITH_MPI
#error "allreduce_bench needs MPI: it launches, synchronises and times its ranks with MPI"
#endif

// Gloo is optional; CMake says whether it links it, a hand-made build finds it by its header.
#ifndef COLTRAIN_BENCH_WITH_GLOO
#if __has_include(<gloo/allreduce_ring_chunked.h>)
#define COLTRAIN_BENCH_WITH_GLOO 1
#else
#define COLTRAIN_BENCH_WITH_GLOO 0
#endif
#endif
#if COLTRAIN_BENCH_WITH_GLOO
#include "gloo_runner.hpp"
#endif
#if COLTRAIN_WITH_CUDA
#include "nccl_runner.hpp"
#endif

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using coltrain::DataType;
using coltrain::comm::Algorithm;
using coltrain::comm::Collective;
using coltrain::comm::Communicator;
using coltrain::comm::ReduceOp;

constexpr const char* kBackendNames[] = {"mpi", "tcp", "nccl", "gloo"};
constexpr const char* kAlgorithmNames[] = {"native",   "ring",  "tree",         "halving_doubling",
                                           "pairwise", "bruck", "hierarchical", "automatic"};
constexpr const char* kCsvHeader =
    "collective,backend,algo,ranks,bytes,count,dtype,op,time_us,p50_us,p99_us,algbw_gbs,busbw_gbs,"
    "wrong";

enum class MemoryKind { kHost, kPinned, kDevice };

// ---- options ----

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
CLI::Validator memory_available() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "host" || coltrain::BuildConfig::kWithCuda) return {};
        return "--mem " + text + " needs a build with CUDA; this one has none (use --mem host)";
      },
      "");
}

// Parses the command line into `options`; CLI11 throws its ParseError for bad or missing values.
void parse_options(CLI::App& app, Options& options, int argc, char** argv) {
  std::string dtype = "f32";
  std::string op = "sum";
  std::string collective = "allreduce";
  std::string memory = "host";
  app.add_option("-b,--minbytes", options.min_bytes, "smallest size (suffixes K, M, G: x1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-e,--maxbytes", options.max_bytes, "largest size (suffixes K, M, G: x1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-f,--stepfactor", options.factor, "multiply the size by this at each step")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("-n,--iters", options.iterations, "timed operations per size")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters", options.warmup, "untimed operations first")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  app.add_option("-c,--check", options.check, "check every element after the timed runs (0/1)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
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

const char* name_of(MemoryKind memory) {
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

// ---- the job ----

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the ranks on this node
  int local_size = 1;
};

World mpi_world() {
  World world;
  COLTRAIN_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world.rank));
  COLTRAIN_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world.size));
  MPI_Comm node = MPI_COMM_NULL;
  COLTRAIN_CHECK_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  COLTRAIN_CHECK_MPI(MPI_Comm_rank(node, &world.local_rank));
  COLTRAIN_CHECK_MPI(MPI_Comm_size(node, &world.local_size));
  COLTRAIN_CHECK_MPI(MPI_Comm_free(&node));
  return world;
}

void barrier() { COLTRAIN_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD)); }

#if COLTRAIN_WITH_CUDA
// Every rank learns whether any rank found the GPU unusable. Rank 0, which prints, gives its own
// reason where it has one.
std::optional<std::string> agree_unavailable(const std::optional<std::string>& local) {
  const int mine = local ? 1 : 0;
  int any = 0;
  COLTRAIN_CHECK_MPI(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (!any) return std::nullopt;
  return local ? *local : std::string("unavailable on another rank");
}
#endif

// ---- sizes ----

bool reduces(Collective collective) {
  return collective != Collective::kAllgather && collective != Collective::kBroadcast &&
         collective != Collective::kAlltoall;
}

bool per_rank_blocks(Collective collective) {
  return collective == Collective::kAllgather || collective == Collective::kReduceScatter ||
         collective == Collective::kAlltoall;
}

// One size of a sweep. Sizes count the full array, as nccl-tests does: the allgather output, the
// reduce_scatter input, each rank's alltoall input (p blocks).
struct Case {
  Collective collective;
  DataType dtype;
  ReduceOp op;
  int root;
  int ranks;
  int rank;
  std::size_t count;  // elements of the full array
  std::size_t block;  // elements per rank for allgather, reduce_scatter and alltoall; else count
  std::size_t bytes() const { return count * coltrain::size_of(dtype); }
};

// The sizes from -b to -e, stepping by -f, rounded down to whole elements (whole blocks of one per
// rank for allgather and reduce_scatter); sizes that round to nothing, or to the previous size, go.
std::vector<Case> sweep(const Options& options, const World& world) {
  std::vector<Case> cases;
  const std::size_t element = coltrain::size_of(options.dtype);
  const std::size_t ranks = per_rank_blocks(options.collective) ? world.size : 1;
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
    const std::size_t block = bytes / (element * ranks);
    if (block > 0 && (cases.empty() || cases.back().block != block)) {
      cases.push_back({options.collective, options.dtype, options.op, options.root, world.size,
                       world.rank, block * ranks, block});
    }
    if (bytes > options.max_bytes / options.factor) break;
    bytes *= options.factor;
  }
  return cases;
}

// ---- inputs and the expected results ----

template <class T>
constexpr bool kNarrowFloat =
    std::is_same_v<T, coltrain::half> || std::is_same_v<T, coltrain::bfloat16>;

// The type f16 and bf16 are reduced in, and the average divided in: the communicator's own choice.
template <class T>
using Accumulator = std::conditional_t<kNarrowFloat<T>, float, T>;

// Integers up to this are exact in the dtype, so sums below it are exact in any order.
std::int64_t exact_integers(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
      return 2048;
    case DataType::kBFloat16:
      return 256;
    case DataType::kFloat32:
      return std::int64_t{1} << 24;
    default:
      return std::int64_t{1} << 30;
  }
}

// A fixed scramble of (rank, index): neighbouring elements and ranks get unrelated values, so a
// misplaced block or a missing rank shows in the check.
std::uint64_t scramble(int rank, std::size_t index) {
  std::uint64_t x = static_cast<std::uint64_t>(index) * 0x9E3779B97F4A7C15ull +
                    static_cast<std::uint64_t>(rank) * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 32);
}

// The small integers each rank contributes, chosen per op so that the result is exact in the dtype
// whatever the order of the reduction (nccl-tests' principle):
// - sum, avg: 1..k, with k * ranks within the dtype's exact integers (bf16 has 8 bits);
// - prod: 2, -1 or 1, 2 from at most kProdRanks ranks, so products are exact powers of two;
// - min, max, and the data of allgather and broadcast: -100..100.
class Inputs {
 public:
  static constexpr int kProdRanks = 15;  // 2^15 stays below f16's largest finite value

  explicit Inputs(const Case& c) : collective_(c.collective), op_(c.op), ranks_(c.ranks) {
    const std::int64_t limit = exact_integers(c.dtype);
    sum_ranks_ = static_cast<int>(std::min<std::int64_t>(ranks_, limit));
    sum_range_ = std::clamp<std::int64_t>(limit / ranks_, 1, 4);
  }

  // What `rank` holds at element `index` of its input.
  std::int64_t value(int rank, std::size_t index) const {
    const std::uint64_t x = scramble(rank, index);
    if (!reduces(collective_)) return static_cast<std::int64_t>(x % 201) - 100;
    switch (op_) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return rank < sum_ranks_ ? 1 + static_cast<std::int64_t>(x % sum_range_) : 0;
      case ReduceOp::kProd: {
        if (rank >= kProdRanks) return 1;
        constexpr std::int64_t kFactors[] = {2, -1, 1, 1};
        return kFactors[x % 4];
      }
      case ReduceOp::kMin:
      case ReduceOp::kMax:
        return static_cast<std::int64_t>(x % 201) - 100;
    }
    return 0;
  }

  // The reduction of every rank's element `index` (for avg: the sum), exactly.
  std::int64_t reduced(std::size_t index) const {
    std::int64_t result = value(0, index);
    for (int rank = 1; rank < ranks_; ++rank) {
      const std::int64_t x = value(rank, index);
      switch (op_) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          result += x;
          break;
        case ReduceOp::kProd:
          result *= x;
          break;
        case ReduceOp::kMin:
          result = std::min(result, x);
          break;
        case ReduceOp::kMax:
          result = std::max(result, x);
          break;
      }
    }
    return result;
  }

 private:
  Collective collective_;
  ReduceOp op_;
  int ranks_;
  int sum_ranks_;
  std::int64_t sum_range_;
};

template <class T>
T element(std::int64_t value) {
  if constexpr (kNarrowFloat<T>) {
    return T(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

// The expected result from the exact reduction: avg divides once, in the accumulator type.
template <class T>
T expected_reduction(std::int64_t reduced, ReduceOp op, int ranks) {
  if (op != ReduceOp::kAvg) return element<T>(reduced);
  using A = Accumulator<T>;
  const A average = static_cast<A>(reduced) / static_cast<A>(ranks);
  if constexpr (kNarrowFloat<T>) {
    return T(average);
  } else {
    return average;
  }
}

// Exact comparison, bit for bit.
template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// ---- buffers ----

// `count` elements of T in the memory --mem names, with a host view for filling and checking: the
// buffer itself in host and pinned memory, a staging copy for device memory.
template <class T>
class Buffer {
 public:
  Buffer(MemoryKind memory, std::size_t count) : count_(count) {
    switch (memory) {
      case MemoryKind::kHost:
        staging_ = coltrain::tensor::Storage<T, coltrain::tensor::Cpu>(count);
        data_ = host_ = staging_.data();
        return;
#if COLTRAIN_WITH_CUDA
      case MemoryKind::kPinned:
        cuda_.emplace(coltrain::bench::CudaMemory::pinned(count * sizeof(T)));
        data_ = host_ = static_cast<T*>(cuda_->get());
        return;
      case MemoryKind::kDevice:
        cuda_.emplace(coltrain::bench::CudaMemory::device(count * sizeof(T)));
        staging_ = coltrain::tensor::Storage<T, coltrain::tensor::Cpu>(count);
        data_ = static_cast<T*>(cuda_->get());
        host_ = staging_.data();
        return;
#else
      default:
        throw coltrain::ConfigError(std::string("--mem ") + name_of(memory) +
                                    " needs a build with CUDA");
#endif
    }
  }

  T* data() { return data_; }
  std::span<T> host() { return {host_, count_}; }
  void upload() {
    if (data_ != host_) copy_in();
  }
  void download() {
    if (data_ != host_) copy_out();
  }

 private:
#if COLTRAIN_WITH_CUDA
  void copy_in() { cuda_->copy_from_host(host_, count_ * sizeof(T)); }
  void copy_out() { cuda_->copy_to_host(host_, count_ * sizeof(T)); }
  std::optional<coltrain::bench::CudaMemory> cuda_;
#else
  void copy_in() {}
  void copy_out() {}
#endif
  std::size_t count_;
  coltrain::tensor::Storage<T, coltrain::tensor::Cpu> staging_;  // as tensors are: huge pages
  T* data_ = nullptr;
  T* host_ = nullptr;
};

// The buffers of one case. Out of place the input and output are separate buffers; in place they
// are one, with the input (allgather) or the output (reduce_scatter) this rank's block of it.
template <class T>
class Workspace {
 public:
  Workspace(MemoryKind memory, const Case& c, bool in_place) : case_(c) {
    const std::size_t mine = static_cast<std::size_t>(c.rank) * c.block;
    in_count_ = c.collective == Collective::kAllgather ? c.block : c.count;
    out_count_ = c.collective == Collective::kReduceScatter ? c.block : c.count;
    if (in_place) {
      if (c.collective == Collective::kAllgather) in_offset_ = mine;
      if (c.collective == Collective::kReduceScatter) out_offset_ = mine;
      first_.emplace(memory, c.count);
    } else {
      first_.emplace(memory, in_count_);
      second_.emplace(memory, out_count_);
    }
  }

  T* input() { return first_->data() + in_offset_; }
  T* output() { return output_buffer().data() + out_offset_; }
  std::size_t input_count() const { return in_count_; }
  std::size_t output_count() const { return out_count_; }

  // Fresh inputs; the output poisoned with a value no result takes, so unwritten elements show.
  void fill(const Inputs& inputs) {
    const T poison = element<T>(-1000);
    std::span<T> out = output_buffer().host();
    std::fill(out.begin(), out.end(), poison);
    const bool has_input = case_.collective != Collective::kBroadcast || case_.rank == case_.root;
    if (has_input) {
      std::span<T> in = first_->host().subspan(in_offset_, in_count_);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = element<T>(inputs.value(case_.rank, i));
    }
    first_->upload();
    if (second_) second_->upload();
  }

  // Elements of this rank's output that differ from the expected result.
  std::int64_t count_wrong(const Inputs& inputs) {
    const Case& c = case_;
    if (c.collective == Collective::kReduce && c.rank != c.root) return 0;
    output_buffer().download();
    std::span<const T> out = output_buffer().host().subspan(out_offset_, out_count_);
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      T expected;
      switch (c.collective) {
        case Collective::kAllgather:
          expected = element<T>(inputs.value(static_cast<int>(i / c.block), i % c.block));
          break;
        case Collective::kBroadcast:
          expected = element<T>(inputs.value(c.root, i));
          break;
        case Collective::kAlltoall:  // block j came from rank j's block for this rank
          expected =
              element<T>(inputs.value(static_cast<int>(i / c.block),
                                      static_cast<std::size_t>(c.rank) * c.block + i % c.block));
          break;
        case Collective::kReduceScatter:
          expected = expected_reduction<T>(
              inputs.reduced(static_cast<std::size_t>(c.rank) * c.block + i), c.op, c.ranks);
          break;
        default:
          expected = expected_reduction<T>(inputs.reduced(i), c.op, c.ranks);
          break;
      }
      if (!same_bits(out[i], expected)) ++wrong;
    }
    return wrong;
  }

 private:
  Buffer<T>& output_buffer() { return second_ ? *second_ : *first_; }

  Case case_;
  std::size_t in_count_ = 0;
  std::size_t out_count_ = 0;
  std::size_t in_offset_ = 0;
  std::size_t out_offset_ = 0;
  std::optional<Buffer<T>> first_;
  std::optional<Buffer<T>> second_;
};

// ---- measuring ----

// One collective at one size, ready to run. launch() issues one operation; finish() waits until
// everything launched is done (a GPU stream); on the CPU backends launch() returns when it is done.
struct Prepared {
  std::function<void()> launch;
  std::function<void()> finish = [] {};
};

struct Timing {
  double mean_us = 0;
  std::optional<double> p50_us;
  std::optional<double> p99_us;
};

// The sample at quantile q of sorted samples, by the nearest-rank method.
double quantile(const std::vector<double>& sorted, double q) {
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

Timing measure(const Prepared& op, const Options& options) {
  for (int i = 0; i < options.warmup; ++i) op.launch();
  op.finish();
  barrier();
  double local[3] = {0, 0, 0};
  if (options.latency) {
    std::vector<double> samples(static_cast<std::size_t>(options.iterations));
    for (double& sample : samples) {
      barrier();
      coltrain::Stopwatch watch;
      op.launch();
      op.finish();
      sample = watch.microseconds();
    }
    double total = 0;
    for (double sample : samples) total += sample;
    local[0] = total / static_cast<double>(samples.size());
    std::sort(samples.begin(), samples.end());
    local[1] = quantile(samples, 0.50);
    local[2] = quantile(samples, 0.99);
  } else {
    coltrain::Stopwatch watch;
    for (int i = 0; i < options.iterations; ++i) op.launch();
    op.finish();
    local[0] = watch.microseconds() / options.iterations;
  }
  double slowest[3] = {0, 0, 0};
  COLTRAIN_CHECK_MPI(MPI_Allreduce(local, slowest, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  Timing timing{slowest[0], std::nullopt, std::nullopt};
  if (options.latency) {
    timing.p50_us = slowest[1];
    timing.p99_us = slowest[2];
  }
  return timing;
}

double bus_factor(Collective collective, int ranks) {
  const double p = ranks;
  switch (collective) {
    case Collective::kAllreduce:
      return 2 * (p - 1) / p;
    case Collective::kAllgather:
    case Collective::kReduceScatter:
    case Collective::kAlltoall:
      return (p - 1) / p;
    default:
      return 1;
  }
}

// ---- reporting ----

// One table: a backend and an algorithm as requested.
struct Series {
  std::string backend;
  std::string algorithm;
  bool in_place = false;
  std::string note;  // why the series departs from the options, if it does
};

struct Row {
  Series series;
  Case size;
  Timing timing;
  double algbw_gbs = 0;
  double busbw_gbs = 0;
  std::optional<std::int64_t> wrong;  // absent with -c 0
  std::string chosen;                 // what automatic ran
};

// One updating line on stderr while a sweep runs, on rank 0: on a terminal, or where --progress
// asks for it because a launcher pipes stderr (mpiexec does). stdout's lines clear it first. A
// launcher forwards stdout and stderr separately and may swap what arrives at once, so on a pipe
// the line pauses briefly at each switch, letting the table's lines through in order.
class Progress {
 public:
  enum class Mode { kOff, kTerminal, kPipe };

  explicit Progress(Mode mode) : mode_(mode) {}

  void show(const std::string& text) {
    if (mode_ == Mode::kOff) return;
    settle();
    std::fprintf(stderr, "\r%-*s", static_cast<int>(shown_), text.c_str());
    std::fflush(stderr);
    shown_ = std::max(shown_, text.size());
  }
  void clear() {
    if (mode_ == Mode::kOff || shown_ == 0) return;
    std::fprintf(stderr, "\r%*s\r", static_cast<int>(shown_), "");
    std::fflush(stderr);
    shown_ = 0;
    settle();
  }

 private:
  void settle() const {
    if (mode_ == Mode::kPipe) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  Mode mode_;
  std::size_t shown_ = 0;
};

std::string human_size(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%g %s", value, units[unit]);
  return text;
}

std::string op_name(const Case& c) {
  return reduces(c.collective) ? std::string(coltrain::comm::name_of(c.op)) : "none";
}

template <class... Args>
std::string formatted(const char* format, Args... args) {
  char text[256];
  std::snprintf(text, sizeof(text), format, args...);
  return text;
}

// The tables on stdout (rank 0), and the CSV and JSON files, rewritten after each series.
class Report {
 public:
  Report(const Options& options, const World& world)
      : options_(options), world_(world), progress_(progress_mode(options, world)) {}

  bool root() const { return world_.rank == 0; }
  Progress& progress() { return progress_; }

  // A line of its own for something not run; not an error.
  void skip(const std::string& what, const std::string& why) {
    if (!root()) return;
    progress_.clear();
    std::printf("# skipping %s: %s\n", what.c_str(), why.c_str());
    std::fflush(stdout);
  }

  void begin(const Series& series, bool automatic) {
    if (!root()) return;
    progress_.clear();
    const Collective collective = options_.collective;
    std::string what = std::string(coltrain::comm::name_of(collective)) + ", " +
                       std::to_string(world_.size) + " ranks, " +
                       std::string(coltrain::name_of(options_.dtype));
    if (reduces(collective)) what += " " + std::string(coltrain::comm::name_of(options_.op));
    if (collective == Collective::kBroadcast || collective == Collective::kReduce) {
      what += ", root " + std::to_string(options_.root);
    }
    std::printf("\n# %s / %s: %s, %s, %s memory, %d iterations after %d warm-up\n",
                series.backend.c_str(), series.algorithm.c_str(), what.c_str(),
                series.in_place ? "in place" : "out of place", name_of(options_.memory),
                options_.iterations, options_.warmup);
    if (!series.note.empty()) std::printf("# %s\n", series.note.c_str());
    std::string names =
        formatted("#%11s %12s %6s %6s %5s |%10s", "size", "count", "type", "redop", "root", "time");
    std::string units =
        formatted("#%11s %12s %6s %6s %5s |%10s", "(B)", "(elements)", "", "", "", "(us)");
    if (options_.latency) {
      names += formatted(" %10s %10s", "p50", "p99");
      units += formatted(" %10s %10s", "(us)", "(us)");
    }
    names += formatted(" %9s %9s %7s", "algbw", "busbw", "#wrong");
    units += formatted(" %9s %9s", "(GB/s)", "(GB/s)");
    if (automatic) names += "  algorithm";
    std::printf("%s\n%s\n", names.c_str(), units.c_str());
    std::fflush(stdout);
  }

  void add(Row row) {
    if (row.wrong) wrong_ += *row.wrong;
    if (!root()) return;
    progress_.clear();
    const Case& c = row.size;
    const int root_column =
        c.collective == Collective::kBroadcast || c.collective == Collective::kReduce ? c.root : -1;
    std::string latency;
    if (row.timing.p50_us) {
      latency = formatted(" %10.2f", *row.timing.p50_us) + formatted(" %10.2f", *row.timing.p99_us);
    }
    const std::string wrong = row.wrong ? std::to_string(*row.wrong) : "N/A";
    std::printf("%12zu %12zu %6s %6s %5d |%10.2f%s %9.3f %9.3f %7s%s%s\n", c.bytes(), c.count,
                std::string(coltrain::name_of(c.dtype)).c_str(), op_name(c).c_str(), root_column,
                row.timing.mean_us, latency.c_str(), row.algbw_gbs, row.busbw_gbs, wrong.c_str(),
                row.chosen.empty() ? "" : "  ", row.chosen.c_str());
    std::fflush(stdout);
    rows_.push_back(std::move(row));
  }

  // Rewrites the files with every row so far; an interrupted sweep keeps what it measured.
  void write_files() const {
    if (!root()) return;
    if (!options_.csv_path.empty()) {
      coltrain::write_file_atomically(options_.csv_path, csv(), "write the results CSV");
    }
    if (!options_.json_path.empty()) {
      coltrain::write_file_atomically(options_.json_path, json().dump(2) + "\n",
                                      "write the results JSON");
    }
  }

  std::int64_t wrong() const { return wrong_; }

 private:
  static Progress::Mode progress_mode(const Options& options, const World& world) {
    if (world.rank != 0) return Progress::Mode::kOff;
    if (coltrain::writes_to_terminal(STDERR_FILENO)) return Progress::Mode::kTerminal;
    return options.progress ? Progress::Mode::kPipe : Progress::Mode::kOff;
  }

  std::string csv() const {
    std::string text = std::string(kCsvHeader) + "\n";
    for (const Row& row : rows_) {
      const Case& c = row.size;
      const auto optional_us = [](const std::optional<double>& us) {
        return us ? formatted("%.3f", *us) : std::string();
      };
      text += std::string(coltrain::comm::name_of(c.collective)) + "," + row.series.backend + "," +
              row.series.algorithm + "," + std::to_string(c.ranks) + "," +
              std::to_string(c.bytes()) + "," + std::to_string(c.count) + "," +
              std::string(coltrain::name_of(c.dtype)) + "," + op_name(c) + "," +
              formatted("%.3f", row.timing.mean_us) + "," + optional_us(row.timing.p50_us) + "," +
              optional_us(row.timing.p99_us) + "," + formatted("%.6g", row.algbw_gbs) + "," +
              formatted("%.6g", row.busbw_gbs) + "," +
              (row.wrong ? std::to_string(*row.wrong) : std::string()) + "\n";
    }
    return text;
  }

  coltrain::Json json() const {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    coltrain::Json results = coltrain::Json::array();
    for (const Row& row : rows_) {
      const Case& c = row.size;
      coltrain::Json entry = coltrain::Json::object({
          {"collective", coltrain::comm::name_of(c.collective)},
          {"backend", row.series.backend},
          {"algo", row.series.algorithm},
          {"ranks", c.ranks},
          {"bytes", c.bytes()},
          {"count", c.count},
          {"dtype", coltrain::name_of(c.dtype)},
          {"op", op_name(c)},
          {"in_place", row.series.in_place},
          {"time_us", row.timing.mean_us},
          {"p50_us", nullptr},
          {"p99_us", nullptr},
          {"algbw_gbs", row.algbw_gbs},
          {"busbw_gbs", row.busbw_gbs},
          {"wrong", nullptr},
      });
      if (row.timing.p50_us) entry["p50_us"] = *row.timing.p50_us;
      if (row.timing.p99_us) entry["p99_us"] = *row.timing.p99_us;
      if (row.wrong) entry["wrong"] = *row.wrong;
      if (!row.chosen.empty()) entry["chosen"] = row.chosen;
      results.push_back(std::move(entry));
    }
    return coltrain::Json::object({
        {"command", options_.command},
        {"date", coltrain::utc_now()},
        {"host", host},
        {"coltrain_version", coltrain::BuildConfig::kVersion},
        {"ranks", world_.size},
        {"iterations", options_.iterations},
        {"warmup", options_.warmup},
        {"latency_mode", options_.latency},
        {"memory", name_of(options_.memory)},
        {"staging_chunk_bytes", options_.staging.chunk_bytes},
        {"checked", options_.check != 0},
        {"results", std::move(results)},
    });
  }

  const Options& options_;
  World world_;
  Progress progress_;
  std::vector<Row> rows_;
  std::int64_t wrong_ = 0;
};

// ---- the sweep, common to every backend ----

template <class T>
using Prepare = std::function<Prepared(Workspace<T>&, const Case&)>;

// Runs one series over every size: prepare, time, check, report.
template <class T>
void run_series(const Options& options, const World& world, const Series& series,
                const Prepare<T>& prepare, const std::function<std::string(const Case&)>& chosen,
                Report& report) {
  report.begin(series, static_cast<bool>(chosen));
  const std::vector<Case> cases = sweep(options, world);
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    report.progress().show("# " + series.backend + " / " + series.algorithm + ": " +
                           human_size(c.bytes()) + " (" + std::to_string(k + 1) + "/" +
                           std::to_string(cases.size()) + ")");
    const Inputs inputs(c);
    Workspace<T> workspace(options.memory, c, series.in_place);
    const Prepared op = prepare(workspace, c);
    workspace.fill(inputs);  // timing on real data, not on zeros
    Row row{series, c, measure(op, options), 0, 0, std::nullopt, {}};
    if (options.check) {
      workspace.fill(inputs);
      op.launch();
      op.finish();
      const std::int64_t local = workspace.count_wrong(inputs);
      std::int64_t total = 0;
      COLTRAIN_CHECK_MPI(MPI_Allreduce(&local, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
      row.wrong = total;
    }
    row.algbw_gbs = static_cast<double>(c.bytes()) / row.timing.mean_us / 1e3;
    row.busbw_gbs = row.algbw_gbs * bus_factor(c.collective, c.ranks);
    if (chosen) row.chosen = chosen(c);
    report.add(std::move(row));
  }
  report.progress().clear();
  report.write_files();
}

// Broadcast has a single buffer, so it always runs in place.
bool runs_in_place(const Options& options) {
  return options.in_place || options.collective == Collective::kBroadcast;
}

// ---- backend mpi and tcp: coltrain's communicator ----

// Why `algorithm` does not exist for this collective on this backend, or empty.
std::string coltrain_unsupported(Collective collective, Algorithm algorithm, bool mpi) {
  if (algorithm == Algorithm::kAutomatic) return {};
  if (algorithm == Algorithm::kNative && !mpi) {
    return "the TCP backend has no native collectives";
  }
  const auto supported = coltrain::comm::algorithms_for(collective);
  if (std::find(supported.begin(), supported.end(), algorithm) != supported.end()) return {};
  std::string names;
  for (Algorithm a : supported) {
    if (a == Algorithm::kNative && !mpi) continue;
    names += (names.empty() ? "" : ", ") + std::string(coltrain::comm::name_of(a));
  }
  return std::string(coltrain::comm::name_of(collective)) + " has no " +
         std::string(coltrain::comm::name_of(algorithm)) + " algorithm (it has " + names + ")";
}

// The bytes the communicator gives its cost model: the full array, f16 and bf16 reductions in f32.
std::size_t model_bytes(const Case& c) {
  const bool widened =
      reduces(c.collective) && (c.dtype == DataType::kFloat16 || c.dtype == DataType::kBFloat16);
  return widened ? c.count * sizeof(float) : c.bytes();
}

// With staging each chunk is a collective of its own, sized by the first (largest) chunk.
std::size_t staged_model_bytes(const Case& c, const coltrain::comm::StagingOptions& staging) {
  const std::size_t blocks = per_rank_blocks(c.collective) ? static_cast<std::size_t>(c.ranks) : 1;
  Case chunk = c;
  chunk.block = coltrain::comm::plan_chunks(c.block, coltrain::size_of(c.dtype), blocks, staging)
                    .chunk(0)
                    .size;
  chunk.count = chunk.block * blocks;
  return model_bytes(chunk);
}

// Host or device buffers alike: Communicator stages device ones on MPI and TCP.
template <class T>
Prepared coltrain_collective(Communicator& comm, Algorithm algorithm, Workspace<T>& workspace,
                             const Case& c) {
  const std::span<const T> in(workspace.input(), workspace.input_count());
  const std::span<T> out(workspace.output(), workspace.output_count());
  switch (c.collective) {
    case Collective::kAllreduce:
      return {[&comm, in, out, c, algorithm] { comm.allreduce(in, out, c.op, algorithm); }};
    case Collective::kBroadcast:
      return {[&comm, out, c, algorithm] { comm.broadcast(out, c.root, algorithm); }};
    case Collective::kAllgather:
      return {[&comm, in, out, algorithm] { comm.allgather(in, out, algorithm); }};
    case Collective::kReduceScatter:
      return {[&comm, in, out, c, algorithm] { comm.reduce_scatter(in, out, c.op, algorithm); }};
    case Collective::kReduce:
      return {[&comm, in, out, c, algorithm] { comm.reduce(in, out, c.root, c.op, algorithm); }};
    case Collective::kAlltoall:
      if (in.data() == out.data())
        return {[&comm, out, algorithm] { comm.alltoall(out, algorithm); }};
      return {[&comm, in, out, algorithm] { comm.alltoall(in, out, algorithm); }};
    default:
      break;
  }
  throw coltrain::InvalidArgument("no such collective in the harness");
}

// Device buffers are staged by `comm`, which runs its algorithm per chunk.
template <class T>
void bench_coltrain(const Options& options, const World& world, Communicator& comm,
                    const std::string& backend, Report& report) {
  const bool mpi = comm.backend() == coltrain::comm::Backend::kMpi;
  const bool staged = options.memory == MemoryKind::kDevice;
  comm.set_staging_options(options.staging);
  const bool compressed = options.compression != coltrain::comm::WireCompression::kNone;
  comm.set_wire_compression(options.compression);
  std::string note = staged ? "staged through pinned host memory in chunks of at most " +
                                  std::to_string(options.staging.chunk_bytes) +
                                  " B; automatic chooses per chunk"
                            : "";
  if (compressed) {
    note = std::string("sent as ") + std::string(coltrain::comm::name_of(options.compression)) +
           ", reduced in f32; bandwidths count the f32 bytes";
  }
  for (const std::string& name : options.algorithms) {
    const Algorithm algorithm = coltrain::comm::parse_algorithm(name);
    if (std::string why = coltrain_unsupported(options.collective, algorithm, mpi); !why.empty()) {
      report.skip(backend + " / " + name, why);
      continue;
    }
    if (compressed &&
        (algorithm != Algorithm::kAutomatic || options.collective != Collective::kAllreduce ||
         options.dtype != DataType::kFloat32 || staged)) {
      report.skip(backend + " / " + name,
                  "--compression applies to f32 allreduce on host buffers with the automatic "
                  "algorithm");
      continue;
    }
    const Prepare<T> prepare = [&](Workspace<T>& workspace, const Case& c) {
      return coltrain_collective(comm, algorithm, workspace, c);
    };
    std::function<std::string(const Case&)> chosen;
    if (compressed) {
      chosen = [](const Case&) { return std::string("compressed"); };
    } else if (algorithm == Algorithm::kAutomatic) {
      chosen = [&comm, &options, staged](const Case& c) {
        const std::size_t bytes = staged ? staged_model_bytes(c, options.staging) : model_bytes(c);
        return std::string(coltrain::comm::name_of(comm.choose(c.collective, bytes)));
      };
    }
    run_series<T>(options, world, {backend, name, runs_in_place(options), note}, prepare, chosen,
                  report);
  }
}

// ---- backend gloo ----

template <class T>
void bench_gloo(const Options& options, const World& world, Report& report) {
#if COLTRAIN_BENCH_WITH_GLOO
  namespace bench = coltrain::bench;
  if (options.collective != Collective::kAllreduce && options.collective != Collective::kAlltoall) {
    report.skip("gloo", "the harness runs Gloo's allreduce and alltoall only");
    return;
  }
  if (options.memory == MemoryKind::kDevice) {
    report.skip("gloo", "Gloo's TCP allreduce takes host memory (--mem device)");
    return;
  }
  const bool alltoall = options.collective == Collective::kAlltoall;
  if (std::string why = bench::gloo_unsupported(options.dtype, options.op);
      !why.empty() && !alltoall) {
    report.skip("gloo", why);
    return;
  }
  // f16 and bf16 were turned away above; this keeps Gloo's templates from being built for them.
  if constexpr (!kNarrowFloat<T>) {
    const auto context = std::make_shared<bench::GlooMpiContext>(
        MPI_COMM_WORLD, coltrain::comm::comm_options_from_env().timeout);
    if (alltoall) {
      if (runs_in_place(options)) {
        report.skip("gloo", "Gloo's alltoall works out of place only");
        return;
      }
      const Prepare<T> prepare = [&context](Workspace<T>& workspace, const Case& c) {
        return Prepared{
            bench::make_gloo_alltoall<T>(context, workspace.input(), workspace.output(), c.count)};
      };
      run_series<T>(options, world, {"gloo", "native", false, "Gloo's alltoall (gloo::alltoall)"},
                    prepare, {}, report);
      return;
    }
    for (const std::string& name : options.algorithms) {
      const auto gloo_algorithm = bench::gloo_allreduce_for(coltrain::comm::parse_algorithm(name));
      if (!gloo_algorithm) {
        report.skip("gloo / " + name,
                    "Gloo's counterparts are ring (allreduce_ring_chunked) and halving_doubling "
                    "(allreduce_halving_doubling)");
        continue;
      }
      const Prepare<T> prepare = [&context, gloo_algorithm](Workspace<T>& workspace,
                                                            const Case& c) {
        return Prepared{bench::make_gloo_allreduce<T>(context, *gloo_algorithm, workspace.output(),
                                                      c.count, c.op)};
      };
      const Series series{
          "gloo", name, true,
          std::string("Gloo's ") + bench::name_of(*gloo_algorithm) + ", which works in place only"};
      run_series<T>(options, world, series, prepare, {}, report);
    }
  }
#else
  (void)options;
  (void)world;
  report.skip("gloo", "not built with Gloo (install Debian's libgloo-dev and reconfigure)");
#endif
}

// ---- backend nccl ----

template <class T>
void bench_nccl(const Options& options, const World& world, Report& report) {
#if COLTRAIN_WITH_NCCL
  namespace bench = coltrain::bench;
  if (options.memory != MemoryKind::kDevice) {
    report.skip("nccl", "NCCL works on GPU memory: add --mem device");
    return;
  }
  if (auto why = agree_unavailable(bench::cuda_unavailable(world.local_size))) {
    report.skip("nccl", *why);
    return;
  }
  bench::NcclCommunicator nccl(MPI_COMM_WORLD, world.local_rank);
  for (const std::string& name : options.algorithms) {
    if (name != "native") {
      report.skip("nccl / " + name, "NCCL picks its own algorithms: ask for native");
      continue;
    }
    const Prepare<T> prepare = [&nccl](Workspace<T>& workspace, const Case& c) {
      const T* in = workspace.input();
      T* out = workspace.output();
      return Prepared{[&nccl, in, out, c] {
                        nccl.launch(c.collective, in, out, c.count, c.block, c.dtype, c.op, c.root);
                      },
                      [&nccl] { nccl.synchronize(); }};
    };
    run_series<T>(options, world, {"nccl", name, runs_in_place(options), {}}, prepare, {}, report);
  }
#else
  (void)options;
  (void)world;
  report.skip("nccl", "not built with NCCL support (configure with CUDA and NCCL found)");
#endif
}

// ---- main ----

template <class T>
void bench_all(const Options& options, const World& world, Report& report) {
  for (const std::string& backend : options.backends) {
    if (backend == "mpi") {
      Communicator comm = Communicator::mpi(MPI_COMM_WORLD);
      bench_coltrain<T>(options, world, comm, backend, report);
    } else if (backend == "tcp") {
      Communicator comm = coltrain::comm::tcp_over_mpi(MPI_COMM_WORLD);
      bench_coltrain<T>(options, world, comm, backend, report);
    } else if (backend == "gloo") {
      bench_gloo<T>(options, world, report);
    } else {
      bench_nccl<T>(options, world, report);
    }
  }
}

template <class F>
void with_element_type(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat32:
      return f(std::type_identity<float>{});
    case DataType::kFloat64:
      return f(std::type_identity<double>{});
    case DataType::kFloat16:
      return f(std::type_identity<coltrain::half>{});
    case DataType::kBFloat16:
      return f(std::type_identity<coltrain::bfloat16>{});
    case DataType::kInt32:
      return f(std::type_identity<std::int32_t>{});
    case DataType::kInt64:
      return f(std::type_identity<std::int64_t>{});
    case DataType::kUInt8:
      break;
  }
  throw coltrain::InvalidArgument("the collectives take no " +
                                  std::string(coltrain::name_of(dtype)));
}

// Checks that need the job: the root among the ranks, a GPU for pinned and device memory.
std::optional<std::string> job_problem(const Options& options, const World& world) {
  if (options.root >= world.size) {
    return "--root " + std::to_string(options.root) + " is not a rank of this " +
           std::to_string(world.size) + "-rank job";
  }
#if COLTRAIN_WITH_CUDA
  if (options.memory != MemoryKind::kHost) {
    if (auto why = agree_unavailable(coltrain::bench::cuda_unavailable(1))) {
      return std::string("--mem ") + name_of(options.memory) + ": " + *why;
    }
  }
#endif
  return std::nullopt;
}

int run(int argc, char** argv, const World& world) {
  CLI::App app{
      "Collective microbenchmark: MPI, coltrain's TCP, NCCL and Gloo side by side, "
      "nccl-tests style. Launch with mpiexec -n N."};
  Options options;
  try {
    parse_options(app, options, argc, argv);
  } catch (const CLI::ParseError& e) {
    if (world.rank == 0) return app.exit(e);  // prints help or the error once
    return e.get_exit_code();
  }
  if (auto problem = job_problem(options, world)) {
    if (world.rank == 0) std::fprintf(stderr, "allreduce_bench: %s\n", problem->c_str());
    return 2;
  }
  Report report(options, world);
  report.write_files();  // an unwritable path fails now, not after the sweep
  with_element_type(options.dtype, [&](auto type) {
    bench_all<typename decltype(type)::type>(options, world, report);
  });
  if (world.rank == 0) {
    if (!options.check) {
      std::printf("\n# results not checked (-c 0)\n");
    } else if (report.wrong() == 0) {
      std::printf("\n# every element of every result correct\n");
    } else {
      std::printf("\n# FAILED: %lld wrong elements (see #wrong)\n",
                  static_cast<long long>(report.wrong()));
    }
  }
  return report.wrong() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int status = 0;
  World world;
  try {
    world = mpi_world();
    status = run(argc, argv, world);
  } catch (const std::exception& e) {
    // Another rank may be blocked in a collective with this one: end the whole job.
    std::fprintf(stderr, "allreduce_bench: rank %d: %s\n", world.rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return status;
}
