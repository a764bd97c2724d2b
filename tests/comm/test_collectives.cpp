// Every collective x algorithm x backend x dtype x op, for the world size mpiexec gives (CTest runs
// 1 to 5 ranks), counts 0, 1, fewer than the ranks, odd, and several pipeline chunks, in place and
// out of place, against references exact by construction.
#include <catch2/catch.hpp>

#include "collective_fixtures.hpp"

#include <coltrain/comm.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

using namespace coltrain;
using namespace coltrain::comm;
using coltrain::testing::inputs;
using coltrain::testing::reference;
using coltrain::testing::same_bits;
using coltrain::testing::shared_communicator;

namespace {

constexpr Backend kBackends[] = {Backend::kMpi, Backend::kTcp};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kAvg};

std::vector<std::size_t> counts(int ranks) {
  // 1500 elements cross several 256-byte chunks of the small-chunk tuning below.
  return {0, 1, static_cast<std::size_t>(ranks > 1 ? ranks - 1 : 1), 7, 1500};
}

// Runs `body(comm)` with the default tuning and with tiny chunks, which makes the pipelines of
// ring and tree run through many chunks even for short vectors.
template <class Body>
void for_each_tuning(Communicator& comm, Body body) {
  const AlgorithmTuning original = comm.tuning();
  for (std::size_t chunk_bytes : {std::size_t{256}, original.chunk_bytes}) {
    AlgorithmTuning tuning = original;
    tuning.chunk_bytes = chunk_bytes;
    comm.set_tuning(tuning);
    INFO("chunk bytes " << chunk_bytes);
    body(comm);
  }
  comm.set_tuning(original);
}

std::vector<Algorithm> algorithms(Backend backend, Collective collective) {
  std::vector<Algorithm> result;
  for (Algorithm a : algorithms_for(collective)) {
    if (a != Algorithm::kNative || backend == Backend::kMpi) result.push_back(a);
  }
  result.push_back(Algorithm::kAutomatic);
  return result;
}

template <class T>
void check_allreduce(Communicator& comm, Algorithm algorithm, ReduceOp op, std::size_t count,
                     bool in_place) {
  const int p = comm.size();
  std::vector<T> data = inputs<T>(comm.rank(), count);
  std::vector<T> output(count, coltrain::testing::to_element<T>(-7));
  if (in_place) {
    comm.allreduce(std::span(data), op, algorithm);
    output = data;
  } else {
    comm.allreduce(std::span<const T>(data), std::span(output), op, algorithm);
    CHECK(data == inputs<T>(comm.rank(), count));  // the input is left alone
  }
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += !same_bits(output[i], reference<T>(op, p, i));
  CHECK(wrong == 0);
}

template <class T>
void allreduce_all_cases(Backend backend) {
  Communicator& comm = shared_communicator(backend);
  for_each_tuning(comm, [&](Communicator& c) {
    for (Algorithm algorithm : algorithms(backend, Collective::kAllreduce)) {
      for (ReduceOp op : kOps) {
        for (std::size_t count : counts(c.size())) {
          for (bool in_place : {false, true}) {
            INFO(name_of(backend) << " " << name_of(algorithm) << " " << name_of(data_type_v<T>)
                                  << " " << name_of(op) << " count " << count
                                  << (in_place ? " in place" : " out of place"));
            check_allreduce<T>(c, algorithm, op, count, in_place);
          }
        }
      }
    }
  });
}

}  // namespace

TEMPLATE_TEST_CASE("allreduce is exact for every algorithm, op and count", "[comm][allreduce]",
                   float, double, std::int32_t, std::int64_t, coltrain::half, coltrain::bfloat16) {
  for (Backend backend : kBackends) allreduce_all_cases<TestType>(backend);
}

TEMPLATE_TEST_CASE("broadcast delivers the root's data from every root", "[comm][broadcast]", float,
                   std::int64_t, coltrain::half) {
  for (Backend backend : kBackends) {
    Communicator& comm = shared_communicator(backend);
    for_each_tuning(comm, [&](Communicator& c) {
      for (Algorithm algorithm : algorithms(backend, Collective::kBroadcast)) {
        for (int root = 0; root < c.size(); ++root) {
          for (std::size_t count : counts(c.size())) {
            INFO(name_of(backend) << " " << name_of(algorithm) << " root " << root << " count "
                                  << count);
            std::vector<TestType> data = inputs<TestType>(c.rank() == root ? 100 : c.rank(), count);
            c.broadcast(std::span(data), root, algorithm);
            CHECK(data == inputs<TestType>(100, count));
          }
        }
      }
    });
  }
}

TEMPLATE_TEST_CASE("allgather collects every rank's block in rank order", "[comm][allgather]",
                   float, std::int32_t, coltrain::bfloat16) {
  for (Backend backend : kBackends) {
    Communicator& comm = shared_communicator(backend);
    const auto p = static_cast<std::size_t>(comm.size());
    for_each_tuning(comm, [&](Communicator& c) {
      for (Algorithm algorithm : algorithms(backend, Collective::kAllgather)) {
        for (std::size_t count : counts(c.size())) {
          INFO(name_of(backend) << " " << name_of(algorithm) << " count " << count);
          std::vector<TestType> expected;
          for (int r = 0; r < c.size(); ++r) {
            const auto block = inputs<TestType>(r, count);
            expected.insert(expected.end(), block.begin(), block.end());
          }
          const std::vector<TestType> mine = inputs<TestType>(c.rank(), count);
          std::vector<TestType> output(count * p);
          c.allgather(std::span<const TestType>(mine), std::span(output), algorithm);
          CHECK(output == expected);

          std::vector<TestType> in_place(count * p);
          std::copy(mine.begin(), mine.end(), in_place.begin() + c.rank() * count);
          c.allgather(std::span(in_place), algorithm);
          CHECK(in_place == expected);
        }
      }
    });
  }
}

TEMPLATE_TEST_CASE("reduce_scatter gives each rank its block of the reduction",
                   "[comm][reduce_scatter]", float, double, std::int64_t, coltrain::half) {
  for (Backend backend : kBackends) {
    Communicator& comm = shared_communicator(backend);
    const int p = comm.size();
    for_each_tuning(comm, [&](Communicator& c) {
      for (Algorithm algorithm : algorithms(backend, Collective::kReduceScatter)) {
        for (ReduceOp op : kOps) {
          for (std::size_t count : counts(p)) {
            INFO(name_of(backend) << " " << name_of(algorithm) << " " << name_of(op) << " count "
                                  << count);
            const std::size_t first = count * static_cast<std::size_t>(c.rank());
            std::vector<TestType> expected(count);
            for (std::size_t i = 0; i < count; ++i)
              expected[i] = reference<TestType>(op, p, first + i);
            const std::vector<TestType> all = inputs<TestType>(c.rank(), count * p);
            std::vector<TestType> output(count);
            c.reduce_scatter(std::span<const TestType>(all), std::span(output), op, algorithm);
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < count; ++i) wrong += !same_bits(output[i], expected[i]);
            CHECK(wrong == 0);

            std::vector<TestType> in_place = all;
            c.reduce_scatter(std::span(in_place), op, algorithm);
            wrong = 0;
            for (std::size_t i = 0; i < count; ++i)
              wrong += !same_bits(in_place[first + i], expected[i]);
            CHECK(wrong == 0);
          }
        }
      }
    });
  }
}

TEMPLATE_TEST_CASE("reduce leaves the reduction on the root", "[comm][reduce]", float, std::int32_t,
                   coltrain::bfloat16) {
  for (Backend backend : kBackends) {
    Communicator& comm = shared_communicator(backend);
    const int p = comm.size();
    for_each_tuning(comm, [&](Communicator& c) {
      for (Algorithm algorithm : algorithms(backend, Collective::kReduce)) {
        for (ReduceOp op : kOps) {
          for (int root = 0; root < p; ++root) {
            for (std::size_t count : counts(p)) {
              INFO(name_of(backend) << " " << name_of(algorithm) << " " << name_of(op) << " root "
                                    << root << " count " << count);
              std::vector<TestType> data = inputs<TestType>(c.rank(), count);
              std::vector<TestType> output(c.rank() == root ? count : 0);
              c.reduce(std::span<const TestType>(data), std::span(output), root, op, algorithm);
              c.reduce(std::span(data), root, op, algorithm);  // in place
              if (c.rank() == root) {
                std::size_t wrong = 0;
                for (std::size_t i = 0; i < count; ++i) {
                  wrong += !same_bits(output[i], reference<TestType>(op, p, i));
                  wrong += !same_bits(data[i], reference<TestType>(op, p, i));
                }
                CHECK(wrong == 0);
              }
            }
          }
        }
      }
    });
  }
}

TEST_CASE("barrier holds every rank until all have entered", "[comm][barrier]") {
  for (Backend backend : kBackends) {
    Communicator& comm = shared_communicator(backend);
    // All ranks share this host, so a file is a signal that travels outside the communicator.
    std::vector<std::int64_t> token{comm.rank() == 0 ? static_cast<std::int64_t>(::getpid()) : 0};
    comm.broadcast(std::span(token), 0);
    for (Algorithm algorithm : algorithms(backend, Collective::kBarrier)) {
      INFO(name_of(backend) << " " << name_of(algorithm));
      const std::filesystem::path signal =
          std::filesystem::temp_directory_path() /
          ("coltrain-barrier-" + std::to_string(token[0]) + "-" + std::string(name_of(backend)) +
           "-" + std::string(name_of(algorithm)));
      // Rank 0 creates the file only after a pause; a barrier that let anyone through before rank 0
      // entered it would let that rank look before the file exists.
      if (comm.rank() == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        std::ofstream(signal).put('1');
      }
      comm.barrier(algorithm);
      CHECK(std::filesystem::exists(signal));
      comm.barrier(algorithm);  // everyone has looked
      if (comm.rank() == 0) std::filesystem::remove(signal);
    }
  }
}

TEST_CASE("automatic picks an algorithm the collective has", "[comm][automatic]") {
  for (Backend backend : kBackends) {
    Communicator& comm = shared_communicator(backend);
    for (Collective collective :
         {Collective::kAllreduce, Collective::kBroadcast, Collective::kAllgather,
          Collective::kReduceScatter, Collective::kReduce, Collective::kBarrier}) {
      for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 16, std::size_t{1} << 26}) {
        const Algorithm chosen = comm.choose(collective, bytes);
        const auto supported = algorithms(backend, collective);
        INFO(name_of(backend) << " " << name_of(collective) << " " << bytes
                              << " bytes: " << name_of(chosen));
        CHECK(chosen != Algorithm::kAutomatic);
        CHECK(std::find(supported.begin(), supported.end(), chosen) != supported.end());
      }
    }
  }
}

TEST_CASE("invalid calls are rejected before any communication", "[comm][errors]") {
  Communicator& tcp = shared_communicator(Backend::kTcp);
  std::vector<float> data(4);
  std::vector<float> short_output(3);
  CHECK_THROWS_WITH(tcp.allreduce(std::span(data), ReduceOp::kSum, Algorithm::kNative),
                    Catch::Contains("'native' needs the MPI backend"));
  CHECK_THROWS_WITH(
      tcp.allgather(std::span<const float>(data), std::span(short_output), Algorithm::kTree),
      Catch::Contains("output has 3 elements"));
  std::vector<float> gathered(4 * static_cast<std::size_t>(tcp.size()));
  CHECK_THROWS_WITH(
      tcp.allgather(std::span<const float>(data), std::span(gathered), Algorithm::kTree),
      Catch::Contains("allgather has no algorithm 'tree'"));
  CHECK_THROWS_WITH(tcp.allreduce(std::span<const float>(data), std::span(short_output)),
                    Catch::Contains("output has 3 elements, expected 4"));
  CHECK_THROWS_WITH(tcp.broadcast(std::span(data), tcp.size()),
                    Catch::Contains("is not a rank of this"));
  // The communicator is still usable: nothing was sent.
  tcp.allreduce(std::span(data));
  CHECK(data[0] == 0.0f);
}
