// The NCCL backend's schedules and point-to-point groups, which need neither NCCL nor a GPU, run on
// host arrays: every rank's ring allreduce schedule and tree allreduce plan in lockstep for many
// world sizes (one GPU can run only one NCCL rank, so the GPU suite sees the ring and the tree at
// p = 1), and the point-to-point groups of the collectives that move blocks, run by memcpy. Built
// in every configuration, with or without NCCL.
#include <catch2/catch.hpp>

#include <coltrain/comm/algorithms/peer_transfers.hpp>
#include <coltrain/comm/device/nccl/nccl_schedules.hpp>
#include <coltrain/comm/types.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

using coltrain::comm::ReduceOp;
namespace detail = coltrain::comm::detail;

namespace {

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

// Runs every rank's ring_allreduce_plan in lockstep on host arrays, as
// NcclBackend::ring_allreduce enqueues it, with its reductions as late as the plan allows: a
// round's reduction is queued, and runs only when a later round names it in after_reductions (or
// at the end), reading its scratch slot then. So a send that reads a chunk not yet reduced, or a
// receive that overwrites a slot or an output chunk a pending reduction still needs, gives a wrong
// result.
TEST_CASE("the chunked ring allreduce plan reduces every element once, with reductions lagging",
          "[nccl][schedules]") {
  const int p = GENERATE(1, 2, 3, 4, 5, 7, 8, 13);
  const int chunks = GENERATE(1, 2, 3, 5);
  const std::size_t count = GENERATE(0u, 1u, 3u, 6u, 37u, 200u);
  const ReduceOp op =
      GENERATE(ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg);
  CAPTURE(p, chunks, count, static_cast<int>(op));

  const RankArrays input = random_inputs(
      p, count, op, static_cast<unsigned>(p * 1000 + chunks * 100 + static_cast<int>(count)));
  RankArrays output(p, std::vector<std::int64_t>(count, kPoison));
  if (p == 1) output = input;  // the executor copies: no round runs

  const detail::Blocks segments(count, static_cast<std::size_t>(p));
  const auto range = [&](int segment, int chunk) {
    return detail::chunk_of(segments, static_cast<std::size_t>(segment),
                            static_cast<std::size_t>(chunks), static_cast<std::size_t>(chunk));
  };
  std::vector<std::vector<detail::RingRound>> plans;
  for (int r = 0; r < p; ++r) plans.push_back(detail::ring_allreduce_plan(p, r, chunks));
  for (const auto& plan : plans) {
    REQUIRE(plan.size() == (p < 2 ? 0u : 2 * static_cast<std::size_t>((p - 1) * chunks)));
  }
  // scratch[rank][slot], and each rank's reductions not run yet: (round, the round's plan entry).
  std::vector<std::vector<std::vector<std::int64_t>>> scratch(
      p, std::vector<std::vector<std::int64_t>>(detail::kRingSlots));
  std::vector<std::vector<std::pair<int, const detail::RingRound*>>> pending(p);
  const auto run_reductions = [&](int r, int up_to) {
    auto& queue = pending[static_cast<std::size_t>(r)];
    while (!queue.empty() && queue.front().first <= up_to) {
      const detail::RingRound& round = *queue.front().second;
      const detail::Range chunk = range(round.receive_segment, round.chunk);
      const auto& received = scratch[r][static_cast<std::size_t>(round.slot)];
      REQUIRE(received.size() == chunk.size);
      for (std::size_t j = 0; j < chunk.size; ++j) {
        std::int64_t& target = output[r][chunk.begin + j];
        target = combine(input[r][chunk.begin + j], received[j], op);
        if (op == ReduceOp::kAvg && round.completes_segment) target /= p;
      }
      queue.erase(queue.begin());
    }
  };

  const std::size_t rounds = plans[0].size();
  for (std::size_t t = 0; t < rounds; ++t) {
    CAPTURE(t);
    std::vector<std::vector<std::int64_t>> sent(p);
    for (int r = 0; r < p; ++r) {
      const detail::RingRound& round = plans[r][t];
      REQUIRE(round.send_segment != round.receive_segment);
      REQUIRE(round.after_reductions < static_cast<int>(t));
      REQUIRE(round.after_reductions >= static_cast<int>(t) - detail::kRingLag);
      run_reductions(r, round.after_reductions);
      const detail::Range chunk = range(round.send_segment, round.chunk);
      const auto& source = round.send_from_input ? input[r] : output[r];
      const auto first = source.begin() + static_cast<std::ptrdiff_t>(chunk.begin);
      sent[r].assign(first, first + static_cast<std::ptrdiff_t>(chunk.size));
    }
    for (int r = 0; r < p; ++r) {
      const detail::RingRound& round = plans[r][t];
      const int left = (r + p - 1) % p;
      const detail::RingRound& theirs = plans[left][t];
      REQUIRE(theirs.send_segment == round.receive_segment);
      REQUIRE(theirs.chunk == round.chunk);
      const detail::Range chunk = range(round.receive_segment, round.chunk);
      if (round.reduce) {
        REQUIRE(round.slot >= 0);
        REQUIRE(round.slot < detail::kRingSlots);
        scratch[r][static_cast<std::size_t>(round.slot)] = sent[left];
        pending[r].emplace_back(static_cast<int>(t), &round);
      } else {
        std::copy(sent[left].begin(), sent[left].end(),
                  output[r].begin() + static_cast<std::ptrdiff_t>(chunk.begin));
      }
    }
  }
  for (int r = 0; r < p; ++r) run_reductions(r, static_cast<int>(rounds));

  check_allreduced(input, output, op);
}

TEST_CASE("the ring cuts segments into chunks of 256 KiB to 1 MiB, a quarter of the segment",
          "[nccl][schedules]") {
  CHECK(detail::ring_chunks(0, 4) == 1);
  CHECK(detail::ring_chunks(1, 4) == 1);
  CHECK(detail::ring_chunks(std::size_t{64} << 10, 4) == 1);   // 256 KiB: one chunk
  CHECK(detail::ring_chunks(std::size_t{512} << 10, 4) == 4);  // 2 MiB: 4 of 512 KiB
  CHECK(detail::ring_chunks(std::size_t{4} << 20, 4) == 16);   // 16 MiB: 1 MiB chunks
  CHECK(detail::ring_chunks(std::size_t{1} << 20, 2) == 4);    // f16 counts bytes too
}

// Runs every rank's tree_allreduce_plan in lockstep on host arrays, as
// NcclBackend::tree_allreduce enqueues it. Per round, NCCL runs one group per rank and
// executes a group's calls to the same peer in order, so the transfers any two ranks post to each
// other must pair up position by position (a send against a receive, same tree and chunk); no
// rank may receive into a chunk it sends from in the same round; then the round's reductions run.
TEST_CASE("the tree allreduce plan pairs every transfer and reduces every element exactly once",
          "[nccl][schedules]") {
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

namespace {

// Runs every rank's PeerTransfers as NCCL would: rank i's k-th send to rank j meets rank j's k-th
// receive from rank i, which must have the same size.
void run_transfers(const std::vector<coltrain::comm::PeerTransfers>& ranks) {
  const auto p = ranks.size();
  for (std::size_t from = 0; from < p; ++from) {
    for (std::size_t to = 0; to < p; ++to) {
      std::vector<coltrain::comm::PeerSend> sends;
      std::vector<coltrain::comm::PeerReceive> receives;
      for (const auto& send : ranks[from].sends) {
        if (send.peer == static_cast<int>(to)) sends.push_back(send);
      }
      for (const auto& receive : ranks[to].receives) {
        if (receive.peer == static_cast<int>(from)) receives.push_back(receive);
      }
      INFO("from rank " << from << " to rank " << to);
      REQUIRE(sends.size() == receives.size());
      for (std::size_t k = 0; k < sends.size(); ++k) {
        REQUIRE(sends[k].bytes == receives[k].bytes);
        if (sends[k].bytes > 0) std::memcpy(receives[k].data, sends[k].data, sends[k].bytes);
      }
    }
  }
}

// Rank r's element i of the block meant for rank t.
std::int32_t block_value(int r, int t, std::size_t i) {
  return static_cast<std::int32_t>(r * 100000 + t * 1000 + static_cast<int>(i));
}

}  // namespace

TEST_CASE(
    "the point-to-point groups of alltoall(v), gather, scatter and allgatherv move every "
    "block to its place, 1 to 5 ranks",
    "[nccl][schedules]") {
  using coltrain::comm::PeerTransfers;
  constexpr std::int32_t kPoison = -1;
  for (int p = 1; p <= 5; ++p) {
    const auto n = static_cast<std::size_t>(p);
    for (const std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{17}}) {
      CAPTURE(p, count);
      const std::size_t b = count * sizeof(std::int32_t);
      std::vector<std::vector<std::int32_t>> in(n), out(n);
      std::vector<PeerTransfers> groups(n);
      // alltoall, through the alltoallv form with equal blocks
      for (int r = 0; r < p; ++r) {
        auto& mine = in[static_cast<std::size_t>(r)];
        for (int t = 0; t < p; ++t) {
          for (std::size_t i = 0; i < count; ++i) mine.push_back(block_value(r, t, i));
        }
        out[static_cast<std::size_t>(r)].assign(n * count, kPoison);
        const std::vector<std::size_t> bytes(n, b);
        std::vector<std::size_t> offsets(n);
        for (std::size_t j = 0; j < n; ++j) offsets[j] = j * b;
        groups[static_cast<std::size_t>(r)] = coltrain::comm::pairwise_transfers(
            mine.data(), bytes, offsets, out[static_cast<std::size_t>(r)].data(), bytes, offsets);
      }
      run_transfers(groups);
      for (int r = 0; r < p; ++r) {
        for (int j = 0; j < p; ++j) {
          for (std::size_t i = 0; i < count; ++i) {
            REQUIRE(out[static_cast<std::size_t>(r)][static_cast<std::size_t>(j) * count + i] ==
                    block_value(j, r, i));
          }
        }
      }
      for (int root = 0; root < p; ++root) {  // gather: rank j's block for the root, at block j
        for (int r = 0; r < p; ++r) {
          const auto u = static_cast<std::size_t>(r);
          in[u].clear();
          for (std::size_t i = 0; i < count; ++i) in[u].push_back(block_value(r, root, i));
          out[u].assign(r == root ? n * count : 0, kPoison);
          groups[u] = coltrain::comm::gather_transfers(r, p, root, in[u].data(), out[u].data(), b);
        }
        run_transfers(groups);
        const auto& gathered = out[static_cast<std::size_t>(root)];
        for (std::size_t k = 0; k < n * count; ++k) {
          REQUIRE(gathered[k] == block_value(static_cast<int>(k / count), root, k % count));
        }
      }
      for (int root = 0; root < p; ++root) {  // scatter: the root's block j to rank j
        for (int r = 0; r < p; ++r) {
          const auto u = static_cast<std::size_t>(r);
          in[u].clear();
          if (r == root) {
            for (int t = 0; t < p; ++t) {
              for (std::size_t i = 0; i < count; ++i) in[u].push_back(block_value(root, t, i));
            }
          }
          out[u].assign(count, kPoison);
          groups[u] = coltrain::comm::scatter_transfers(r, p, root, in[u].data(), out[u].data(), b);
        }
        run_transfers(groups);
        for (int r = 0; r < p; ++r) {
          for (std::size_t i = 0; i < count; ++i) {
            REQUIRE(out[static_cast<std::size_t>(r)][i] == block_value(root, r, i));
          }
        }
      }
      {  // allgatherv: rank j contributes count + j % 2 elements
        std::vector<std::size_t> bytes(n), offsets(n);
        std::size_t total = 0;
        for (std::size_t j = 0; j < n; ++j) {
          bytes[j] = (count + j % 2) * sizeof(std::int32_t);
          offsets[j] = total;
          total += bytes[j];
        }
        for (int r = 0; r < p; ++r) {
          const auto u = static_cast<std::size_t>(r);
          in[u].clear();
          for (std::size_t i = 0; i < count + u % 2; ++i) in[u].push_back(block_value(r, 0, i));
          out[u].assign(total / sizeof(std::int32_t), kPoison);
          groups[u] = coltrain::comm::allgatherv_transfers(in[u].data(), bytes[u], out[u].data(),
                                                           bytes, offsets);
        }
        run_transfers(groups);
        for (int r = 0; r < p; ++r) {
          for (std::size_t j = 0; j < n; ++j) {
            for (std::size_t i = 0; i < count + j % 2; ++i) {
              REQUIRE(out[static_cast<std::size_t>(r)][offsets[j] / sizeof(std::int32_t) + i] ==
                      block_value(static_cast<int>(j), 0, i));
            }
          }
        }
      }
    }
  }
}
