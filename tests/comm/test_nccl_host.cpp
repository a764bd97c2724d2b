// The parts of the NCCL backend that need no GPU: the dtype and op maps, the unique id's trip over
// the host bootstrap (real TCP ranks), and the ring allreduce's schedule, run on host arrays for
// many world sizes, and the tree allreduce's plan likewise (one GPU can run only one NCCL rank, so
// the GPU suite sees the ring and the tree at p = 1).
#include <catch2/catch.hpp>

#include "../support/tcp_launch.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/nccl_communicator.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>

#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using Catch::Matchers::Contains;
using coltrain::DataType;
using coltrain::comm::ReduceOp;
namespace detail = coltrain::comm::detail;

namespace {

// A recognisable id: rank 0's bytes differ from every other rank's zeroes in every byte.
ncclUniqueId patterned_id() {
  ncclUniqueId id;
  for (std::size_t i = 0; i < sizeof(id.internal); ++i) {
    id.internal[i] = static_cast<char>((i * 37 + 11) & 0xff);
  }
  return id;
}

std::int64_t combine(std::int64_t a, std::int64_t b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMin:
      return b < a ? b : a;
    case ReduceOp::kMax:
      return a < b ? b : a;
    default:
      return a + b;
  }
}

using RankArrays = std::vector<std::vector<std::int64_t>>;
constexpr std::int64_t kPoison = 0x7eadbeef7eadbeef;

// Each rank's input for an allreduce of `count` elements: small signed integers, exact under every
// op (factors of at most 3 for kProd, so that products over 13 ranks stay in range).
RankArrays random_inputs(int p, std::size_t count, ReduceOp op, unsigned seed) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<std::int64_t> value(1, op == ReduceOp::kProd ? 3 : 40);
  RankArrays input(static_cast<std::size_t>(p), std::vector<std::int64_t>(count));
  for (auto& rank_input : input) {
    for (auto& x : rank_input) x = random() % 2 == 0 ? value(random) : -value(random);
  }
  return input;
}

// Checks that every rank's output is the reduction of all inputs (kAvg: the sum / p, truncated).
void check_allreduced(const RankArrays& input, const RankArrays& output, ReduceOp op) {
  const auto p = static_cast<std::int64_t>(input.size());
  const std::size_t count = input[0].size();
  std::vector<std::int64_t> expected(count);
  for (std::size_t j = 0; j < count; ++j) {
    std::int64_t total = input[0][j];
    for (std::size_t r = 1; r < input.size(); ++r) total = combine(total, input[r][j], op);
    expected[j] = op == ReduceOp::kAvg ? total / p : total;
  }
  for (std::size_t r = 0; r < output.size(); ++r) {
    CAPTURE(r);
    CHECK(output[r] == expected);
  }
}

}  // namespace

TEST_CASE("every DataType maps to the NCCL type of the same width and kind", "[nccl]") {
  CHECK(detail::nccl_data_type(DataType::kFloat32) == ncclFloat32);
  CHECK(detail::nccl_data_type(DataType::kFloat64) == ncclFloat64);
  CHECK(detail::nccl_data_type(DataType::kFloat16) == ncclFloat16);
  CHECK(detail::nccl_data_type(DataType::kBFloat16) == ncclBfloat16);
  CHECK(detail::nccl_data_type(DataType::kInt32) == ncclInt32);
  CHECK(detail::nccl_data_type(DataType::kInt64) == ncclInt64);
  CHECK(detail::nccl_data_type(DataType::kUInt8) == ncclUint8);
  CHECK_THROWS_MATCHES(detail::nccl_data_type(static_cast<DataType>(42)), coltrain::InvalidArgument,
                       Catch::Matchers::Message(
                           "coltrain: dtype value 42 is not a coltrain DataType; NCCL takes f32, "
                           "f64, f16, bf16, i32, i64 and u8"));
}

TEST_CASE("every ReduceOp maps to its NCCL op; avg is NCCL's own", "[nccl]") {
  CHECK(detail::nccl_reduce_op(ReduceOp::kSum) == ncclSum);
  CHECK(detail::nccl_reduce_op(ReduceOp::kProd) == ncclProd);
  CHECK(detail::nccl_reduce_op(ReduceOp::kMin) == ncclMin);
  CHECK(detail::nccl_reduce_op(ReduceOp::kMax) == ncclMax);
  CHECK(detail::nccl_reduce_op(ReduceOp::kAvg) == ncclAvg);
  CHECK_THROWS_WITH(detail::nccl_reduce_op(static_cast<ReduceOp>(9)),
                    Contains("reduction op value 9 is not a coltrain ReduceOp"));
}

TEST_CASE("a unique id survives its conversion to the words the host collectives carry", "[nccl]") {
  const ncclUniqueId id = patterned_id();
  const ncclUniqueId back = detail::unique_id_from_words(detail::unique_id_words(id));
  CHECK(std::memcmp(&id, &back, sizeof(id)) == 0);
}

TEST_CASE("rank 0's unique id reaches every rank over the TCP bootstrap", "[nccl][tcp]") {
  const int world_size = GENERATE(1, 2, 3);
  CAPTURE(world_size);
  const auto outcomes = coltrain::testing::launch_ranks(world_size, [](int rank) {
    auto bootstrap = coltrain::comm::Communicator::tcp(coltrain::detect_launch_env());
    const ncclUniqueId mine = rank == 0 ? patterned_id() : ncclUniqueId{};
    const ncclUniqueId got = detail::broadcast_unique_id(bootstrap, mine);
    const ncclUniqueId expected = patterned_id();
    coltrain::testing::expect(std::memcmp(&got, &expected, sizeof(got)) == 0,
                              "rank " + std::to_string(rank) + " holds rank 0's id");
  });
  INFO(coltrain::testing::describe(outcomes));
  for (const auto& outcome : outcomes) CHECK(outcome.passed());
}

TEST_CASE("a communicator refuses a rank outside its world before it touches a GPU", "[nccl]") {
  CHECK_THROWS_WITH(coltrain::comm::NcclCommunicator(2, 2, ncclUniqueId{}, 0),
                    Contains("rank 2 is outside a world of 2 ranks"));
  CHECK_THROWS_WITH(coltrain::comm::NcclCommunicator(0, 0, ncclUniqueId{}, 0),
                    Contains("outside a world of 0 ranks"));
}

// Runs the schedule of every rank in lockstep on host arrays, doing per step what
// NcclCommunicator::ring_allreduce enqueues: each rank sends a segment to its right neighbour,
// which either reduces it with its own input (output = input op received) or stores it.
TEST_CASE("the ring allreduce schedule reduces every element over every rank exactly once",
          "[nccl]") {
  const int p = GENERATE(1, 2, 3, 4, 5, 7);
  const std::size_t count = GENERATE(0u, 1u, 3u, 6u, 37u, 1000u);
  const ReduceOp op =
      GENERATE(ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg);
  CAPTURE(p, count, static_cast<int>(op));

  const RankArrays input =
      random_inputs(p, count, op, static_cast<unsigned>(p * 1000 + static_cast<int>(count)));
  RankArrays output(p, std::vector<std::int64_t>(count, kPoison));
  if (p == 1) output = input;  // the executor copies: no step runs

  const detail::Blocks segments(count, static_cast<std::size_t>(p));
  std::vector<std::vector<detail::RingStep>> schedules;
  for (int r = 0; r < p; ++r) schedules.push_back(detail::ring_allreduce_schedule(p, r));
  for (const auto& schedule : schedules) {
    REQUIRE(schedule.size() == 2 * static_cast<std::size_t>(p - 1));
  }

  for (std::size_t i = 0; i < schedules[0].size(); ++i) {
    std::vector<std::vector<std::int64_t>> sent(p);
    std::vector<int> sent_segment(p);
    for (int r = 0; r < p; ++r) {
      const detail::RingStep& step = schedules[r][i];
      REQUIRE(step.send_segment != step.receive_segment);
      const auto& source = step.send_from_input ? input[r] : output[r];
      const auto segment = static_cast<std::size_t>(step.send_segment);
      const auto begin = source.begin() + static_cast<std::ptrdiff_t>(segments.begin(segment));
      sent[r].assign(begin, begin + static_cast<std::ptrdiff_t>(segments.size(segment)));
      sent_segment[r] = step.send_segment;
    }
    for (int r = 0; r < p; ++r) {
      const detail::RingStep& step = schedules[r][i];
      const int left = (r + p - 1) % p;
      REQUIRE(sent_segment[left] == step.receive_segment);
      const auto segment = static_cast<std::size_t>(step.receive_segment);
      const std::size_t begin = segments.begin(segment);
      for (std::size_t j = 0; j < segments.size(segment); ++j) {
        std::int64_t& target = output[r][begin + j];
        if (!step.reduce) {
          target = sent[left][j];
          continue;
        }
        target = combine(input[r][begin + j], sent[left][j], op);
        if (op == ReduceOp::kAvg && step.completes_segment) target /= p;
      }
    }
  }

  check_allreduced(input, output, op);
}

// Runs every rank's tree_allreduce_plan in lockstep on host arrays, as
// NcclCommunicator::tree_allreduce enqueues it. Per round, NCCL runs one group per rank and
// executes a group's calls to the same peer in order, so the transfers any two ranks post to each
// other must pair up position by position (a send against a receive, same tree and chunk); no
// rank may receive into a chunk it sends from in the same round; then the round's reductions run.
TEST_CASE("the tree allreduce plan pairs every transfer and reduces every element exactly once",
          "[nccl]") {
  const int p = GENERATE(2, 3, 4, 5, 6, 7, 8, 13);
  const int chunks = GENERATE(1, 2, 3, 5);
  const std::size_t count = GENERATE(0u, 1u, 2u, 7u, 100u);
  const ReduceOp op =
      GENERATE(ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg);
  CAPTURE(p, chunks, count, static_cast<int>(op));
  using Transfer = detail::TreeTransfer;
  using Buffer = Transfer::Buffer;

  const RankArrays input = random_inputs(
      p, count, op, static_cast<unsigned>(p * 1000 + chunks * 100 + static_cast<int>(count)));
  RankArrays output(p, std::vector<std::int64_t>(count, kPoison));
  // scratch[rank][2 * tree + child]: what that child sent up.
  std::vector<std::vector<std::vector<std::int64_t>>> scratch(
      p, std::vector<std::vector<std::int64_t>>(4));

  const detail::Blocks halves(count, 2);
  const std::size_t n_chunks = static_cast<std::size_t>(chunks);
  const std::vector<detail::Blocks> pieces{detail::Blocks(halves.size(0), n_chunks),
                                           detail::Blocks(halves.size(1), n_chunks)};
  const auto begin_of = [&](const int tree, const int chunk) {
    const auto t = static_cast<std::size_t>(tree);
    return halves.begin(t) + pieces[t].begin(static_cast<std::size_t>(chunk));
  };
  const auto size_of_chunk = [&](const int tree, const int chunk) {
    return pieces[static_cast<std::size_t>(tree)].size(static_cast<std::size_t>(chunk));
  };

  std::vector<std::vector<detail::TreeRoundPlan>> plans;
  for (int r = 0; r < p; ++r) plans.push_back(detail::tree_allreduce_plan(p, r, chunks));
  const int height = [&] {
    int h = 0;
    while ((2 << h) - 1 <= p - 1) ++h;
    return h;
  }();
  for (const auto& plan : plans)
    REQUIRE(plan.size() == static_cast<std::size_t>(chunks + 2 * height));
  CHECK(detail::tree_allreduce_plan(1, 0, chunks).empty());

  for (std::size_t i = 0; i < plans[0].size(); ++i) {
    CAPTURE(i);
    // Pairing, and the payload of every send, read before any receive of the round writes.
    std::vector<std::vector<std::vector<const Transfer*>>> posted(
        p, std::vector<std::vector<const Transfer*>>(p));
    for (int r = 0; r < p; ++r) {
      std::vector<std::pair<int, int>> sent_from, received_into;
      for (const Transfer& transfer : plans[r][i].transfers) {
        REQUIRE(transfer.peer >= 0);
        REQUIRE(transfer.peer < p);
        REQUIRE(transfer.peer != r);
        posted[r][transfer.peer].push_back(&transfer);
        (transfer.send ? sent_from : received_into).emplace_back(transfer.tree, transfer.chunk);
      }
      for (const auto& chunk : received_into) {
        CHECK(std::find(sent_from.begin(), sent_from.end(), chunk) == sent_from.end());
      }
    }
    std::vector<std::vector<std::vector<std::vector<std::int64_t>>>> payloads(
        p, std::vector<std::vector<std::vector<std::int64_t>>>(p));
    for (int a = 0; a < p; ++a) {
      for (int b = 0; b < p; ++b) {
        const auto& mine = posted[a][b];
        const auto& theirs = posted[b][a];
        REQUIRE(mine.size() == theirs.size());
        for (std::size_t k = 0; k < mine.size(); ++k) {
          REQUIRE(mine[k]->send != theirs[k]->send);
          REQUIRE(mine[k]->tree == theirs[k]->tree);
          REQUIRE(mine[k]->chunk == theirs[k]->chunk);
          if (!mine[k]->send) continue;
          REQUIRE(mine[k]->buffer != Buffer::kScratch);
          const auto& source = mine[k]->buffer == Buffer::kInput ? input[a] : output[a];
          const auto first =
              source.begin() + static_cast<std::ptrdiff_t>(begin_of(mine[k]->tree, mine[k]->chunk));
          payloads[a][b].emplace_back(first, first + static_cast<std::ptrdiff_t>(size_of_chunk(
                                                         mine[k]->tree, mine[k]->chunk)));
        }
      }
    }
    for (int b = 0; b < p; ++b) {
      for (int a = 0; a < p; ++a) {
        std::size_t next = 0;
        for (const Transfer* transfer : posted[b][a]) {
          if (transfer->send) continue;
          const std::vector<std::int64_t>& payload = payloads[a][b][next++];
          if (transfer->buffer == Buffer::kScratch) {
            scratch[b][static_cast<std::size_t>(2 * transfer->tree + transfer->slot)] = payload;
          } else {
            REQUIRE(transfer->buffer == Buffer::kOutput);
            std::copy(payload.begin(), payload.end(),
                      output[b].begin() +
                          static_cast<std::ptrdiff_t>(begin_of(transfer->tree, transfer->chunk)));
          }
        }
      }
    }
    for (int r = 0; r < p; ++r) {
      for (const detail::TreeReduction& reduction : plans[r][i].reductions) {
        const std::size_t begin = begin_of(reduction.tree, reduction.chunk);
        const std::vector<std::int64_t>& received =
            scratch[r][static_cast<std::size_t>(2 * reduction.tree + reduction.slot)];
        REQUIRE(received.size() == size_of_chunk(reduction.tree, reduction.chunk));
        for (std::size_t j = 0; j < received.size(); ++j) {
          const std::int64_t a = (reduction.first ? input[r] : output[r])[begin + j];
          std::int64_t& target = output[r][begin + j];
          target = combine(a, received[j], op);
          if (op == ReduceOp::kAvg && reduction.completes) target /= p;
        }
      }
    }
  }

  check_allreduced(input, output, op);
}
