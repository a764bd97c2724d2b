// The NCCL backend on the test machine's GPU, raw (NcclBackend) and through the front door
// (Communicator with Backend::kNccl). NCCL runs one rank per GPU, so these run one rank:
// every collective must then return its input exactly, for every dtype, op and size (odd and zero
// included; kAvg too: on one rank NCCL copies, or for floats scales by 1/1, which is exact), with
// outputs poisoned first so that unwritten elements show. The ring over
// ncclSend/ncclRecv is compared with NCCL's native allreduce, and its reduction kernel with a host
// reference; the schedule for many ranks is tested on the host (tests/comm/test_nccl_host.cpp).
// Then the failure paths: bad arguments, a stream that never finishes, an init that a rank
// misses, and Communicator::from_env(Backend::kNccl): device spans on NCCL with every algorithm,
// host spans on its TCP bootstrap, the stream and synchronize(). nccl_reduce_kernels.cu includes
// <coltrain/cuda/nccl_reduce.cuh>, which registers the ring's and tree's kernel for this program.

#include "nccl_reduce_kernels.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/device/nccl/nccl_backend.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>

#include <cuda_runtime.h>
#include <nccl.h>
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

using Catch::Matchers::Contains;
using coltrain::bfloat16;
using coltrain::DataType;
using coltrain::half;
using coltrain::comm::Algorithm;
using coltrain::comm::CommOptions;
using coltrain::comm::NcclBackend;
using coltrain::comm::ReduceOp;
using namespace std::chrono_literals;

namespace {

using Bytes = std::vector<std::byte>;

constexpr std::array<std::size_t, 6> kSizes = {0, 1, 7, 1000, 65537, (std::size_t{1} << 20) + 3};
constexpr std::array<ReduceOp, 5> kOps = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                          ReduceOp::kMax, ReduceOp::kAvg};

// Device memory of a number of bytes, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) COLTRAIN_CHECK_CUDA(cudaMalloc(&data_, bytes));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }

  void* get() const { return data_; }

  // upload and poison use the legacy default stream, which is not ordered with the tests'
  // non-blocking streams, and may return before the device is done (a memset at once, a pageable
  // copy once staged). Without the device sync, the poison landed after a collective or kernel
  // had written the buffer (seen on an H100 as bad tails and bad f64/i64 kernel outputs).
  void upload(const Bytes& host) {
    REQUIRE(host.size() == bytes_);
    if (bytes_ == 0) return;
    COLTRAIN_CHECK_CUDA(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyDefault));
    COLTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
  }
  Bytes download() const {
    Bytes host(bytes_);
    if (bytes_ > 0) COLTRAIN_CHECK_CUDA(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDefault));
    return host;
  }
  // All bits set: NaN in every float type, -1 or 255 in the integers, which inputs never hold.
  void poison() {
    if (bytes_ == 0) return;
    COLTRAIN_CHECK_CUDA(cudaMemset(data_, 0xff, bytes_));
    COLTRAIN_CHECK_CUDA(cudaDeviceSynchronize());
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

class Stream {
 public:
  Stream() { COLTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { cudaStreamDestroy(stream_); }

  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

CommOptions options_with_timeout(std::chrono::milliseconds timeout) {
  CommOptions options;
  options.timeout = timeout;
  return options;
}

NcclBackend one_rank(CommOptions options = options_with_timeout(60s)) {
  ncclUniqueId id;
  COLTRAIN_CHECK_NCCL(ncclGetUniqueId(&id));
  return NcclBackend(0, 1, id, 0, std::move(options));
}

// Calls f.template operator()<T>() with the element type of `dtype`.
template <class F>
void with_element_type(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat32:
      return f.template operator()<float>();
    case DataType::kFloat64:
      return f.template operator()<double>();
    case DataType::kFloat16:
      return f.template operator()<half>();
    case DataType::kBFloat16:
      return f.template operator()<bfloat16>();
    case DataType::kInt32:
      return f.template operator()<std::int32_t>();
    case DataType::kInt64:
      return f.template operator()<std::int64_t>();
    case DataType::kUInt8:
      return f.template operator()<std::uint8_t>();
  }
  FAIL("unknown dtype");
}

// The type the ring's kernel combines T in.
template <class T>
using Combined =
    std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;

// Random non-zero elements; none has all bits set (the poison).
Bytes random_elements(DataType dtype, std::size_t count, std::mt19937& random) {
  Bytes bytes(count * coltrain::size_of(dtype));
  with_element_type(dtype, [&]<class T>() {
    std::vector<T> values(count);
    std::uniform_int_distribution<int> sign(0, 1);
    for (T& value : values) {
      if constexpr (std::is_same_v<T, std::uint8_t>) {
        value = static_cast<T>(std::uniform_int_distribution<int>(1, 254)(random));
      } else if constexpr (std::is_integral_v<T>) {
        const auto magnitude = std::uniform_int_distribution<int>(2, 1000)(random);
        value = static_cast<T>(sign(random) == 0 ? magnitude : -magnitude);
      } else {
        const auto magnitude = std::uniform_real_distribution<float>(0.1f, 2.0f)(random);
        value = T(sign(random) == 0 ? magnitude : -magnitude);
      }
    }
    if (count > 0) std::memcpy(bytes.data(), values.data(), bytes.size());
  });
  return bytes;
}

// Elements whose bytes differ, and the first of them.
struct Mismatches {
  std::size_t count = 0;
  std::size_t first = 0;
};

Mismatches compare_elements(const Bytes& got, const Bytes& expected, DataType dtype) {
  REQUIRE(got.size() == expected.size());
  const std::size_t element = coltrain::size_of(dtype);
  Mismatches mismatches;
  for (std::size_t i = 0; i * element < got.size(); ++i) {
    if (std::memcmp(got.data() + i * element, expected.data() + i * element, element) != 0) {
      if (mismatches.count++ == 0) mismatches.first = i;
    }
  }
  return mismatches;
}

#define CHECK_SAME_ELEMENTS(got, expected, dtype)                                      \
  do {                                                                                 \
    const Mismatches mismatches_ = compare_elements((got), (expected), (dtype));       \
    INFO(mismatches_.count << " elements differ, the first at " << mismatches_.first); \
    CHECK(mismatches_.count == 0);                                                     \
  } while (0)

// What the ring's kernel computes, element by element, in the same type and order.
template <class T>
Bytes reference_reduce(const Bytes& a, const Bytes& b, ReduceOp op, int divisor) {
  using W = Combined<T>;
  Bytes out(a.size());
  for (std::size_t i = 0; i < a.size() / sizeof(T); ++i) {
    T x;
    T y;
    std::memcpy(&x, a.data() + i * sizeof(T), sizeof(T));
    std::memcpy(&y, b.data() + i * sizeof(T), sizeof(T));
    const auto u = static_cast<W>(x);
    const auto v = static_cast<W>(y);
    W r;
    if (op == ReduceOp::kMin) {
      r = v < u ? v : u;
    } else if (op == ReduceOp::kMax) {
      r = u < v ? v : u;
    } else if constexpr (std::is_integral_v<W>) {
      using U = std::make_unsigned_t<W>;
      r = op == ReduceOp::kProd ? static_cast<W>(static_cast<U>(u) * static_cast<U>(v))
                                : static_cast<W>(static_cast<U>(u) + static_cast<U>(v));
    } else {
      r = op == ReduceOp::kProd ? u * v : u + v;
    }
    if (divisor > 1) r = r / static_cast<W>(divisor);
    const auto t = static_cast<T>(r);
    std::memcpy(out.data() + i * sizeof(T), &t, sizeof(T));
  }
  return out;
}

std::string name_of_op(ReduceOp op) { return std::string(coltrain::comm::name_of(op)); }

void block_until(void* flag) {
  while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::sleep_for(1ms);
}

}  // namespace

TEST_CASE("one rank: every native collective returns its input, for every dtype, op and size",
          "[nccl]") {
  NcclBackend nccl = one_rank();
  REQUIRE(nccl.rank() == 0);
  REQUIRE(nccl.size() == 1);
  const Stream stream;
  std::mt19937 random(7);
  for (const DataType dtype : coltrain::kAllDataTypes) {
    for (const std::size_t count : kSizes) {
      CAPTURE(coltrain::name_of(dtype), count);
      const Bytes input = random_elements(dtype, count, random);
      DeviceBuffer in(input.size());
      DeviceBuffer out(input.size());
      in.upload(input);
      const auto run = [&](const auto& enqueue) {
        out.poison();
        enqueue();
        nccl.synchronize(stream.get());
        CHECK_SAME_ELEMENTS(out.download(), input, dtype);
      };
      for (const ReduceOp op : kOps) {
        CAPTURE(name_of_op(op));
        run([&] {
          nccl.allreduce(in.get(), out.get(), count, dtype, stream.get(), op, Algorithm::kNative);
        });
        run([&] { nccl.reduce_scatter(in.get(), out.get(), count, dtype, stream.get(), op); });
        run([&] { nccl.reduce(in.get(), out.get(), count, dtype, 0, stream.get(), op); });
        // In place: the input is the output.
        out.upload(input);
        nccl.allreduce(out.get(), out.get(), count, dtype, stream.get(), op);
        nccl.synchronize(stream.get());
        CHECK_SAME_ELEMENTS(out.download(), input, dtype);
      }
      run([&] { nccl.broadcast(in.get(), out.get(), count, dtype, 0, stream.get()); });
      run([&] { nccl.allgather(in.get(), out.get(), count, dtype, stream.get()); });
      CHECK_SAME_ELEMENTS(in.download(), input, dtype);  // inputs stay untouched
    }
  }
}

TEST_CASE("one rank: the typed span overloads move the same data", "[nccl]") {
  NcclBackend nccl = one_rank();
  const Stream stream;
  std::mt19937 random(11);
  constexpr std::size_t kCount = 4099;
  const Bytes input = random_elements(DataType::kBFloat16, kCount, random);
  DeviceBuffer in(input.size());
  DeviceBuffer out(input.size());
  in.upload(input);
  const std::span<const bfloat16> source(static_cast<const bfloat16*>(in.get()), kCount);
  const std::span<bfloat16> target(static_cast<bfloat16*>(out.get()), kCount);
  const auto check = [&] {
    nccl.synchronize(stream.get());
    CHECK_SAME_ELEMENTS(out.download(), input, DataType::kBFloat16);
    out.poison();
  };
  out.poison();
  nccl.allreduce(source, target, stream.get(), ReduceOp::kAvg);
  check();
  nccl.allgather(source, target, stream.get());
  check();
  nccl.reduce_scatter(source, target, stream.get(), ReduceOp::kMax);
  check();
  nccl.reduce(source, target, 0, stream.get());
  check();
  out.upload(input);
  nccl.broadcast(target, 0, stream.get());
  nccl.barrier(stream.get());
  CHECK_SAME_ELEMENTS(out.download(), input, DataType::kBFloat16);
}

TEST_CASE("ring and tree allreduce over ncclSend/ncclRecv give the native allreduce's bits",
          "[nccl]") {
  NcclBackend nccl = one_rank();
  nccl.set_device_reduction(coltrain::test::nccl_device_reduction());
  const Stream stream;
  std::mt19937 random(13);
  for (const Algorithm algorithm : {Algorithm::kRing, Algorithm::kTree}) {
    for (const DataType dtype : coltrain::kAllDataTypes) {
      for (const std::size_t count : kSizes) {
        for (const ReduceOp op : kOps) {
          CAPTURE(std::string(coltrain::comm::name_of(algorithm)), coltrain::name_of(dtype), count,
                  name_of_op(op));
          const Bytes input = random_elements(dtype, count, random);
          DeviceBuffer in(input.size());
          DeviceBuffer native(input.size());
          DeviceBuffer ours(input.size());
          in.upload(input);
          native.poison();
          ours.poison();
          nccl.allreduce(in.get(), native.get(), count, dtype, stream.get(), op,
                         Algorithm::kNative);
          nccl.allreduce(in.get(), ours.get(), count, dtype, stream.get(), op, algorithm);
          nccl.synchronize(stream.get());
          CHECK_SAME_ELEMENTS(ours.download(), native.download(), dtype);
          nccl.allreduce(ours.get(), ours.get(), count, dtype, stream.get(), op, algorithm);
          nccl.synchronize(stream.get());
          CHECK_SAME_ELEMENTS(ours.download(), input, dtype);
        }
      }
    }
  }
}

TEST_CASE("the ring's reduction kernel computes a op b, then / divisor, as the host does",
          "[nccl]") {
  const coltrain::comm::DeviceReduction reduce = coltrain::test::nccl_device_reduction();
  const Stream stream;
  std::mt19937 random(17);
  for (const DataType dtype : coltrain::kAllDataTypes) {
    for (const std::size_t count : kSizes) {
      for (const ReduceOp op : kOps) {
        for (const int divisor : {1, 3}) {
          if (divisor != 1 && count > 100000) continue;  // the large size once per op is enough
          CAPTURE(coltrain::name_of(dtype), count, name_of_op(op), divisor);
          const Bytes a = random_elements(dtype, count, random);
          const Bytes b = random_elements(dtype, count, random);
          Bytes expected;
          with_element_type(dtype,
                            [&]<class T>() { expected = reference_reduce<T>(a, b, op, divisor); });
          DeviceBuffer in_a(a.size());
          DeviceBuffer in_b(b.size());
          DeviceBuffer out(a.size());
          in_a.upload(a);
          in_b.upload(b);
          out.poison();
          reduce(out.get(), in_a.get(), in_b.get(), count, dtype, op, divisor, stream.get());
          reduce(in_a.get(), in_a.get(), in_b.get(), count, dtype, op, divisor, stream.get());
          COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
          CHECK_SAME_ELEMENTS(out.download(), expected, dtype);
          CHECK_SAME_ELEMENTS(in_a.download(), expected, dtype);  // in place
        }
      }
    }
  }
}

TEST_CASE("bad arguments are refused with a message, and the communicator stays usable", "[nccl]") {
  NcclBackend nccl = one_rank();
  const Stream stream;
  DeviceBuffer device(16 * sizeof(float));
  std::vector<float> host(16, 1.0f);
  const DataType f32 = DataType::kFloat32;
  CHECK_THROWS_WITH(nccl.allreduce(nullptr, device.get(), 16, f32, stream.get()),
                    Contains("allreduce got a null input (16 f32)"));
  CHECK_THROWS_WITH(nccl.allgather(device.get(), host.data(), 16, f32, stream.get()),
                    Contains("output (16 f32) is pageable host memory"));
  CHECK_THROWS_WITH(nccl.broadcast(device.get(), device.get(), 16, f32, 1, stream.get()),
                    Contains("root 1 is not a rank of this 1-rank communicator"));
  CHECK_THROWS_WITH(
      nccl.reduce(device.get(), device.get(), 16, static_cast<DataType>(42), 0, stream.get()),
      Contains("dtype value 42 is not a coltrain DataType"));
  CHECK_THROWS_WITH(
      nccl.allreduce(device.get(), device.get(), 16, f32, stream.get(), static_cast<ReduceOp>(9)),
      Contains("reduction op value 9"));
  CHECK_THROWS_WITH(nccl.allreduce(device.get(), device.get(), 16, f32, stream.get(),
                                   ReduceOp::kSum, Algorithm::kHalvingDoubling),
                    Contains("has no algorithm 'halving_doubling' on NCCL"));
  // The .cu file of this program registered the reduction kernel.
  CHECK(nccl.device_reduction() == coltrain::test::nccl_device_reduction());
  const std::span<const float> four(static_cast<const float*>(device.get()), 4);
  const std::span<float> three(static_cast<float*>(device.get()), 3);
  CHECK_THROWS_WITH(nccl.allgather(four, three, stream.get()),
                    Contains("output has 3 elements, expected 4"));
  CHECK_THROWS_AS(NcclBackend(0, 1, ncclUniqueId{}, 1 << 20, options_with_timeout(5s)),
                  coltrain::ConfigError);

  nccl.allreduce(device.get(), device.get(), 16, f32, stream.get());
  nccl.synchronize(stream.get());
  nccl.barrier(stream.get());
}

TEST_CASE("a stream that does not finish by the deadline aborts the communicator and throws",
          "[nccl]") {
  NcclBackend nccl = one_rank(options_with_timeout(500ms));
  const Stream stream;
  DeviceBuffer buffer(1024 * sizeof(float));
  buffer.poison();
  nccl.allreduce(buffer.get(), buffer.get(), 1024, DataType::kFloat32, stream.get());
  nccl.synchronize(stream.get());

  // A host function holds the stream (a stand-in for a peer that never answers) until well after
  // the deadline; the releaser lets it drain even if aborting waits for the device.
  std::atomic<bool> release{false};
  COLTRAIN_CHECK_CUDA(cudaLaunchHostFunc(stream.get(), block_until, &release));
  std::thread releaser([&release] {
    std::this_thread::sleep_for(3s);
    release = true;
  });
  const coltrain::Stopwatch watch;
  bool timed_out = false;
  try {
    nccl.synchronize(stream.get());
  } catch (const coltrain::TimeoutError& e) {
    timed_out = true;
    CHECK(watch.seconds() >= 0.5);
    CHECK_THAT(e.what(), Contains("allreduce of 1024 f32 on rank 0 of 1") &&
                             Contains("COLTRAIN_TIMEOUT") && Contains("aborted"));
    CHECK(e.context().rank == 0);
    CHECK(e.context().operation == "allreduce");
  }
  releaser.join();
  COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  CHECK(timed_out);
  CHECK(nccl.nccl_comm() == nullptr);
  CHECK_THROWS_AS(nccl.barrier(stream.get()), coltrain::CommError);
  CHECK_THROWS_WITH(nccl.allreduce(buffer.get(), buffer.get(), 1, DataType::kFloat32, stream.get()),
                    Contains("aborted after an earlier error"));
}

TEST_CASE("an init that a rank never joins times out instead of hanging", "[nccl]") {
  ncclUniqueId id;
  COLTRAIN_CHECK_NCCL(ncclGetUniqueId(&id));
  const coltrain::Stopwatch watch;
  bool timed_out = false;
  try {
    NcclBackend(0, 2, id, 0, options_with_timeout(2s));
  } catch (const coltrain::TimeoutError& e) {
    timed_out = true;
    CHECK_THAT(e.what(),
               Contains("NCCL init on rank 0 of 2") && Contains("not all 2 ranks joined"));
  }
  CHECK(timed_out);
  CHECK(watch.seconds() >= 2.0);
  CHECK(watch.seconds() < 30.0);
}

TEST_CASE("work still enqueued when a communicator goes is flushed, and a move keeps it working",
          "[nccl]") {
  const Stream stream;
  std::mt19937 random(19);
  constexpr std::size_t kCount = std::size_t{1} << 22;
  const Bytes input = random_elements(DataType::kFloat32, kCount, random);
  DeviceBuffer in(input.size());
  DeviceBuffer out(input.size());
  in.upload(input);
  out.poison();
  {
    NcclBackend first = one_rank();
    NcclBackend second = std::move(first);
    CHECK_THROWS_WITH(first.barrier(stream.get()), Contains("moved from"));
    second.allreduce(in.get(), out.get(), kCount, DataType::kFloat32, stream.get());
  }
  COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  CHECK_SAME_ELEMENTS(out.download(), input, DataType::kFloat32);
}

TEST_CASE("the front door: from_env(kNccl) runs device spans on NCCL, host spans on TCP",
          "[nccl][tcp]") {
  using coltrain::comm::Backend;
  using coltrain::comm::Communicator;
  using coltrain::comm::Memory;
  // Rank 0 of 1 (no launcher variables): the TCP rendezvous opens no socket.
  Communicator comm = Communicator::from_env(Backend::kNccl, options_with_timeout(60s));
  CHECK(comm.backend() == Backend::kNccl);
  CHECK(comm.host_backend() == Backend::kTcp);
  CHECK(comm.stream_ordered());
  CHECK(comm.size() == 1);
  CHECK(comm.nccl().device() == 0);
  CHECK(comm.stream() == nullptr);
  const Stream stream;
  comm.set_stream(stream.get());
  CHECK(comm.stream() == stream.get());
  std::mt19937 random(23);

  for (const Algorithm algorithm :
       {Algorithm::kAutomatic, Algorithm::kNative, Algorithm::kRing, Algorithm::kTree}) {
    for (const std::size_t count :
         {std::size_t{0}, std::size_t{1000}, (std::size_t{3} << 20) + 5}) {
      CAPTURE(std::string(coltrain::comm::name_of(algorithm)), count);
      const Bytes input = random_elements(DataType::kFloat32, count, random);
      DeviceBuffer in(input.size());
      DeviceBuffer out(input.size());
      in.upload(input);
      out.poison();
      const std::span<const float> in_span(static_cast<const float*>(in.get()), count);
      const std::span<float> out_span(static_cast<float*>(out.get()), count);
      comm.allreduce(in_span, out_span, ReduceOp::kAvg, algorithm);
      comm.synchronize();
      CHECK_SAME_ELEMENTS(out.download(), input, DataType::kFloat32);
      comm.allreduce(out_span, ReduceOp::kMax, algorithm);  // in place, ordered after the first
      comm.synchronize();
      CHECK_SAME_ELEMENTS(out.download(), input, DataType::kFloat32);
    }
  }

  const Bytes input = random_elements(DataType::kInt64, 999, random);
  DeviceBuffer in(input.size());
  DeviceBuffer out(input.size());
  in.upload(input);
  const std::span<const std::int64_t> in_span(static_cast<const std::int64_t*>(in.get()), 999);
  const std::span<std::int64_t> out_span(static_cast<std::int64_t*>(out.get()), 999);
  out.poison();
  comm.broadcast(std::span<std::int64_t>(static_cast<std::int64_t*>(in.get()), 999), 0);
  comm.allgather(in_span, out_span);
  comm.synchronize();
  CHECK_SAME_ELEMENTS(out.download(), input, DataType::kInt64);
  out.poison();
  comm.reduce_scatter(in_span, out_span, ReduceOp::kSum);
  comm.synchronize();
  CHECK_SAME_ELEMENTS(out.download(), input, DataType::kInt64);
  out.poison();
  comm.reduce(in_span, out_span, 0, ReduceOp::kMin);
  comm.synchronize();
  CHECK_SAME_ELEMENTS(out.download(), input, DataType::kInt64);

  // Host spans on the same communicator go to its TCP bootstrap and return with the result.
  std::vector<double> metrics{1.5, -2.0, 3.25};
  comm.allreduce(std::span(metrics), ReduceOp::kSum);
  CHECK(metrics == std::vector<double>{1.5, -2.0, 3.25});
  comm.barrier();

  CHECK_THROWS_WITH(
      comm.broadcast(std::span<std::int64_t>(static_cast<std::int64_t*>(out.get()), 999), 0,
                     Algorithm::kRing),
      Contains("broadcast on NCCL device buffers has no algorithm 'ring'"));
  std::vector<std::int64_t> host_output(999);
  CHECK_THROWS_WITH(comm.allreduce(in_span, std::span(host_output)),
                    Contains("input is device memory but output is host memory"));
  CHECK_THROWS_WITH(comm.allreduce(std::span<float>(static_cast<float*>(out.get()), 4),
                                   ReduceOp::kSum, Algorithm::kHalvingDoubling),
                    Contains("has no algorithm 'halving_doubling' on NCCL"));
  CHECK(comm.choose(coltrain::comm::Collective::kAllreduce, std::size_t{1} << 20,
                    Memory::kDevice) == Algorithm::kNative);
}

TEST_CASE("the front door with device memory asked for picks NCCL, and COLTRAIN_BACKEND=nccl too",
          "[nccl][tcp]") {
  using coltrain::comm::Backend;
  using coltrain::comm::Communicator;
  using coltrain::comm::Memory;
  ::unsetenv("COLTRAIN_BACKEND");
  {
    Communicator device = Communicator::from_env({}, options_with_timeout(60s), Memory::kDevice);
    CHECK(device.backend() == Backend::kNccl);
    Communicator host = Communicator::from_env({}, options_with_timeout(60s));
    CHECK(host.backend() == Backend::kTcp);
    CHECK_FALSE(host.stream_ordered());
  }
  ::setenv("COLTRAIN_BACKEND", "nccl", 1);
  Communicator named = Communicator::from_env({}, options_with_timeout(60s));
  ::unsetenv("COLTRAIN_BACKEND");
  CHECK(named.backend() == Backend::kNccl);
  DeviceBuffer data(64 * sizeof(float));
  named.allreduce(std::span<float>(static_cast<float*>(data.get()), 64));
  named.synchronize();
}

TEST_CASE("split on NCCL: ncclCommSplit gives a working one-rank child, a negative color none",
          "[nccl][tcp]") {
  using coltrain::comm::Backend;
  using coltrain::comm::Communicator;
  Communicator parent = Communicator::from_env(Backend::kNccl, options_with_timeout(60s));
  CHECK_FALSE(parent.split(-1, 0).has_value());
  std::optional<Communicator> child = parent.split(7, 3);
  REQUIRE(child.has_value());
  CHECK(child->backend() == Backend::kNccl);
  CHECK(child->size() == 1);
  CHECK(child->rank() == 0);
  std::mt19937 random(29);
  const Bytes input = random_elements(DataType::kFloat32, 4097, random);
  DeviceBuffer in(input.size());
  DeviceBuffer out(input.size());
  in.upload(input);
  out.poison();
  const std::span<const float> in_span(static_cast<const float*>(in.get()), 4097);
  const std::span<float> out_span(static_cast<float*>(out.get()), 4097);
  // Calls on the child and the parent interleave; each communicator's results stay its own.
  child->allreduce(in_span, out_span, ReduceOp::kSum);
  parent.allreduce(out_span, ReduceOp::kMax);
  child->synchronize();
  parent.synchronize();
  CHECK_SAME_ELEMENTS(out.download(), input, DataType::kFloat32);
  std::vector<int> host{4, 5};
  child->allreduce(std::span(host), ReduceOp::kSum);  // host spans on the child's TCP bootstrap
  CHECK(host == std::vector<int>{4, 5});
}

TEST_CASE("one rank: exchange, and alltoall(v), gather, scatter, allgatherv through the front door",
          "[nccl][tcp]") {
  using coltrain::comm::Backend;
  using coltrain::comm::Communicator;
  using coltrain::comm::PeerReceive;
  using coltrain::comm::PeerSend;
  std::mt19937 random(31);
  {  // raw: three sends to this rank meet its three receives in order, in one group
    NcclBackend nccl = one_rank();
    const Stream stream;
    const Bytes input = random_elements(DataType::kFloat16, 3000, random);
    DeviceBuffer in(input.size());
    DeviceBuffer out(input.size());
    in.upload(input);
    out.poison();
    auto* source = static_cast<const std::byte*>(in.get());
    auto* target = static_cast<std::byte*>(out.get());
    // Pieces of 1000, 0 and 2000 elements, received in reverse places.
    const PeerSend sends[] = {{0, source, 2000}, {0, source + 2000, 0}, {0, source + 2000, 4000}};
    const PeerReceive receives[] = {{0, target + 4000, 2000}, {0, target, 0}, {0, target, 4000}};
    nccl.exchange(coltrain::comm::Collective::kSendRecv, 3000, DataType::kFloat16, sends, receives,
                  stream.get());
    nccl.synchronize(stream.get());
    Bytes expected(input.begin() + 2000, input.end());
    expected.insert(expected.end(), input.begin(), input.begin() + 2000);
    CHECK_SAME_ELEMENTS(out.download(), expected, DataType::kFloat16);
    const PeerSend stranger[] = {{1, source, 2}};
    CHECK_THROWS_WITH(nccl.exchange(coltrain::comm::Collective::kSendRecv, 1, DataType::kFloat16,
                                    stranger, {}, stream.get()),
                      Contains("peer 1 is not a rank of this 1-rank communicator"));
  }
  Communicator comm = Communicator::from_env(Backend::kNccl, options_with_timeout(60s));
  const Stream stream;
  comm.set_stream(stream.get());
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{4099}}) {
    CAPTURE(count);
    const Bytes input = random_elements(DataType::kInt32, count, random);
    DeviceBuffer in(input.size());
    DeviceBuffer out(input.size() + sizeof(std::int32_t));
    in.upload(input);
    const std::span<const std::int32_t> in_span(static_cast<const std::int32_t*>(in.get()), count);
    const std::span<std::int32_t> out_span(static_cast<std::int32_t*>(out.get()), count);
    const auto check = [&](const Bytes& expected) {
      comm.synchronize();
      CHECK_SAME_ELEMENTS(out.download(), expected, DataType::kInt32);
      out.poison();
    };
    Bytes poisoned_tail = input;
    poisoned_tail.resize(input.size() + sizeof(std::int32_t), std::byte{0xff});
    out.poison();
    comm.alltoall(in_span, out_span);
    check(poisoned_tail);
    comm.gather(in_span, out_span, 0);
    check(poisoned_tail);
    comm.scatter(in_span, out_span, 0);
    check(poisoned_tail);
    const std::size_t counts[] = {count};
    comm.allgatherv(in_span, out_span, std::span<const std::size_t>(counts));
    check(poisoned_tail);
    // alltoallv into the output's second element on: its first keeps the poison.
    const std::size_t at_start[] = {0};
    const std::size_t shifted[] = {1};
    const std::span<std::int32_t> longer(static_cast<std::int32_t*>(out.get()), count + 1);
    comm.alltoallv(in_span, std::span<const std::size_t>(counts),
                   std::span<const std::size_t>(at_start), longer,
                   std::span<const std::size_t>(counts), std::span<const std::size_t>(shifted));
    Bytes shifted_input(sizeof(std::int32_t), std::byte{0xff});
    shifted_input.insert(shifted_input.end(), input.begin(), input.end());
    check(shifted_input);
    out.upload(poisoned_tail);
    comm.alltoall(out_span);  // in place
    check(poisoned_tail);
  }
  const std::span<float> device_floats(static_cast<float*>(nullptr), 0);
  CHECK_THROWS_WITH(
      comm.alltoall(std::span<const float>(device_floats), device_floats, Algorithm::kPairwise),
      Contains("alltoall on NCCL device buffers has no algorithm 'pairwise'"));
}
