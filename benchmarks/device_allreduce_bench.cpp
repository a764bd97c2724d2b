// Allreduce over coltrain's TCP backend on host buffers and on device buffers (staged through
// pinned memory by Communicator), side by side in one run: what staging costs. Needs
// no MPI, so that it runs on GPU machines without one; start it with the torchrun variables:
//
//   scripts/launch_local 2 build/benchmarks/device_allreduce_bench -b 1M -e 256M
//
// Method, per size and memory: w warm-up operations, then r repeats of (a barrier, n operations
// back to back); a repeat's time is elapsed / n, the maximum over ranks; the table shows the
// median repeat. algbw = size / time, busbw = algbw x 2(p-1)/p (GB = 1e9), as nccl-tests defines
// them. Inputs are small integers, exact in every dtype in any summation order; after the timed
// runs one more operation on a poisoned output is compared bit for bit, and #wrong sums the bad
// elements over ranks. Exit status: 0, 1 when an element is wrong, 2 on an error, 77 when
// --mem device finds no CUDA device.
#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/device/staged_collectives.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>

#include <CLI/CLI.hpp>

#include "collectives/element_values.hpp"
#include "collectives/options.hpp"

#if !COLTRAIN_WITH_CUDA
#error "device_allreduce_bench needs CUDA: it measures allreduce on device buffers"
#endif
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using coltrain::DataType;
using coltrain::comm::Algorithm;
using coltrain::comm::Communicator;
using coltrain::comm::ReduceOp;
using coltrain::comm::StagingOptions;

constexpr int kNoDevice = 77;

struct Options {
  std::size_t min_bytes = std::size_t{1} << 20;
  std::size_t max_bytes = std::size_t{256} << 20;
  std::size_t factor = 2;
  int iterations = 10;
  int warmup = 3;
  int repeats = 5;
  int check = 1;
  DataType dtype = DataType::kFloat32;
  Algorithm algorithm = Algorithm::kAutomatic;
  std::vector<std::string> memories{"host", "device"};
  StagingOptions staging;
};

// ---- inputs, exact by construction ----

using coltrain::bench::element;
using coltrain::bench::kNarrowFloat;

// 1..k on every rank, with k * ranks within the integers the dtype holds exactly (bf16: 256).
class Inputs {
 public:
  Inputs(DataType dtype, int ranks) : ranks_(ranks) {
    const std::int64_t exact = dtype == DataType::kBFloat16  ? 256
                               : dtype == DataType::kFloat16 ? 2048
                                                             : std::int64_t{1} << 24;
    range_ = std::clamp<std::int64_t>(exact / ranks, 1, 4);
  }
  std::int64_t value(int rank, std::size_t i) const {
    std::uint64_t x = i * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(rank) * 0xC2B2AE3Dull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return 1 + static_cast<std::int64_t>(x % static_cast<std::uint64_t>(range_));
  }
  std::int64_t sum(std::size_t i) const {
    std::int64_t total = 0;
    for (int rank = 0; rank < ranks_; ++rank) total += value(rank, i);
    return total;
  }

 private:
  int ranks_;
  std::int64_t range_;
};

// ---- buffers ----

// An input and an output of `count` elements in host or device memory, filled and checked
// through host copies.
template <class T>
class Buffers {
 public:
  Buffers(bool device, std::size_t count) : device_(device), count_(count) {
    if (!device_) {
      host_in_.resize(count);
      host_out_.resize(count);
      in_ = host_in_.data();
      out_ = host_out_.data();
      return;
    }
    COLTRAIN_CHECK_CUDA(cudaMalloc(&in_, count * sizeof(T)));
    if (const cudaError_t status = cudaMalloc(&out_, count * sizeof(T)); status != cudaSuccess) {
      cudaFree(in_);
      COLTRAIN_CHECK_CUDA(status);
    }
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    if (device_) {
      cudaFree(in_);
      cudaFree(out_);
    }
  }

  std::span<const T> input() const { return {in_, count_}; }
  std::span<T> output() { return {out_, count_}; }

  // This rank's inputs, and an output poisoned with 0xFF bytes (NaN; -1 for integers), which no
  // result takes.
  void fill(const Inputs& inputs, int rank) {
    std::vector<T> values(count_);
    for (std::size_t i = 0; i < count_; ++i) values[i] = element<T>(inputs.value(rank, i));
    if (device_) {
      COLTRAIN_CHECK_CUDA(cudaMemcpy(in_, values.data(), count_ * sizeof(T), cudaMemcpyDefault));
      COLTRAIN_CHECK_CUDA(cudaMemset(out_, 0xFF, count_ * sizeof(T)));
      COLTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
    } else {
      std::copy(values.begin(), values.end(), host_in_.begin());
      std::memset(static_cast<void*>(host_out_.data()), 0xFF, count_ * sizeof(T));
    }
  }

  std::int64_t count_wrong(const Inputs& inputs) const {
    std::vector<T> copy;
    const T* out = out_;
    if (device_) {
      copy.resize(count_);
      COLTRAIN_CHECK_CUDA(cudaMemcpy(copy.data(), out_, count_ * sizeof(T), cudaMemcpyDefault));
      out = copy.data();
    }
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < count_; ++i) {
      const T expected = element<T>(inputs.sum(i));
      if (std::memcmp(&out[i], &expected, sizeof(T)) != 0) ++wrong;
    }
    return wrong;
  }

 private:
  bool device_;
  std::size_t count_;
  std::vector<T> host_in_;
  std::vector<T> host_out_;
  T* in_ = nullptr;
  T* out_ = nullptr;
};

// ---- measuring and reporting ----

template <class... Args>
std::string formatted(const char* format, Args... args) {
  char text[128];
  std::snprintf(text, sizeof(text), format, args...);
  return text;
}

struct Result {
  double time_us = 0;
  double algbw_gbs = 0;
  double busbw_gbs = 0;
  std::optional<std::int64_t> wrong;
};

double slowest(Communicator& comm, double local) {
  comm.allreduce(std::span<double>(&local, 1), ReduceOp::kMax);
  return local;
}

// Device buffers are staged by `comm`; host ones run as they are.
template <class T>
Result measure(Communicator& comm, bool device, std::size_t count, const Options& options) {
  const Inputs inputs(options.dtype, comm.size());
  Buffers<T> buffers(device, count);
  buffers.fill(inputs, comm.rank());
  const auto operation = [&] {
    comm.allreduce(buffers.input(), buffers.output(), ReduceOp::kSum, options.algorithm);
  };
  for (int i = 0; i < options.warmup; ++i) operation();
  std::vector<double> repeats;
  for (int r = 0; r < options.repeats; ++r) {
    comm.barrier();
    const coltrain::Stopwatch watch;
    for (int i = 0; i < options.iterations; ++i) operation();
    repeats.push_back(slowest(comm, watch.microseconds() / options.iterations));
  }
  std::sort(repeats.begin(), repeats.end());
  Result result;
  result.time_us = repeats[repeats.size() / 2];
  const double bytes = static_cast<double>(count * sizeof(T));
  const double p = comm.size();
  result.algbw_gbs = bytes / result.time_us / 1e3;
  result.busbw_gbs = result.algbw_gbs * 2 * (p - 1) / p;
  if (options.check) {
    buffers.fill(inputs, comm.rank());
    operation();
    std::int64_t wrong = buffers.count_wrong(inputs);
    comm.allreduce(std::span<std::int64_t>(&wrong, 1));
    result.wrong = wrong;
  }
  return result;
}

template <class T>
std::int64_t run_sweep(Communicator& comm, const Options& options) {
  const bool staged = std::ranges::find(options.memories, "device") != options.memories.end();
  comm.set_staging_options(options.staging);
  const bool root = comm.rank() == 0;
  const std::string dtype(coltrain::name_of(options.dtype));
  if (root) {
    std::printf(
        "# allreduce over tcp / %s, %d ranks, %s sum, out of place; median of %d repeats "
        "of %d operations after %d warm-up\n",
        std::string(coltrain::comm::name_of(options.algorithm)).c_str(), comm.size(), dtype.c_str(),
        options.repeats, options.iterations, options.warmup);
    if (staged) {
      std::printf("# device buffers staged through pinned memory in chunks of at most %zu bytes\n",
                  options.staging.chunk_bytes);
    }
    std::string names = formatted("#%12s %12s %6s", "size", "count", "type");
    std::string units = formatted("#%12s %12s %6s", "(B)", "(elements)", "");
    for (const std::string& memory : options.memories) {
      names += formatted(" | %11s %9s %9s", (memory + " time").c_str(), "algbw", "busbw");
      units += formatted(" | %11s %9s %9s", "(us)", "(GB/s)", "(GB/s)");
    }
    if (options.memories.size() == 2) {
      names += formatted(" | %8s", "dev/host");
      units += formatted(" | %8s", "(busbw)");
    }
    std::printf("%s  %6s\n%s\n", names.c_str(), "#wrong", units.c_str());
    std::fflush(stdout);
  }
  std::int64_t wrong = 0;
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
    const std::size_t count = bytes / sizeof(T);
    if (count > 0) {
      std::vector<Result> results;
      std::optional<std::int64_t> size_wrong;
      for (const std::string& memory : options.memories) {
        results.push_back(measure<T>(comm, memory == "device", count, options));
        if (results.back().wrong) size_wrong = size_wrong.value_or(0) + *results.back().wrong;
      }
      wrong += size_wrong.value_or(0);
      if (root) {
        std::printf("%13zu %12zu %6s", count * sizeof(T), count, dtype.c_str());
        for (const Result& r : results) {
          std::printf(" | %11.1f %9.3f %9.3f", r.time_us, r.algbw_gbs, r.busbw_gbs);
        }
        if (results.size() == 2)
          std::printf(" | %8.3f", results[1].busbw_gbs / results[0].busbw_gbs);
        std::printf("  %6s\n", size_wrong ? std::to_string(*size_wrong).c_str() : "N/A");
        std::fflush(stdout);
      }
    }
    if (bytes > options.max_bytes / options.factor) break;
    bytes *= options.factor;
  }
  return wrong;
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
  throw coltrain::InvalidArgument("allreduce takes no u8");
}

int run(int argc, char** argv) {
  CLI::App app{
      "Allreduce over coltrain's TCP backend on host and on device (staged) buffers, nccl-tests "
      "style. Launch with scripts/launch_local N (or any launcher that sets the torchrun "
      "variables)."};
  Options options;
  std::string dtype = "f32";
  std::string algorithm = "automatic";
  coltrain::bench::add_sweep_options(app,
                                     {options.min_bytes, options.max_bytes, options.factor,
                                      options.iterations, options.warmup, options.check},
                                     "operations per repeat");
  app.add_option("-r,--repeats", options.repeats, "timed repeats; the median is shown")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("-d,--datatype", dtype, "element type: f32, f64, f16, bf16, i32, i64")
      ->check(CLI::IsMember({"f32", "f64", "f16", "bf16", "i32", "i64"}))
      ->capture_default_str();
  app.add_option("--algo", algorithm, "ring, tree, halving_doubling or automatic")
      ->check(CLI::IsMember({"ring", "tree", "halving_doubling", "automatic"}))
      ->capture_default_str();
  app.add_option("--mem", options.memories, "host, device, or both (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str();
  app.add_option("--staging-chunk", options.staging.chunk_bytes,
                 "largest staging chunk of device buffers (suffixes K, M, G: x1024)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  options.dtype = coltrain::parse_data_type(dtype);
  options.algorithm = coltrain::comm::parse_algorithm(algorithm);
  // Host first, so that the ratio column is device over host; each memory once.
  std::vector<std::string> memories;
  for (const char* memory : {"host", "device"}) {
    if (std::ranges::find(options.memories, memory) != options.memories.end()) {
      memories.emplace_back(memory);
    }
  }
  options.memories = memories;

  // Every rank sees the same machine, so all of them stop here, before the rendezvous.
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  const bool wants_device = options.memories.back() == "device";
  if (wants_device && (status != cudaSuccess || devices == 0)) {
    std::printf("skipped: no CUDA device (%s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "device count is 0");
    return kNoDevice;
  }

  Communicator comm = Communicator::from_env(coltrain::comm::Backend::kTcp);
  std::int64_t wrong = 0;
  with_element_type(options.dtype, [&](auto type) {
    wrong = run_sweep<typename decltype(type)::type>(comm, options);
  });
  if (comm.rank() == 0) {
    if (!options.check) {
      std::printf("# results not checked (-c 0)\n");
    } else if (wrong == 0) {
      std::printf("# every element of every result correct\n");
    } else {
      std::printf("# FAILED: %lld wrong elements (see #wrong)\n", static_cast<long long>(wrong));
    }
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "device_allreduce_bench: %s\n", e.what());
    return 2;
  }
}
