// The staging pipeline without a GPU: the chunk plan, and every staged collective over TCP ranks
// (threads) with a Stager that copies with memcpy and checks that each copy stays inside its slot.
// Inputs are small integers, exact in every element type in any order of reduction, so results
// are compared bit for bit; outputs are poisoned first so that unwritten elements show.
// Deterministic mode's case uses random floats, whose sums differ with the order of addition.
#include <catch2/catch.hpp>

#include "../support/thread_ranks.hpp"

#include <coltrain/comm/device/staged_collectives.hpp>
#include <coltrain/core/dtype.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using coltrain::testing::expect;

namespace {

// ---- the plan ----

// Every chunk in order, contiguous, none empty unless the count is 0, none over the plan's size.
void check_plan_covers(const ChunkPlan& plan, std::size_t count) {
  REQUIRE(plan.count == count);
  REQUIRE(plan.chunks >= 1);
  REQUIRE(plan.elements >= 1);
  std::size_t next = 0;
  for (std::size_t k = 0; k < plan.chunks; ++k) {
    const StagedChunk chunk = plan.chunk(k);
    REQUIRE(chunk.begin == next);
    REQUIRE(chunk.size <= plan.elements);
    if (count > 0) REQUIRE(chunk.size > 0);
    next += chunk.size;
  }
  REQUIRE(next == count);
}

}  // namespace

TEST_CASE("plan_chunks: one empty chunk for nothing, so every rank still calls", "[staging]") {
  const ChunkPlan plan = plan_chunks(0, 4, 1, {});
  check_plan_covers(plan, 0);
  CHECK(plan.chunks == 1);
  CHECK(plan.chunk(0).size == 0);
}

TEST_CASE("plan_chunks: chunks of chunk_bytes over all blocks for large arrays", "[staging]") {
  const StagingOptions options;  // 4 MiB
  const ChunkPlan plan = plan_chunks((std::size_t{64} << 20) / 4 + 3, 4, 1, options);
  check_plan_covers(plan, plan.count);
  CHECK(plan.elements == options.chunk_bytes / 4);
  CHECK(plan.chunks == 17);  // 16 full chunks and 3 elements
  CHECK(plan.chunk(16).size == 3);

  const ChunkPlan blocked = plan_chunks(std::size_t{16} << 20, 2, 4, options);  // 4 ranks of f16
  check_plan_covers(blocked, blocked.count);
  CHECK(blocked.elements * 2 * 4 == options.chunk_bytes);
}

TEST_CASE("plan_chunks: mid-sized arrays in min_chunks chunks of at least min_chunk_bytes",
          "[staging]") {
  const StagingOptions options;  // at least 4 chunks of at least 256 KiB
  const ChunkPlan two_mib = plan_chunks((std::size_t{2} << 20) / 4, 4, 1, options);
  check_plan_covers(two_mib, two_mib.count);
  CHECK(two_mib.chunks == 4);
  CHECK(two_mib.elements * 4 == std::size_t{512} << 10);

  const ChunkPlan half_mib = plan_chunks((std::size_t{512} << 10) / 4, 4, 1, options);
  CHECK(half_mib.chunks == 2);  // 4 chunks would be under 256 KiB
  const ChunkPlan small = plan_chunks(1000, 4, 1, options);
  CHECK(small.chunks == 1);
  CHECK(small.elements == 1000);
}

TEST_CASE("plan_chunks: at least one element per block when an element exceeds the chunk",
          "[staging]") {
  StagingOptions options;
  options.chunk_bytes = 16;
  const ChunkPlan plan = plan_chunks(5, 8, 4, options);  // a row of 4 blocks is 32 bytes
  check_plan_covers(plan, 5);
  CHECK(plan.elements == 1);
  CHECK(plan.chunks == 5);
}

TEST_CASE("plan_chunks: covers every count with odd chunk sizes", "[staging]") {
  StagingOptions options;
  options.chunk_bytes = 28;  // 7 floats
  options.min_chunk_bytes = 12;
  for (std::size_t blocks : {1, 2, 3}) {
    for (std::size_t count = 0; count < 200; ++count) {
      INFO("blocks " << blocks << ", count " << count);
      const ChunkPlan plan = plan_chunks(count, 4, blocks, options);
      check_plan_covers(plan, count);
      CHECK((plan.elements * blocks * 4 <= options.chunk_bytes || plan.elements == 1));
    }
  }
}

TEST_CASE("plan_chunks: rejects options that cannot make progress", "[staging]") {
  StagingOptions zero_chunk;
  zero_chunk.chunk_bytes = 0;
  CHECK_THROWS_AS(plan_chunks(10, 4, 1, zero_chunk), InvalidArgument);
  StagingOptions zero_min;
  zero_min.min_chunks = 0;
  CHECK_THROWS_AS(plan_chunks(10, 4, 1, zero_min), InvalidArgument);
  CHECK_THROWS_AS(plan_chunks(10, 0, 1, {}), InvalidArgument);
}

namespace {

// ---- a host Stager ----

// Copies at once with memcpy. Slots are poisoned when allocated, and every copy into or out of a
// slot must stay inside it: a wrong offset in the pipeline throws instead of corrupting memory.
class MemcpyStager {
 public:
  static constexpr std::size_t kSlots = 3;

  void reserve(std::size_t bytes) {
    if (bytes <= capacity_) return;
    for (auto& slot : slots_) slot.assign((bytes + sizeof(Word) - 1) / sizeof(Word), kPoison);
    capacity_ = bytes;
  }
  std::byte* slot(std::size_t s) { return reinterpret_cast<std::byte*>(slots_.at(s).data()); }
  void begin() {
    expect(!busy_, "begin() while a call is in flight");
    busy_ = true;
  }
  void to_host(std::size_t s, const StagedCopy& copy) { run(s, copy, true); }
  void wait_host(std::size_t s) { expect(s < kSlots, "wait_host() on a slot that does not exist"); }
  void to_device(std::size_t s, const StagedCopy& copy) { run(s, copy, false); }
  void finish() { busy_ = false; }
  void abandon() noexcept { busy_ = false; }

 private:
  using Word = std::uint64_t;
  static constexpr Word kPoison = ~Word{0};

  // The copy's slot side (its destination into the slot, its source out of it) must lie in slot s.
  void run(std::size_t s, const StagedCopy& copy, bool into_slot) {
    expect(busy_ && s < kSlots, "a copy outside begin() and finish(), or to a missing slot");
    if (copy.row_bytes == 0 || copy.rows == 0) return;
    const auto* base = reinterpret_cast<const std::byte*>(slots_[s].data());
    const auto* side = static_cast<const std::byte*>(into_slot ? copy.destination : copy.source);
    const std::size_t pitch = into_slot ? copy.destination_pitch : copy.source_pitch;
    const bool inside =
        side >= base && side < base + capacity_ &&
        static_cast<std::size_t>(side - base) + (copy.rows - 1) * pitch + copy.row_bytes <=
            capacity_;
    expect(inside, "a copy " + std::string(into_slot ? "into" : "out of") + " slot " +
                       std::to_string(s) + " leaves its " + std::to_string(capacity_) + " bytes");
    for (std::size_t row = 0; row < copy.rows; ++row) {
      std::memcpy(static_cast<std::byte*>(copy.destination) + row * copy.destination_pitch,
                  static_cast<const std::byte*>(copy.source) + row * copy.source_pitch,
                  copy.row_bytes);
    }
  }

  std::array<std::vector<Word>, kSlots> slots_;
  std::size_t capacity_ = 0;
  bool busy_ = false;
};

using HostStagedCommunicator = StagedCommunicator<MemcpyStager>;

// ---- inputs and references, exact by construction ----

// Rank r's value at index i: 1 to 3, so sums over 3 ranks are exact even in bf16.
int value(int rank, std::size_t i) { return 1 + static_cast<int>((i * 7 + rank * 5 + i / 3) % 3); }

template <class T>
T element(int v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return static_cast<float>(v);
  } else {
    return static_cast<double>(v);
  }
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// The first element of `actual` that differs from `expected(i)`, as text, or empty.
template <class T, class Expected>
std::string first_difference(const std::vector<T>& actual, std::size_t first, std::size_t count,
                             Expected expected) {
  for (std::size_t i = 0; i < count; ++i) {
    if (!same_bits(actual[first + i], expected(i))) {
      return "element " + std::to_string(i) + ": got " +
             std::to_string(as_double(actual[first + i])) + ", expected " +
             std::to_string(as_double(expected(i)));
    }
  }
  return {};
}

template <class T>
std::vector<T> rank_input(int rank, std::size_t count, std::size_t offset = 0) {
  std::vector<T> in(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = element<T>(value(rank, offset + i));
  return in;
}

int sum_over_ranks(int ranks, std::size_t i) {
  int total = 0;
  for (int r = 0; r < ranks; ++r) total += value(r, i);
  return total;
}

template <class T>
void check(const std::string& what, const std::string& difference) {
  expect(difference.empty(),
         what + " (" + std::string(name_of(data_type_v<T>)) + "): " + difference);
}

// Every staged collective on `count` elements (per rank block where there are blocks), out of
// place and in place.
template <class T>
void run_all_collectives(HostStagedCommunicator& staged, std::size_t count) {
  const int ranks = staged.host().size();
  const int rank = staged.host().rank();
  const auto n = static_cast<std::size_t>(ranks);
  const T poison = element<T>(-7);
  const std::string at = " at count " + std::to_string(count);

  {  // allreduce, out of place and in place
    const std::vector<T> in = rank_input<T>(rank, count);
    std::vector<T> out(count, poison);
    staged.allreduce(std::span<const T>(in), std::span<T>(out));
    const auto sum = [&](std::size_t i) { return element<T>(sum_over_ranks(ranks, i)); };
    check<T>("allreduce" + at, first_difference(out, 0, count, sum));
    std::vector<T> data = in;
    staged.allreduce(std::span<T>(data));
    check<T>("allreduce in place" + at, first_difference(data, 0, count, sum));
    staged.allreduce(std::span<const T>(in), std::span<T>(out), ReduceOp::kMax, Algorithm::kTree);
    const auto largest = [&](std::size_t i) {
      int m = value(0, i);
      for (int r = 1; r < ranks; ++r) m = std::max(m, value(r, i));
      return element<T>(m);
    };
    check<T>("allreduce max / tree" + at, first_difference(out, 0, count, largest));
  }
  for (int root = 0; root < ranks; ++root) {  // broadcast from every root
    std::vector<T> data = rank == root ? rank_input<T>(root, count) : std::vector<T>(count, poison);
    staged.broadcast(std::span<T>(data), root);
    check<T>("broadcast from " + std::to_string(root) + at,
             first_difference(data, 0, count,
                              [&](std::size_t i) { return element<T>(value(root, i)); }));
  }
  {  // allgather: block r is rank r's input
    const std::vector<T> in = rank_input<T>(rank, count);
    const auto gathered = [&](std::size_t i) {
      return element<T>(value(int(i / count), i % count));
    };
    std::vector<T> out(n * count, poison);
    staged.allgather(std::span<const T>(in), std::span<T>(out));
    check<T>("allgather" + at, first_difference(out, 0, n * count, gathered));
    std::vector<T> data(n * count, poison);
    std::copy(in.begin(), in.end(), data.begin() + static_cast<std::ptrdiff_t>(count * rank));
    staged.allgather(std::span<T>(data));
    check<T>("allgather in place" + at, first_difference(data, 0, n * count, gathered));
  }
  {  // reduce_scatter: rank r gets block r of the sum of n blocks
    const std::vector<T> in = rank_input<T>(rank, n * count);
    const std::size_t mine = count * static_cast<std::size_t>(rank);
    const auto block_sum = [&](std::size_t i) {
      return element<T>(sum_over_ranks(ranks, mine + i));
    };
    std::vector<T> out(count, poison);
    staged.reduce_scatter(std::span<const T>(in), std::span<T>(out));
    check<T>("reduce_scatter" + at, first_difference(out, 0, count, block_sum));
    std::vector<T> data = in;
    staged.reduce_scatter(std::span<T>(data));
    check<T>("reduce_scatter in place" + at, first_difference(data, mine, count, block_sum));
  }
  for (int root = 0; root < ranks; ++root) {  // reduce to every root; others' output untouched
    const std::vector<T> in = rank_input<T>(rank, count);
    std::vector<T> out(count, poison);
    staged.reduce(std::span<const T>(in), std::span<T>(out), root);
    if (rank == root) {
      check<T>("reduce to " + std::to_string(root) + at,
               first_difference(out, 0, count, [&](std::size_t i) {
                 return element<T>(sum_over_ranks(ranks, i));
               }));
    } else {
      check<T>("reduce's output on a rank other than the root" + at,
               first_difference(out, 0, count, [&](std::size_t) { return poison; }));
    }
  }
}

// Elements that rank `from` sends rank `to` in alltoallv on `count`: 0 to 2 more than count, so
// that blocks differ in size and some are empty.
std::size_t pair_count(std::size_t count, int from, int to) {
  return count + static_cast<std::size_t>(from + 2 * to) % 3;
}

// The calls staged whole (alltoall(v), gather, scatter, allgatherv) on `count` elements per block.
// Rank r's element i of the block meant for rank t is value(r, t * 1000 + i).
template <class T>
void run_block_collectives(HostStagedCommunicator& staged, std::size_t count) {
  const int ranks = staged.host().size();
  const int rank = staged.host().rank();
  const auto n = static_cast<std::size_t>(ranks);
  const T poison = element<T>(-7);
  const std::string at = " at count " + std::to_string(count);
  const auto sent = [](int from, int to, std::size_t i) {
    return element<T>(value(from, static_cast<std::size_t>(to) * 1000 + i));
  };

  {  // alltoall: block j of the output is rank j's block for this rank
    std::vector<T> in(n * count);
    for (int t = 0; t < ranks; ++t) {
      for (std::size_t i = 0; i < count; ++i)
        in[static_cast<std::size_t>(t) * count + i] = sent(rank, t, i);
    }
    const auto received = [&](std::size_t i) { return sent(int(i / count), rank, i % count); };
    std::vector<T> out(n * count, poison);
    staged.alltoall(std::span<const T>(in), std::span<T>(out));
    check<T>("alltoall" + at, first_difference(out, 0, n * count, received));
    std::vector<T> data = in;
    staged.alltoall(std::span<T>(data));
    check<T>("alltoall in place" + at, first_difference(data, 0, n * count, received));
  }
  {  // alltoallv: blocks of pair_count elements, one poisoned element between blocks
    std::vector<std::size_t> send_counts(n), send_displacements(n), recv_counts(n),
        recv_displacements(n);
    std::size_t send_total = 0;
    std::size_t recv_total = 0;
    for (int j = 0; j < ranks; ++j) {
      const auto u = static_cast<std::size_t>(j);
      send_counts[u] = pair_count(count, rank, j);
      send_displacements[u] = send_total + 1;
      send_total += send_counts[u] + 1;
      recv_counts[u] = pair_count(count, j, rank);
      recv_displacements[u] = recv_total + 1;
      recv_total += recv_counts[u] + 1;
    }
    std::vector<T> in(send_total, poison);
    for (int j = 0; j < ranks; ++j) {
      const auto u = static_cast<std::size_t>(j);
      for (std::size_t i = 0; i < send_counts[u]; ++i)
        in[send_displacements[u] + i] = sent(rank, j, i);
    }
    std::vector<T> out(recv_total, poison);
    staged.alltoallv(std::span<const T>(in), std::span<const std::size_t>(send_counts),
                     std::span<const std::size_t>(send_displacements), std::span<T>(out),
                     std::span<const std::size_t>(recv_counts),
                     std::span<const std::size_t>(recv_displacements));
    for (int j = 0; j < ranks; ++j) {
      const auto u = static_cast<std::size_t>(j);
      check<T>("alltoallv, block from rank " + std::to_string(j) + at,
               first_difference(out, recv_displacements[u], recv_counts[u],
                                [&](std::size_t i) { return sent(j, rank, i); }));
      check<T>(
          "alltoallv, the gap before block " + std::to_string(j) + at,
          first_difference(out, recv_displacements[u] - 1, 1, [&](std::size_t) { return poison; }));
    }
  }
  for (int root = 0; root < ranks; ++root) {  // gather to every root; others' output untouched
    const std::vector<T> in = rank_input<T>(rank, count);
    std::vector<T> out(rank == root ? n * count : 0, poison);
    staged.gather(std::span<const T>(in), std::span<T>(out), root);
    if (rank == root) {
      check<T>("gather to " + std::to_string(root) + at,
               first_difference(out, 0, n * count, [&](std::size_t i) {
                 return element<T>(value(int(i / count), i % count));
               }));
    }
  }
  for (int root = 0; root < ranks; ++root) {  // scatter from every root; others' input unread
    std::vector<T> in;
    if (rank == root) {
      for (int t = 0; t < ranks; ++t) {
        for (std::size_t i = 0; i < count; ++i) in.push_back(sent(root, t, i));
      }
    }
    std::vector<T> out(count, poison);
    staged.scatter(std::span<const T>(in), std::span<T>(out), root);
    check<T>("scatter from " + std::to_string(root) + at,
             first_difference(out, 0, count, [&](std::size_t i) { return sent(root, rank, i); }));
  }
  {  // allgatherv: rank j contributes count + j % 2 elements
    std::vector<std::size_t> counts(n);
    std::vector<std::size_t> offsets(n);
    std::size_t total = 0;
    for (std::size_t j = 0; j < n; ++j) {
      counts[j] = count + j % 2;
      offsets[j] = total;
      total += counts[j];
    }
    const std::vector<T> in = rank_input<T>(rank, counts[static_cast<std::size_t>(rank)]);
    std::vector<T> out(total, poison);
    staged.allgatherv(std::span<const T>(in), std::span<T>(out),
                      std::span<const std::size_t>(counts));
    for (std::size_t j = 0; j < n; ++j) {
      check<T>("allgatherv, rank " + std::to_string(j) + "'s block" + at,
               first_difference(out, offsets[j], counts[j], [&](std::size_t i) {
                 return element<T>(value(static_cast<int>(j), i));
               }));
    }
  }
}

template <class T>
void run_counts(Communicator& comm) {
  StagingOptions options;  // tiny chunks: many pipeline rounds even for short arrays
  options.chunk_bytes = 7 * sizeof(T) * static_cast<std::size_t>(comm.size());
  options.min_chunk_bytes = 1;
  HostStagedCommunicator staged(comm, options);
  for (std::size_t count : {0, 1, 2, 6, 7, 8, 13, 22, 100, 1001}) {
    run_all_collectives<T>(staged, count);
    run_block_collectives<T>(staged, count);
  }
  // One chunk for small arrays, several for large ones: 300001 elements make 3 chunks of 2 bytes
  // (the 256 KiB floor) and 4 of 4 or 8 bytes (min_chunks).
  HostStagedCommunicator defaults(comm);
  for (std::size_t count : {std::size_t{1000}, std::size_t{300001}}) {
    run_all_collectives<T>(defaults, count);
  }
  run_block_collectives<T>(defaults, 200001);
}

}  // namespace

TEST_CASE("staged collectives match the host's, every element, on 2 and 3 TCP ranks",
          "[staging][tcp]") {
  for (int ranks : {2, 3}) {
    INFO(ranks << " ranks");
    const auto failures = coltrain::testing::run_thread_ranks(
        ranks,
        [](Communicator& comm) {
          run_counts<float>(comm);
          run_counts<double>(comm);
          run_counts<half>(comm);
          run_counts<bfloat16>(comm);
          run_counts<std::int32_t>(comm);
          run_counts<std::int64_t>(comm);
        },
        std::chrono::seconds(50));
    INFO(coltrain::testing::joined(failures));
    CHECK(coltrain::testing::joined(failures).empty());
  }
}

namespace {

// Rank r's inputs for the deterministic case: random floats over exponents -12..12.
std::vector<float> random_floats(int rank, std::size_t count) {
  std::mt19937 generator(977u * static_cast<unsigned>(rank) + 13u);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float> values(count);
  for (float& v : values) v = std::ldexp(mantissa(generator), exponent(generator));
  return values;
}

}  // namespace

TEST_CASE("staged collectives in deterministic mode give the fixed tree's bits",
          "[staging][tcp][deterministic]") {
  // Staging cuts the array into chunks, each a host call of its own: the fold of each element
  // must not notice. 3 ranks, so that orders of addition can differ at all; the fixed tree over 3
  // copies is (x0 + x1) + x2.
  const int ranks = 3;
  const std::size_t count = 50001;
  std::vector<float> expected = random_floats(0, count);
  for (int r = 1; r < ranks; ++r) {
    const std::vector<float> x = random_floats(r, count);
    for (std::size_t i = 0; i < count; ++i) expected[i] = expected[i] + x[i];
  }
  CommOptions deterministic;
  deterministic.deterministic = true;
  const auto failures = coltrain::testing::run_thread_ranks(
      ranks,
      [&](Communicator& comm) {
        const std::vector<float> input = random_floats(comm.rank(), count);
        StagingOptions tiny;
        tiny.chunk_bytes = 4096;
        tiny.min_chunk_bytes = 1;
        for (const StagingOptions& options : {tiny, StagingOptions{}}) {
          HostStagedCommunicator staged(comm, options);
          for (Algorithm a : {Algorithm::kAutomatic, Algorithm::kRing, Algorithm::kTree,
                              Algorithm::kHalvingDoubling}) {
            std::vector<float> output(count);
            staged.allreduce(std::span<const float>(input), std::span(output), ReduceOp::kSum, a);
            if (std::memcmp(output.data(), expected.data(), count * sizeof(float)) != 0) {
              throw std::runtime_error("staged allreduce (" + std::string(name_of(a)) + ", chunk " +
                                       std::to_string(options.chunk_bytes) +
                                       " bytes) differs from the fixed tree");
            }
          }
        }
      },
      std::chrono::seconds(50), deterministic);
  INFO(coltrain::testing::joined(failures));
  CHECK(coltrain::testing::joined(failures).empty());

  // Without the mode some algorithm adds in another order, so the check above can fail.
  std::atomic<int> differing{0};
  const auto control = coltrain::testing::run_thread_ranks(ranks, [&](Communicator& comm) {
    const std::vector<float> input = random_floats(comm.rank(), count);
    HostStagedCommunicator staged(comm);
    for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling}) {
      std::vector<float> output(count);
      staged.allreduce(std::span<const float>(input), std::span(output), ReduceOp::kSum, a);
      if (comm.rank() == 0 &&
          std::memcmp(output.data(), expected.data(), count * sizeof(float)) != 0) {
        ++differing;
      }
    }
  });
  INFO(coltrain::testing::joined(control));
  CHECK(coltrain::testing::joined(control).empty());
  CHECK(differing > 0);
}

TEST_CASE("staged collectives check sizes and roots before copying", "[staging][tcp]") {
  const auto failures = coltrain::testing::run_thread_ranks(2, [](Communicator& comm) {
    HostStagedCommunicator staged(comm);
    std::vector<float> in(10, 1.0f);
    std::vector<float> out(9);
    const auto throws_invalid = [](auto call, const std::string& what) {
      try {
        call();
      } catch (const InvalidArgument&) {
        return;
      }
      throw std::runtime_error(what + " did not throw InvalidArgument");
    };
    throws_invalid([&] { staged.allreduce(std::span<const float>(in), std::span<float>(out)); },
                   "allreduce into a short output");
    throws_invalid([&] { staged.allgather(std::span<const float>(in), std::span<float>(out)); },
                   "allgather into a short output");
    throws_invalid(
        [&] { staged.reduce_scatter(std::span<const float>(in), std::span<float>(out)); },
        "reduce_scatter of a wrong input");
    throws_invalid([&] { staged.broadcast(std::span<float>(in), 2); }, "broadcast from rank 2");
    throws_invalid([&] { staged.reduce(std::span<float>(in), -1); }, "reduce to rank -1");
    // Nothing was sent: the communicator still works.
    staged.allreduce(std::span<float>(in));
    expect(in[0] == 2.0f, "an allreduce after the rejected calls");
  });
  INFO(coltrain::testing::joined(failures));
  CHECK(coltrain::testing::joined(failures).empty());
}
