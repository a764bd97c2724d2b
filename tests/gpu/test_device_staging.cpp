// Communicator's device buffers over TCP, staged through pinned memory: 2 TCP ranks (threads of
// this process, sharing the one GPU and its CUDA context) call the collectives with device spans
// filled with random data, and
// each rank compares its result with a host reference in double precision: relative error
// ||out - ref|| / ||ref|| within 1e-5 for f32 and f64, 1e-2 for f16 and bf16, integers exact.
// Outputs are poisoned with 0xFF bytes (NaN, or -1 for the positive integer inputs) before each
// call, so unwritten elements fail. Sizes: odd ones under a chunk, and arrays of many chunks.
#include <catch2/catch.hpp>

#include "../support/thread_ranks.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using coltrain::testing::expect;

namespace {

constexpr int kRanks = 2;

template <class T>
constexpr bool kNarrow = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <class T>
double as_double(T v) {
  if constexpr (kNarrow<T>) {
    return static_cast<float>(v);
  } else {
    return static_cast<double>(v);
  }
}

template <class T>
T from_double(double v) {
  if constexpr (kNarrow<T>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
double tolerance() {
  if constexpr (kNarrow<T>) return 1e-2;
  if constexpr (std::is_floating_point_v<T>) return 1e-5;
  return 0;
}

// Rank r's input for a case: random, never zero (floats in +-[0.25, 1], integers in 1..1000), the
// same on every rank that draws it, so that each rank can compute the reference for all.
template <class T>
std::vector<T> random_input(int rank, std::size_t count, std::uint64_t salt) {
  std::mt19937_64 engine(salt * 1000003u + static_cast<std::uint64_t>(rank) * 7919u + count);
  std::vector<T> values(count);
  if constexpr (std::is_integral_v<T>) {
    std::uniform_int_distribution<int> draw(1, 1000);
    for (T& v : values) v = static_cast<T>(draw(engine));
  } else {
    std::uniform_real_distribution<double> magnitude(0.25, 1.0);
    std::bernoulli_distribution negative(0.5);
    for (T& v : values)
      v = from_double<T>(negative(engine) ? -magnitude(engine) : magnitude(engine));
  }
  return values;
}

// ||actual - expected|| / ||expected||; NaN (never within a tolerance) when actual has a NaN.
template <class T>
double relative_error(const std::vector<T>& actual, const std::vector<double>& expected) {
  double difference = 0;
  double norm = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double d = as_double(actual[i]) - expected[i];
    difference += d * d;
    norm += expected[i] * expected[i];
  }
  return norm == 0 ? std::sqrt(difference) : std::sqrt(difference / norm);
}

template <class T>
void expect_close(const std::vector<T>& actual, const std::vector<double>& expected,
                  const std::string& what) {
  const double error = relative_error(actual, expected);
  expect(error <= tolerance<T>(), what + " (" + std::string(name_of(data_type_v<T>)) + ", " +
                                      std::to_string(expected.size()) +
                                      " elements): relative error " + std::to_string(error));
}

// `count` elements of device memory, freed on scope exit.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t count) : count_(count) {
    COLTRAIN_CHECK_CUDA(cudaMalloc(&data_, std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }

  std::span<T> span() { return {data_, count_}; }
  void upload(const std::vector<T>& values) {
    COLTRAIN_CHECK_CUDA(cudaMemcpy(data_, values.data(), count_ * sizeof(T), cudaMemcpyDefault));
  }
  // Waits for the memset, which may run asynchronously and would race a non-blocking stream.
  void poison() {
    COLTRAIN_CHECK_CUDA(cudaMemset(data_, 0xFF, count_ * sizeof(T)));
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
  }
  std::vector<T> download() const {
    std::vector<T> values(count_);
    COLTRAIN_CHECK_CUDA(cudaMemcpy(values.data(), data_, count_ * sizeof(T), cudaMemcpyDefault));
    return values;
  }

 private:
  T* data_ = nullptr;
  std::size_t count_;
};

// Each rank's element i summed over the ranks, in double.
template <class T>
std::vector<double> sum_of_inputs(std::size_t count, std::uint64_t salt) {
  std::vector<double> sum(count, 0.0);
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<T> in = random_input<T>(r, count, salt);
    for (std::size_t i = 0; i < count; ++i) sum[i] += as_double(in[i]);
  }
  return sum;
}

template <class T>
void check_allreduce(Communicator& comm, std::size_t count, std::uint64_t salt) {
  const int rank = comm.rank();
  const std::string at = "allreduce at " + std::to_string(count) + " elements, chunks of " +
                         std::to_string(comm.staging_options().chunk_bytes) + " B";
  const std::vector<T> mine = random_input<T>(rank, count, salt);
  const std::vector<double> expected = sum_of_inputs<T>(count, salt);
  DeviceArray<T> input(count);
  DeviceArray<T> output(count);
  input.upload(mine);
  output.poison();
  comm.allreduce(std::span<const T>(input.span()), output.span());
  expect_close(output.download(), expected, at);
  expect(input.download() == mine || count == 0, at + ": the input changed");
  output.upload(mine);  // in place
  comm.allreduce(output.span());
  expect_close(output.download(), expected, at + ", in place");
}

template <class T>
void check_allreduce_sizes(Communicator& comm) {
  StagingOptions small;
  small.chunk_bytes = 64 << 10;
  small.min_chunk_bytes = 16 << 10;
  comm.set_staging_options(small);
  std::uint64_t salt = 1;
  for (std::size_t count : {0, 1, 7, 1023, 16411, 100003, 1000037}) {
    check_allreduce<T>(comm, count, salt++);
  }
  comm.set_staging_options({});  // 4 MiB chunks: 3 for 12 MiB of f32
  check_allreduce<T>(comm, 3000017, salt++);
}

}  // namespace

TEST_CASE("staged allreduce of device buffers matches a host reference, 2 TCP ranks on one GPU",
          "[gpu][staging]") {
  const auto failures = coltrain::testing::run_thread_ranks(kRanks, [](Communicator& comm) {
    COLTRAIN_CHECK_CUDA(cudaSetDevice(0));
    expect(comm.backend() == Backend::kTcp && !comm.stream_ordered(), "a blocking TCP backend");
    check_allreduce_sizes<float>(comm);
    check_allreduce_sizes<half>(comm);
    check_allreduce_sizes<bfloat16>(comm);
    check_allreduce_sizes<std::int32_t>(comm);
    check_allreduce_sizes<double>(comm);
  });
  INFO(coltrain::testing::joined(failures));
  CHECK(coltrain::testing::joined(failures).empty());
}

TEST_CASE("staged broadcast, allgather, reduce_scatter and reduce of device buffers",
          "[gpu][staging]") {
  const auto failures = coltrain::testing::run_thread_ranks(kRanks, [](Communicator& comm) {
    COLTRAIN_CHECK_CUDA(cudaSetDevice(0));
    StagingOptions small;
    small.chunk_bytes = 4 << 10;
    small.min_chunk_bytes = 1 << 10;
    comm.set_staging_options(small);
    const int rank = comm.rank();
    for (std::size_t count : {std::size_t{1}, std::size_t{1001}, std::size_t{50021}}) {
      const std::string at = " at " + std::to_string(count) + " elements";
      const auto n = static_cast<std::size_t>(kRanks);
      for (int root = 0; root < kRanks; ++root) {
        const std::vector<float> source = random_input<float>(root, count, 11);
        DeviceArray<float> data(count);
        if (rank == root) {
          data.upload(source);
        } else {
          data.poison();
        }
        comm.broadcast(data.span(), root);
        expect(data.download() == source, "broadcast from " + std::to_string(root) + at);
      }
      {
        DeviceArray<float> input(count);
        DeviceArray<float> output(n * count);
        input.upload(random_input<float>(rank, count, 12));
        output.poison();
        comm.allgather(std::span<const float>(input.span()), output.span());
        std::vector<float> expected;
        for (int r = 0; r < kRanks; ++r) {
          const std::vector<float> block = random_input<float>(r, count, 12);
          expected.insert(expected.end(), block.begin(), block.end());
        }
        expect(output.download() == expected, "allgather" + at);
      }
      {
        DeviceArray<float> input(n * count);
        DeviceArray<float> output(count);
        input.upload(random_input<float>(rank, n * count, 13));
        output.poison();
        comm.reduce_scatter(std::span<const float>(input.span()), output.span());
        const std::vector<double> sums = sum_of_inputs<float>(n * count, 13);
        const auto first = static_cast<std::ptrdiff_t>(count * static_cast<std::size_t>(rank));
        expect_close(output.download(),
                     std::vector<double>(sums.begin() + first,
                                         sums.begin() + first + static_cast<std::ptrdiff_t>(count)),
                     "reduce_scatter" + at);
      }
      for (int root = 0; root < kRanks; ++root) {
        DeviceArray<float> input(count);
        DeviceArray<float> output(count);
        input.upload(random_input<float>(rank, count, 14));
        output.poison();
        comm.reduce(std::span<const float>(input.span()), output.span(), root);
        if (rank == root) {
          expect_close(output.download(), sum_of_inputs<float>(count, 14), "reduce" + at);
        }
      }
    }
  });
  INFO(coltrain::testing::joined(failures));
  CHECK(coltrain::testing::joined(failures).empty());
}

TEST_CASE("a staged call comes after the work queued on its caller's stream", "[gpu][staging]") {
  const auto failures = coltrain::testing::run_thread_ranks(kRanks, [](Communicator& comm) {
    COLTRAIN_CHECK_CUDA(cudaSetDevice(0));
    cudaStream_t stream = nullptr;
    COLTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void* pinned = nullptr;
    try {
      // 64 MiB: an upload that is still running when the staged call starts, unless it waits.
      const std::size_t count = std::size_t{16} << 20;
      const std::vector<float> mine = random_input<float>(comm.rank(), count, 21);
      COLTRAIN_CHECK_CUDA(cudaMallocHost(&pinned, count * sizeof(float)));
      std::copy(mine.begin(), mine.end(), static_cast<float*>(pinned));
      DeviceArray<float> data(count);
      data.poison();
      comm.set_stream(stream);
      expect(comm.stream() == stream, "set_stream sets the stream");
      COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(data.span().data(), pinned, count * sizeof(float),
                                          cudaMemcpyHostToDevice, stream));
      comm.allreduce(data.span());
      comm.synchronize();  // staged calls have finished already: returns at once
      expect_close(data.download(), sum_of_inputs<float>(count, 21), "allreduce after an upload");
      // Host spans on the same communicator still run on the host, and a moved communicator
      // stages through its own stager.
      std::vector<double> metrics{1.0, 2.0};
      comm.allreduce(std::span(metrics));
      expect(metrics == std::vector<double>{2.0, 4.0}, "host allreduce beside device ones");
      Communicator moved = std::move(comm);
      moved.allreduce(data.span(), ReduceOp::kMax);
      expect_close(data.download(), sum_of_inputs<float>(count, 21), "allreduce after a move");
    } catch (...) {
      cudaStreamSynchronize(stream);
      cudaFreeHost(pinned);
      cudaStreamDestroy(stream);
      throw;
    }
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
    COLTRAIN_CHECK_CUDA(cudaFreeHost(pinned));
    COLTRAIN_CHECK_CUDA(cudaStreamDestroy(stream));
  });
  INFO(coltrain::testing::joined(failures));
  CHECK(coltrain::testing::joined(failures).empty());
}

namespace {

// Rank `from`'s block for rank `to` in the block collectives below.
template <class T>
std::vector<T> block_for(int from, int to, std::size_t count) {
  return random_input<T>(from, count, 100 + static_cast<std::uint64_t>(to));
}

template <class T>
std::vector<T> joined_blocks(const std::vector<std::vector<T>>& blocks) {
  std::vector<T> all;
  for (const std::vector<T>& block : blocks) all.insert(all.end(), block.begin(), block.end());
  return all;
}

// alltoall (out of place, in place, non-blocking), alltoallv, gather, scatter and allgatherv on
// device buffers: each moves bytes without arithmetic, so results are compared exactly.
template <class T>
void check_block_collectives(Communicator& comm, std::size_t count) {
  const int rank = comm.rank();
  const int ranks = comm.size();
  const auto n = static_cast<std::size_t>(ranks);
  const std::string at = " (" + std::string(name_of(data_type_v<T>)) + ", " +
                         std::to_string(ranks) + " ranks, " + std::to_string(count) + " elements)";
  {
    std::vector<std::vector<T>> mine;
    std::vector<std::vector<T>> theirs;
    for (int j = 0; j < ranks; ++j) {
      mine.push_back(block_for<T>(rank, j, count));
      theirs.push_back(block_for<T>(j, rank, count));
    }
    const std::vector<T> expected = joined_blocks(theirs);
    DeviceArray<T> input(n * count);
    DeviceArray<T> output(n * count);
    input.upload(joined_blocks(mine));
    output.poison();
    comm.alltoall(std::span<const T>(input.span()), output.span());
    expect(output.download() == expected, "alltoall" + at);
    output.poison();
    comm.ialltoall(std::span<const T>(input.span()), output.span()).wait();
    expect(output.download() == expected, "ialltoall" + at);
    comm.alltoall(input.span());
    expect(input.download() == expected, "alltoall in place" + at);
  }
  {  // alltoallv: rank f sends rank t count + (f + 2t) % 3 elements; a poisoned element between
    std::vector<std::size_t> send_counts(n), send_displacements(n), recv_counts(n),
        recv_displacements(n);
    std::vector<T> sent;
    std::size_t recv_total = 0;
    const T poison = static_cast<T>(-1);
    for (int j = 0; j < ranks; ++j) {
      const auto u = static_cast<std::size_t>(j);
      send_counts[u] = count + static_cast<std::size_t>(rank + 2 * j) % 3;
      recv_counts[u] = count + static_cast<std::size_t>(j + 2 * rank) % 3;
      sent.push_back(poison);
      send_displacements[u] = sent.size();
      const std::vector<T> block = block_for<T>(rank, j, send_counts[u]);
      sent.insert(sent.end(), block.begin(), block.end());
      recv_displacements[u] = recv_total + 1;
      recv_total += recv_counts[u] + 1;
    }
    DeviceArray<T> input(sent.size());
    DeviceArray<T> output(recv_total);
    input.upload(sent);
    output.upload(std::vector<T>(recv_total, poison));
    comm.alltoallv(std::span<const T>(input.span()), std::span<const std::size_t>(send_counts),
                   std::span<const std::size_t>(send_displacements), output.span(),
                   std::span<const std::size_t>(recv_counts),
                   std::span<const std::size_t>(recv_displacements));
    std::vector<T> expected;
    for (int j = 0; j < ranks; ++j) {
      expected.push_back(poison);  // the gap stays as it was
      const std::vector<T> block = block_for<T>(j, rank, recv_counts[static_cast<std::size_t>(j)]);
      expected.insert(expected.end(), block.begin(), block.end());
    }
    expect(output.download() == expected, "alltoallv" + at);
  }
  for (int root = 0; root < ranks; ++root) {
    const std::vector<T> mine = block_for<T>(rank, root, count);
    DeviceArray<T> input(count);
    DeviceArray<T> output(rank == root ? n * count : 0);
    input.upload(mine);
    output.poison();
    comm.gather(std::span<const T>(input.span()), output.span(), root);
    if (rank == root) {
      std::vector<std::vector<T>> blocks;
      for (int j = 0; j < ranks; ++j) blocks.push_back(block_for<T>(j, root, count));
      expect(output.download() == joined_blocks(blocks), "gather to " + std::to_string(root) + at);
    }
  }
  for (int root = 0; root < ranks; ++root) {
    DeviceArray<T> input(rank == root ? n * count : 0);
    DeviceArray<T> output(count);
    if (rank == root) {
      std::vector<std::vector<T>> blocks;
      for (int j = 0; j < ranks; ++j) blocks.push_back(block_for<T>(root, j, count));
      input.upload(joined_blocks(blocks));
    }
    output.poison();
    comm.scatter(std::span<const T>(input.span()), output.span(), root);
    expect(output.download() == block_for<T>(root, rank, count),
           "scatter from " + std::to_string(root) + at);
  }
  {
    std::vector<std::size_t> counts(n);
    std::vector<std::vector<T>> blocks;
    for (std::size_t j = 0; j < n; ++j) {
      counts[j] = count + j % 2;
      blocks.push_back(block_for<T>(static_cast<int>(j), -1, counts[j]));
    }
    const std::vector<T> expected = joined_blocks(blocks);
    DeviceArray<T> input(counts[static_cast<std::size_t>(rank)]);
    DeviceArray<T> output(expected.size());
    input.upload(blocks[static_cast<std::size_t>(rank)]);
    output.poison();
    comm.allgatherv(std::span<const T>(input.span()), output.span(),
                    std::span<const std::size_t>(counts));
    expect(output.download() == expected, "allgatherv" + at);
  }
}

// send/recv of device buffers: every rank posts its receive from the left and its send to the
// right before waiting (which would deadlock if either completed before returning), then rank 0
// posts rank 1 two tagged messages that rank 1 receives in the other order, each blocking.
void check_device_messages(Communicator& comm, std::size_t count) {
  const int rank = comm.rank();
  const int ranks = comm.size();
  const int right = (rank + 1) % ranks;
  const int left = (rank + ranks - 1) % ranks;
  const std::string at = " (" + std::to_string(count) + " elements)";
  DeviceArray<float> outgoing(count);
  DeviceArray<float> incoming(count);
  outgoing.upload(block_for<float>(rank, right, count));
  incoming.poison();
  Request received = comm.irecv(incoming.span(), left, 3);
  Request sent = comm.isend(std::span<const float>(outgoing.span()), right, 3);
  sent.wait();
  received.wait();
  expect(incoming.download() == block_for<float>(left, rank, count), "isend/irecv ring" + at);
  expect(outgoing.download() == block_for<float>(rank, right, count),
         "isend leaves its buffer as it was" + at);
  DeviceArray<std::int64_t> first(count);
  DeviceArray<std::int64_t> second(count + 1);
  if (rank == 0) {
    first.upload(block_for<std::int64_t>(0, 11, count));
    second.upload(block_for<std::int64_t>(0, 12, count + 1));
    const Request requests[] = {comm.isend(std::span<const std::int64_t>(first.span()), 1, 11),
                                comm.isend(std::span<const std::int64_t>(second.span()), 1, 12)};
    wait_all(requests);
  } else if (rank == 1) {
    first.poison();
    second.poison();
    comm.recv(second.span(), 0, 12);
    comm.recv(first.span(), 0, 11);
    expect(first.download() == block_for<std::int64_t>(0, 11, count), "tag 11" + at);
    expect(second.download() == block_for<std::int64_t>(0, 12, count + 1), "tag 12" + at);
  }
}

}  // namespace

TEST_CASE("staged alltoall(v), gather, scatter, allgatherv and send/recv of device buffers",
          "[gpu][staging]") {
  for (int ranks : {2, 3}) {
    INFO(ranks << " ranks");
    const auto failures = coltrain::testing::run_thread_ranks(ranks, [](Communicator& comm) {
      COLTRAIN_CHECK_CUDA(cudaSetDevice(0));
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{1001},
                                std::size_t{300007}}) {
        check_block_collectives<float>(comm, count);
        check_block_collectives<std::int64_t>(comm, count);
        check_block_collectives<double>(comm, count);
        check_device_messages(comm, count);
      }
    });
    INFO(coltrain::testing::joined(failures));
    CHECK(coltrain::testing::joined(failures).empty());
  }
}

TEST_CASE("staged non-blocking calls on device buffers start after the stream's work when issued, "
          "and complete in order",
          "[gpu][staging]") {
  const auto failures = coltrain::testing::run_thread_ranks(kRanks, [](Communicator& comm) {
    COLTRAIN_CHECK_CUDA(cudaSetDevice(0));
    cudaStream_t stream = nullptr;
    COLTRAIN_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void* pinned = nullptr;
    try {
      // 64 MiB uploaded on the stream and issued at once: the queued call must wait for it.
      const std::size_t count = std::size_t{16} << 20;
      const std::size_t small = 1001;
      const std::vector<float> mine = random_input<float>(comm.rank(), count, 31);
      const std::vector<float> few = random_input<float>(comm.rank(), small, 32);
      COLTRAIN_CHECK_CUDA(cudaMallocHost(&pinned, (count + small) * sizeof(float)));
      auto* host = static_cast<float*>(pinned);
      std::copy(mine.begin(), mine.end(), host);
      std::copy(few.begin(), few.end(), host + count);
      DeviceArray<float> data(count);
      DeviceArray<float> second(small);
      data.poison();
      second.poison();
      comm.set_stream(stream);
      COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(data.span().data(), host, count * sizeof(float),
                                          cudaMemcpyHostToDevice, stream));
      const Request first = comm.iallreduce(data.span());
      COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(second.span().data(), host + count,
                                          small * sizeof(float), cudaMemcpyHostToDevice, stream));
      const Request later = comm.iallreduce(second.span(), ReduceOp::kMax);
      // A blocking call first waits for the requests issued before it.
      std::vector<double> metrics{1.0, 2.0};
      comm.allreduce(std::span(metrics));
      expect(first.test() && later.test(), "a blocking call after two requests found them done");
      expect(metrics == std::vector<double>{2.0, 4.0}, "the host allreduce after the requests");
      expect_close(data.download(), sum_of_inputs<float>(count, 31), "iallreduce after an upload");
      std::vector<double> largest(small);
      for (int r = 0; r < kRanks; ++r) {
        const std::vector<float> theirs = random_input<float>(r, small, 32);
        for (std::size_t i = 0; i < small; ++i) {
          largest[i] = r == 0 ? theirs[i] : std::max<double>(largest[i], theirs[i]);
        }
      }
      expect_close(second.download(), largest, "a second request, issued after a later upload");
    } catch (...) {
      cudaStreamSynchronize(stream);
      cudaFreeHost(pinned);
      cudaStreamDestroy(stream);
      throw;
    }
    COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(stream));
    COLTRAIN_CHECK_CUDA(cudaFreeHost(pinned));
    COLTRAIN_CHECK_CUDA(cudaStreamDestroy(stream));
  });
  INFO(coltrain::testing::joined(failures));
  CHECK(coltrain::testing::joined(failures).empty());
}
