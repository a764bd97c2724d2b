// Ranks that disagree about a collective get an error naming both ranks and both values, within the
// timeout, on both backends; no rank hangs. Each case uses a communicator of its own, since an
// error leaves a communicator unusable.
#include <catch2/catch.hpp>

#include "collective_fixtures.hpp"

#include <coltrain/comm.hpp>
#include <coltrain/core/timer.hpp>

#include <mpi.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using Catch::Contains;

namespace {

// Cases that deadlock before any rank sees the other's header wait this out, so it is short; a
// header crosses in milliseconds, even under a sanitizer on a loaded machine.
constexpr auto kTimeout = std::chrono::seconds(2);

struct Outcome {
  std::optional<std::string> mismatch;  // MismatchError text, when this rank saw the mismatch
  bool failed = false;                  // any CommError
  double seconds = 0;
};

// Runs `call` on a fresh communicator and records how it failed.
template <class Call>
Outcome run_expecting_failure(Backend backend, Algorithm algorithm, Call call) {
  CommOptions options;
  options.timeout = kTimeout;
  Communicator comm = coltrain::testing::make_communicator(backend, options);
  Outcome outcome;
  Stopwatch watch;
  try {
    call(comm, algorithm);
  } catch (const MismatchError& e) {
    outcome.mismatch = e.what();
    outcome.failed = true;
  } catch (const CommError&) {
    outcome.failed = true;
  }
  outcome.seconds = watch.seconds();
  MPI_Barrier(MPI_COMM_WORLD);  // the next case starts together
  return outcome;
}

// How many ranks reported a MismatchError (rather than only losing a peer or timing out).
int ranks_naming_the_mismatch(const Outcome& outcome) {
  int named = outcome.mismatch ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &named, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return named;
}

std::vector<Algorithm> own_algorithms() {
  return {Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling};
}

}  // namespace

TEST_CASE("a rank calling allreduce with another count gets an error naming both counts",
          "[comm][errors][mismatch]") {
  if (coltrain::testing::world_size() < 2) return;  // nothing to disagree with
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    for (Algorithm algorithm : own_algorithms()) {
      INFO(name_of(backend) << " " << name_of(algorithm));
      const Outcome outcome =
          run_expecting_failure(backend, algorithm, [](Communicator& c, Algorithm a) {
            std::vector<float> data(c.rank() == 0 ? 10 : 12, 1.0f);
            c.allreduce(std::span(data), ReduceOp::kSum, a);
          });
      CHECK(outcome.failed);
      // Rank 0's neighbours read rank 0's headers and name the mismatch; their verdict reaches
      // the ranks that wait on other ranks, which fail with it at once, not at their timeout.
      CHECK(outcome.seconds < std::chrono::duration<double>(kTimeout).count());
      CHECK(outcome.mismatch.has_value());  // CHECK: every rank must reach the allreduce below
      if (outcome.mismatch) {
        CHECK_THAT(*outcome.mismatch, Contains("count differs between ranks") &&
                                          Contains("has 10") && Contains("has 12") &&
                                          Contains("rank 0"));
      }
      CHECK(ranks_naming_the_mismatch(outcome) == coltrain::testing::world_size());
    }
  }
}

TEST_CASE("a rank calling allreduce with another dtype gets an error naming both dtypes",
          "[comm][errors][mismatch]") {
  if (coltrain::testing::world_size() < 2) return;
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    INFO(name_of(backend));
    const Outcome outcome =
        run_expecting_failure(backend, Algorithm::kRing, [](Communicator& c, Algorithm a) {
          if (c.rank() == 0) {
            std::vector<float> data(8, 1.0f);
            c.allreduce(std::span(data), ReduceOp::kSum, a);
          } else {
            std::vector<std::int32_t> data(8, 1);
            c.allreduce(std::span(data), ReduceOp::kSum, a);
          }
        });
    CHECK(outcome.failed);
    if (outcome.mismatch) {
      CHECK_THAT(*outcome.mismatch,
                 Contains("dtype differs between ranks") && Contains("f32") && Contains("i32"));
    }
    CHECK(ranks_naming_the_mismatch(outcome) >= 1);
  }
}

TEST_CASE("a rank calling another collective gets an error naming both collectives",
          "[comm][errors][mismatch]") {
  if (coltrain::testing::world_size() < 2) return;
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    INFO(name_of(backend));
    const Outcome outcome =
        run_expecting_failure(backend, Algorithm::kRing, [](Communicator& c, Algorithm a) {
          std::vector<float> data(6, 1.0f);
          if (c.rank() == 0) {
            c.broadcast(std::span(data), 0, a);
          } else {
            c.allreduce(std::span(data), ReduceOp::kSum, a);
          }
        });
    // Rank 0's broadcast only sends, so it may well finish; everyone else must fail, in time.
    if (coltrain::testing::world_rank() != 0) CHECK(outcome.failed);
    CHECK(outcome.seconds < std::chrono::duration<double>(kTimeout).count() + 2.0);
    if (outcome.mismatch) {
      CHECK_THAT(*outcome.mismatch, Contains("collective differs between ranks") &&
                                        Contains("broadcast") && Contains("allreduce"));
    }
    CHECK(ranks_naming_the_mismatch(outcome) >= 1);
  }
}

TEST_CASE("alltoallv ranks that disagree on a block's count get an error naming both counts",
          "[comm][errors][mismatch][alltoallv]") {
  if (coltrain::testing::world_size() < 2) return;
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    INFO(name_of(backend));
    const Outcome outcome =
        run_expecting_failure(backend, Algorithm::kPairwise, [](Communicator& c, Algorithm a) {
          // Every rank sends every rank 1 element, but rank 1 expects 2 from rank 0.
          const auto p = static_cast<std::size_t>(c.size());
          std::vector<std::size_t> counts(p, 1), displacements(p);
          for (std::size_t i = 0; i < p; ++i) displacements[i] = 2 * i;
          std::vector<std::size_t> expected = counts;
          if (c.rank() == 1) expected[0] = 2;
          std::vector<float> input(2 * p, 1.0f), output(2 * p);
          c.alltoallv(std::span<const float>(input), std::span(counts), std::span(displacements),
                      std::span(output), std::span(expected), std::span(displacements), a);
        });
    // Rank 1 reads rank 0's header and names the mismatch. Rank 0's own blocks all agree, so it
    // may finish the call; a later call would then find rank 1 gone.
    if (coltrain::testing::world_rank() == 1) {
      REQUIRE(outcome.mismatch);
      CHECK_THAT(*outcome.mismatch, Contains("count differs between ranks") &&
                                        Contains("rank 1 has 2") && Contains("rank 0 has 1"));
    }
    CHECK(outcome.seconds < std::chrono::duration<double>(kTimeout).count() + 2.0);
    CHECK(ranks_naming_the_mismatch(outcome) >= 1);
  }
}

TEST_CASE("a non-blocking call that meets another rank's different blocking call fails its wait",
          "[comm][errors][mismatch][requests]") {
  if (coltrain::testing::world_size() < 2) return;
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    INFO(name_of(backend));
    std::vector<std::string> later_errors;
    const Outcome outcome =
        run_expecting_failure(backend, Algorithm::kRing, [&](Communicator& c, Algorithm a) {
          std::vector<float> data(6, 1.0f);
          std::vector<float> more(6, 1.0f);
          if (c.rank() == 0) {
            Request first = c.iallreduce(std::span(data), ReduceOp::kSum, a);
            Request second = c.iallreduce(std::span(more), ReduceOp::kSum, a);
            try {
              second.wait();  // fails too: the communicator broke under the first
            } catch (const CommError& e) {
              later_errors.push_back(e.what());
            }
            first.wait();
          } else {
            c.broadcast(std::span(data), 0, a);
          }
        });
    CHECK(outcome.failed);
    CHECK(outcome.seconds < std::chrono::duration<double>(kTimeout).count() + 2.0);
    if (coltrain::testing::world_rank() == 0) CHECK(later_errors.size() == 1);
    if (outcome.mismatch) {
      CHECK_THAT(*outcome.mismatch, Contains("collective differs between ranks") &&
                                        Contains("broadcast") && Contains("allreduce"));
    }
    CHECK(ranks_naming_the_mismatch(outcome) >= 1);
  }
}

TEST_CASE("a rank that compresses an allreduce the others send as f32 gets an error naming both",
          "[comm][errors][mismatch][compression]") {
  if (coltrain::testing::world_size() < 2) return;
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    INFO(name_of(backend));
    const Outcome outcome =
        run_expecting_failure(backend, Algorithm::kAutomatic, [](Communicator& c, Algorithm a) {
          std::vector<float> data(1000, 1.0f);
          const WireCompression wire =
              c.rank() == 0 ? WireCompression::kBFloat16 : WireCompression::kNone;
          c.allreduce(std::span(data), ReduceOp::kSum, a, wire);
        });
    CHECK(outcome.seconds < std::chrono::duration<double>(kTimeout).count() + 2.0);
    if (outcome.mismatch) {
      CHECK_THAT(*outcome.mismatch, Contains("wire compression differs between ranks") &&
                                        Contains("bf16") && Contains("none"));
    }
    CHECK(ranks_naming_the_mismatch(outcome) >= 1);
  }
}

TEST_CASE("a rank calling allreduce with another op gets an error naming both ops",
          "[comm][errors][mismatch]") {
  if (coltrain::testing::world_size() < 2) return;
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    for (Algorithm algorithm : own_algorithms()) {
      INFO(name_of(backend) << " " << name_of(algorithm));
      const Outcome outcome =
          run_expecting_failure(backend, algorithm, [](Communicator& c, Algorithm a) {
            std::vector<float> data(8, 1.0f);
            c.allreduce(std::span(data), c.rank() == 0 ? ReduceOp::kMax : ReduceOp::kSum, a);
          });
      CHECK(outcome.failed);
      CHECK(outcome.seconds < std::chrono::duration<double>(kTimeout).count() + 2.0);
      if (outcome.mismatch) {
        // Only rank 0 differs, so whoever sees it names rank 0's op and a neighbour's.
        CHECK_THAT(*outcome.mismatch, Contains("reduction op differs between ranks") &&
                                          Contains("rank 0 has max") && Contains("has sum"));
      }
      CHECK(ranks_naming_the_mismatch(outcome) >= 1);
    }
  }
}

TEST_CASE("a rank calling allreduce with another algorithm gets an error naming both algorithms",
          "[comm][errors][mismatch]") {
  if (coltrain::testing::world_size() < 2) return;
  // Tree on rank 0 can deadlock before any posted receive meets a header of the other algorithm:
  // on 3 ranks rank 0 waits for its child 1 while rank 1 waits for rank 0. Then the timeout names
  // it: TCP's inquiry carries each rank's call, and MPI looks at the headers that reached a rank
  // but no receive of it took.
  const std::pair<Algorithm, Algorithm> mismatches[] = {
      {Algorithm::kRing, Algorithm::kTree},
      {Algorithm::kHalvingDoubling, Algorithm::kRing},
      {Algorithm::kTree, Algorithm::kRing},
      {Algorithm::kTree, Algorithm::kHalvingDoubling},
      // A rank in deterministic mode (rank order) among ranks that are not.
      {Algorithm::kRankOrder, Algorithm::kRing}};
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    for (const auto& [rank_zeros, others] : mismatches) {
      INFO(name_of(backend) << ": rank 0 " << name_of(rank_zeros) << ", others "
                            << name_of(others));
      const Outcome outcome =
          run_expecting_failure(backend, others, [&](Communicator& c, Algorithm a) {
            std::vector<float> data(8, 1.0f);
            c.allreduce(std::span(data), ReduceOp::kSum, c.rank() == 0 ? rank_zeros : a);
          });
      CHECK(outcome.failed);
      CHECK(outcome.seconds < std::chrono::duration<double>(kTimeout).count() + 2.0);
      if (outcome.mismatch) {
        CHECK_THAT(*outcome.mismatch, Contains("algorithm differs between ranks") &&
                                          Contains("has " + std::string(name_of(rank_zeros))) &&
                                          Contains("has " + std::string(name_of(others))));
      }
      CHECK(ranks_naming_the_mismatch(outcome) >= 1);
    }
  }
}

// Data flows to the root, so a rank that takes itself for the root waits for chunks that no rank
// sends it in that form: ranks 0 and 1 below always fail, often waiting on each other before any
// posted receive meets a header with the other root; the timeout then names the roots (TCP's
// inquiry carries each rank's call; MPI looks at the headers no receive took). A leaf of a tree,
// which only sends, may finish.
TEST_CASE("ranks that pass reduce different roots get an error naming both roots",
          "[comm][errors][mismatch][root]") {
  if (coltrain::testing::world_size() < 2) return;
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kTree}) {
      INFO(name_of(backend) << " " << name_of(algorithm));
      const Outcome outcome =
          run_expecting_failure(backend, algorithm, [](Communicator& c, Algorithm a) {
            std::vector<float> data(8, 1.0f);
            c.reduce(std::span(data), c.rank() == 0 ? 0 : 1, ReduceOp::kSum, a);
          });
      if (coltrain::testing::world_rank() <= 1) CHECK(outcome.failed);
      CHECK(outcome.seconds < std::chrono::duration<double>(kTimeout).count() + 2.0);
      if (outcome.mismatch) {
        CHECK_THAT(*outcome.mismatch, Contains("root differs between ranks") && Contains("has 0") &&
                                          Contains("has 1"));
      }
      CHECK(ranks_naming_the_mismatch(outcome) >= 1);
    }
  }
}

TEST_CASE("ranks that pass broadcast different roots get an error naming both roots",
          "[comm][errors][mismatch][root]") {
  if (coltrain::testing::world_size() < 2) return;
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kTree}) {
      INFO(name_of(backend) << " " << name_of(algorithm));
      const Outcome outcome =
          run_expecting_failure(backend, algorithm, [](Communicator& c, Algorithm a) {
            std::vector<float> data(8, 1.0f);
            c.broadcast(std::span(data), c.rank() == 0 ? 0 : 1, a);
          });
      CHECK(outcome.seconds < std::chrono::duration<double>(kTimeout).count() + 2.0);
      if (outcome.mismatch) {
        CHECK_THAT(*outcome.mismatch, Contains("root differs between ranks") &&
                                          Contains("rank 0 has 0") && Contains("has 1"));
      }
      CHECK(ranks_naming_the_mismatch(outcome) >= 1);
    }
  }
}
