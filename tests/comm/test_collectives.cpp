// Every collective x algorithm x backend x dtype x op, for the world size mpiexec gives (CTest runs
// 1 to 4 ranks), counts 0, 1, fewer than the ranks, odd, and several pipeline chunks, in place and
// out of place, against references exact by construction.
#include <catch2/catch.hpp>

#include "collective_fixtures.hpp"

#include <coltrain/comm.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
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
constexpr std::size_t kSmallChunkBytes = 256;

template <class Body>
void for_each_tuning(Communicator& comm, Body body) {
  const AlgorithmTuning original = comm.tuning();
  for (std::size_t chunk_bytes : {kSmallChunkBytes, original.chunk_bytes}) {
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

// Those to run under `comm`'s present tuning: MPI's own collectives take no chunk size, so they run
// under the default tuning only (a native call of 5 ranks sharing 2 cores costs about 25 ms).
std::vector<Algorithm> algorithms(Backend backend, Collective collective,
                                  const Communicator& comm) {
  std::vector<Algorithm> result = algorithms(backend, collective);
  if (comm.tuning().chunk_bytes == kSmallChunkBytes) std::erase(result, Algorithm::kNative);
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
    for (Algorithm algorithm : algorithms(backend, Collective::kAllreduce, c)) {
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
      for (Algorithm algorithm : algorithms(backend, Collective::kBroadcast, c)) {
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
      for (Algorithm algorithm : algorithms(backend, Collective::kAllgather, c)) {
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
      for (Algorithm algorithm : algorithms(backend, Collective::kReduceScatter, c)) {
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
      for (Algorithm algorithm : algorithms(backend, Collective::kReduce, c)) {
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

namespace {

// Element i of the block that rank `sender` has for rank `receiver`: distinct for every sender,
// receiver (5 ranks at most) and i mod 4, and exact in every element type, bf16 included (< 256).
template <class T>
T block_value(int sender, int receiver, std::size_t i) {
  return coltrain::testing::to_element<T>((sender * 5 + receiver) * 4 + static_cast<int>(i % 4));
}

// Rank `sender`'s p blocks of `count`, block j meant for rank j.
template <class T>
std::vector<T> blocks_from(int sender, int p, std::size_t count) {
  std::vector<T> data;
  for (int receiver = 0; receiver < p; ++receiver)
    for (std::size_t i = 0; i < count; ++i) data.push_back(block_value<T>(sender, receiver, i));
  return data;
}

// What rank `receiver` holds after an alltoall: block j is what rank j had for it.
template <class T>
std::vector<T> blocks_to(int receiver, int p, std::size_t count) {
  std::vector<T> data;
  for (int sender = 0; sender < p; ++sender)
    for (std::size_t i = 0; i < count; ++i) data.push_back(block_value<T>(sender, receiver, i));
  return data;
}

}  // namespace

TEMPLATE_TEST_CASE("alltoall sends block j of every rank to rank j", "[comm][alltoall]", float,
                   double, std::int32_t, std::int64_t, coltrain::half, coltrain::bfloat16) {
  for (Backend backend : kBackends) {
    Communicator& c = shared_communicator(backend);
    const int p = c.size();
    for (Algorithm algorithm : algorithms(backend, Collective::kAlltoall)) {
      for (std::size_t count : counts(p)) {
        INFO(name_of(backend) << " " << name_of(algorithm) << " count " << count);
        const std::vector<TestType> mine = blocks_from<TestType>(c.rank(), p, count);
        std::vector<TestType> output(mine.size(), coltrain::testing::to_element<TestType>(-7));
        c.alltoall(std::span<const TestType>(mine), std::span(output), algorithm);
        CHECK(output == blocks_to<TestType>(c.rank(), p, count));
        CHECK(mine == blocks_from<TestType>(c.rank(), p, count));  // the input is left alone

        std::vector<TestType> in_place = mine;
        c.alltoall(std::span(in_place), algorithm);
        CHECK(in_place == blocks_to<TestType>(c.rank(), p, count));
      }
    }
  }
}

TEMPLATE_TEST_CASE("gather collects every rank's block on the root, scatter hands them out",
                   "[comm][gather][scatter]", float, std::int64_t, coltrain::bfloat16) {
  for (Backend backend : kBackends) {
    Communicator& c = shared_communicator(backend);
    const int p = c.size();
    const auto blocks = static_cast<std::size_t>(p);
    for (Algorithm algorithm : algorithms(backend, Collective::kGather)) {
      for (int root = 0; root < p; ++root) {
        for (std::size_t count : counts(p)) {
          INFO(name_of(backend) << " " << name_of(algorithm) << " root " << root << " count "
                                << count);
          // Gather: rank r's block is what it has for the root.
          std::vector<TestType> mine(count);
          for (std::size_t i = 0; i < count; ++i)
            mine[i] = block_value<TestType>(c.rank(), root, i);
          std::vector<TestType> gathered(c.rank() == root ? count * blocks : 0,
                                         coltrain::testing::to_element<TestType>(-7));
          c.gather(std::span<const TestType>(mine), std::span(gathered), root, algorithm);
          if (c.rank() == root) CHECK(gathered == blocks_to<TestType>(root, p, count));

          // Scatter: the root's block j is what it has for rank j.
          const std::vector<TestType> all =
              c.rank() == root ? blocks_from<TestType>(root, p, count) : std::vector<TestType>{};
          std::vector<TestType> received(count, coltrain::testing::to_element<TestType>(-7));
          c.scatter(std::span<const TestType>(all), std::span(received), root, algorithm);
          std::vector<TestType> expected(count);
          for (std::size_t i = 0; i < count; ++i)
            expected[i] = block_value<TestType>(root, c.rank(), i);
          CHECK(received == expected);
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("allgatherv collects blocks of different sizes in rank order",
                   "[comm][allgatherv]", float, std::int64_t, coltrain::half) {
  for (Backend backend : kBackends) {
    Communicator& c = shared_communicator(backend);
    const int p = c.size();
    for (Algorithm algorithm : algorithms(backend, Collective::kAllgatherv)) {
      for (std::size_t shift : {0, 1, 2}) {
        // Rank i's count: 0, 1 or 600 (several 256-byte chunks), varying with the rank.
        std::vector<std::size_t> counts;
        for (int i = 0; i < p; ++i) counts.push_back(std::array{0, 1, 600}[(i + shift) % 3]);
        INFO(name_of(backend) << " " << name_of(algorithm) << " shift " << shift);
        std::vector<TestType> expected;
        for (int i = 0; i < p; ++i)
          for (std::size_t k = 0; k < counts[static_cast<std::size_t>(i)]; ++k)
            expected.push_back(block_value<TestType>(i, 0, k));
        std::vector<TestType> mine;
        for (std::size_t k = 0; k < counts[static_cast<std::size_t>(c.rank())]; ++k)
          mine.push_back(block_value<TestType>(c.rank(), 0, k));
        std::vector<TestType> output(expected.size(), coltrain::testing::to_element<TestType>(-7));
        c.allgatherv(std::span<const TestType>(mine), std::span(output), std::span(counts),
                     algorithm);
        CHECK(output == expected);
      }
    }
  }
}

TEMPLATE_TEST_CASE("alltoallv moves blocks of any size between any places", "[comm][alltoallv]",
                   float, std::int32_t, coltrain::bfloat16) {
  for (Backend backend : kBackends) {
    Communicator& c = shared_communicator(backend);
    const int p = c.size();
    const auto up = static_cast<std::size_t>(p);
    const auto me = static_cast<std::size_t>(c.rank());
    for (Algorithm algorithm : algorithms(backend, Collective::kAlltoallv)) {
      for (std::size_t shift : {0, 1, 2, 3}) {
        INFO(name_of(backend) << " " << name_of(algorithm) << " shift " << shift);
        // Rank i sends rank j (i + 2j + shift) mod 4 elements, 0 included.
        const auto count = [&](std::size_t from, std::size_t to) {
          return (from + 2 * to + shift) % 4;
        };
        // Send blocks in reverse rank order, receive blocks in rank order, one spare element
        // after each block: displacements are not the packed ones.
        std::vector<std::size_t> send_counts(up), send_displacements(up);
        std::vector<std::size_t> recv_counts(up), recv_displacements(up);
        std::size_t sent = 0, received = 0;
        for (std::size_t k = 0; k < up; ++k) {
          const std::size_t j = up - 1 - k;
          send_counts[j] = count(me, j);
          send_displacements[j] = sent;
          sent += send_counts[j] + 1;
          recv_counts[k] = count(k, me);
          recv_displacements[k] = received;
          received += recv_counts[k] + 1;
        }
        const TestType spare = coltrain::testing::to_element<TestType>(-7);
        std::vector<TestType> input(sent, spare);
        for (std::size_t j = 0; j < up; ++j)
          for (std::size_t k = 0; k < send_counts[j]; ++k)
            input[send_displacements[j] + k] = block_value<TestType>(c.rank(), int(j), k);
        std::vector<TestType> expected(received, spare);
        for (std::size_t i = 0; i < up; ++i)
          for (std::size_t k = 0; k < recv_counts[i]; ++k)
            expected[recv_displacements[i] + k] = block_value<TestType>(int(i), c.rank(), k);
        std::vector<TestType> output(received, spare);
        c.alltoallv(std::span<const TestType>(input), std::span(send_counts),
                    std::span(send_displacements), std::span(output), std::span(recv_counts),
                    std::span(recv_displacements), algorithm);
        CHECK(output == expected);  // the spare elements untouched
      }
    }
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

// Hosts as COLTRAIN_HOST_ID makes them on one machine: each rank's host number under a layout.
int host_number(const std::string& layout, int rank, int size) {
  if (layout == "pairs") return rank / 2;                 // 0 0 1 1 2: hosts of 2, the last of 1
  if (layout == "interleaved") return rank % 2;           // 0 1 0 1 0: ranks of a host not adjacent
  if (layout == "first alone") return rank == 0 ? 0 : 1;  // one rank, then all the others
  if (layout == "each its own") return rank;
  return size;  // "one host"
}

TEMPLATE_TEST_CASE("hierarchical allreduce is exact on every layout of ranks over hosts",
                   "[comm][allreduce][hierarchical]", float, std::int32_t, double, bfloat16) {
  const int p = coltrain::testing::world_size();
  const int me = coltrain::testing::world_rank();
  for (const std::string layout :
       {"pairs", "interleaved", "first alone", "each its own", "one host"}) {
    for (Backend backend : kBackends) {
      CommOptions options;
      options.host_id = "host" + std::to_string(host_number(layout, me, p));
      Communicator comm = coltrain::testing::make_communicator(backend, options);
      const HostLayout& hosts = comm.host_layout();
      REQUIRE(hosts.ranks() == p);
      for (int r = 0; r < p; ++r) {
        for (int q = 0; q < p; ++q) {
          CHECK((hosts.host_of(r) == hosts.host_of(q)) ==
                (host_number(layout, r, p) == host_number(layout, q, p)));
        }
      }
      for_each_tuning(comm, [&](Communicator& c) {
        for (ReduceOp op : kOps) {
          for (std::size_t count : counts(p)) {
            for (bool in_place : {false, true}) {
              INFO(layout << " " << name_of(backend) << " " << name_of(data_type_v<TestType>) << " "
                          << name_of(op) << " count " << count
                          << (in_place ? " in place" : " out of place"));
              check_allreduce<TestType>(c, Algorithm::kHierarchical, op, count, in_place);
            }
          }
        }
      });
    }
  }
}

TEST_CASE("automatic keeps large vectors off the flat ring where hosts alternate",
          "[comm][automatic][hierarchical]") {
  const int p = coltrain::testing::world_size();
  const int me = coltrain::testing::world_rank();
  CommOptions options;
  options.host_id = "host" + std::to_string(host_number("interleaved", me, p));
  Communicator comm = coltrain::testing::make_communicator(Backend::kTcp, options);
  const std::size_t large = std::size_t{64} << 20;
  if (p >= 4) {
    // Two hosts of two ranks or more: a flat ring crosses between hosts at every link.
    // Hierarchical sends each byte between hosts once, and so does halving-doubling, whose large
    // steps pair ranks of one host here.
    const Algorithm chosen = comm.choose(Collective::kAllreduce, large);
    CHECK((chosen == Algorithm::kHierarchical || chosen == Algorithm::kHalvingDoubling));
  }
  if (p <= 2) {  // one host, or one rank per host: nothing to gain
    CHECK(comm.choose(Collective::kAllreduce, large) != Algorithm::kHierarchical);
  }
  CHECK(shared_communicator(Backend::kTcp).choose(Collective::kAllreduce, large) !=
        Algorithm::kHierarchical);  // every rank on this one host
}

TEST_CASE("on one host automatic prices messages at shared memory's costs, unless it is off",
          "[comm][automatic][cost]") {
  const int p = coltrain::testing::world_size();
  // Shared memory with a huge per-message cost, TCP with none: at 8 KiB the fewest messages win
  // on shared memory (rank order's one round of p - 1 messages on 2-4 ranks), the fewest bytes
  // over TCP (rank order sends every rank's whole input to every other rank: never).
  CostModel model = default_cost_model(Backend::kTcp);
  model.point_to_point = {0.001, 1.0 / 3500.0, 1.0 / 6000.0};
  model.same_host = {1000.0, 1.0 / 13000.0, 1.0 / 6000.0};
  const std::size_t small = std::size_t{8} << 10;
  for (bool shared_memory : {true, false}) {
    CommOptions options;
    options.shared_memory = shared_memory;
    Communicator comm = coltrain::testing::make_communicator(Backend::kTcp, options);
    REQUIRE(comm.host_layout().hosts() == 1);
    comm.set_cost_model(model);
    if (p < 2) continue;  // alone, every algorithm costs nothing
    INFO((shared_memory ? "shared memory" : "COLTRAIN_SHM=0"));
    CHECK((comm.choose(Collective::kAllreduce, small) == Algorithm::kRankOrder) == shared_memory);
  }
}

TEST_CASE("automatic picks an algorithm the collective has", "[comm][automatic]") {
  for (Backend backend : kBackends) {
    Communicator& comm = shared_communicator(backend);
    for (Collective collective :
         {Collective::kAllreduce, Collective::kBroadcast, Collective::kAllgather,
          Collective::kReduceScatter, Collective::kReduce, Collective::kBarrier,
          Collective::kAlltoall, Collective::kGather, Collective::kScatter}) {
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

TEST_CASE("automatic leaves MPI's own collectives out where the ranks outnumber the cores",
          "[comm][automatic]") {
  Communicator& comm = shared_communicator(Backend::kMpi);
  const bool shares_cores = static_cast<unsigned>(comm.host_layout().largest_host()) >
                            std::max(1u, std::thread::hardware_concurrency());
  int native_by_the_model = 0;
  for (Collective collective :
       {Collective::kAllreduce, Collective::kBroadcast, Collective::kAllgather, Collective::kReduce,
        Collective::kBarrier}) {
    for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 16, std::size_t{1} << 26}) {
      const Algorithm chosen = comm.choose(collective, bytes);
      INFO(name_of(collective) << " " << bytes << " bytes: " << name_of(chosen) << ", "
                               << comm.host_layout().largest_host() << " ranks on this host");
      if (shares_cores) CHECK(chosen != Algorithm::kNative);
      native_by_the_model += choose_algorithm(comm.cost_model(), collective, comm.host_layout(),
                                              bytes, true) == Algorithm::kNative;
    }
  }
  // The model alone picks MPI's own somewhere, so the checks above could fail.
  if (comm.size() > 1) CHECK(native_by_the_model > 0);
}

TEST_CASE("automatic follows a tuning file's rules for this job's shape, the model elsewhere",
          "[comm][automatic][tuning]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("coltrain_tuning_rank" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (Backend backend : kBackends) {
    INFO(name_of(backend));
    Communicator& shared = shared_communicator(backend);
    const int p = shared.size();
    const int hosts = shared.host_layout().hosts();
    // Rules unlike the model's picks: tree below 1 KiB, halving-doubling from there on (the model
    // picks ring for large vectors), ring for every broadcast.
    TuningFile file;
    file.rules.push_back({backend,
                          Collective::kAllreduce,
                          p,
                          hosts,
                          {{0, Algorithm::kTree}, {1024, Algorithm::kHalvingDoubling}}});
    file.rules.push_back({backend, Collective::kBroadcast, p, hosts, {{0, Algorithm::kRing}}});
    CostModel fitted = default_cost_model(backend);
    fitted.point_to_point.alpha_us = 123.0;
    fitted.same_host.alpha_us = 123.0;  // what the model uses where every rank is on one host
    file.cost_models[backend] = fitted;
    // Single copy between ranks of a host: from 128 KiB on huge pages, 256 KiB to 8 MiB elsewhere.
    file.single_copy_exchanges = CallSizeRange{1 << 17};
    file.single_copy_exchanges_on_small_pages = CallSizeRange{1 << 18, 8 << 20};
    // A rule for reduce on p + 1 ranks that the model with the file's constants would not pick.
    const bool native_candidate =
        backend == Backend::kMpi && static_cast<unsigned>(shared.host_layout().largest_host()) <=
                                        std::max(1u, std::thread::hardware_concurrency());
    const std::size_t large = std::size_t{64} << 20;
    const Algorithm by_model = choose_algorithm(fitted, Collective::kReduce, shared.host_layout(),
                                                large, native_candidate);
    file.rules.push_back(
        {backend,
         Collective::kReduce,
         p + 1,
         hosts,
         {{0, by_model == Algorithm::kTree ? Algorithm::kRing : Algorithm::kTree}}});
    // Through the environment, as a job gets it; each rank writes its own copy.
    const auto path = dir / (std::string(name_of(backend)) + ".json");
    save_tuning_file(path, file);
    ::setenv("COLTRAIN_TUNING_FILE", path.c_str(), 1);
    Communicator comm = coltrain::testing::make_communicator(backend, comm_options_from_env());
    ::unsetenv("COLTRAIN_TUNING_FILE");
    CHECK(comm.cost_model().point_to_point.alpha_us == 123.0);
    CHECK(comm.options().single_copy_exchanges == *file.single_copy_exchanges);
    CHECK(comm.options().single_copy_exchanges_on_small_pages ==
          *file.single_copy_exchanges_on_small_pages);
    CHECK(comm.choose(Collective::kAllreduce, 1000) == Algorithm::kTree);
    CHECK(comm.choose(Collective::kAllreduce, 1024) == Algorithm::kHalvingDoubling);
    CHECK(comm.choose(Collective::kAllreduce, large) == Algorithm::kHalvingDoubling);
    CHECK(comm.choose(Collective::kBroadcast, large) == Algorithm::kRing);
    // No rule for reduce on p ranks (the file's is for p + 1): the model, with the file's
    // constants, decides.
    CHECK(comm.choose(Collective::kReduce, large) == by_model);
    if (p > 1) {
      // The model alone picks another algorithm for some of these, so the rules above mattered.
      CHECK((shared.choose(Collective::kAllreduce, 1000) != Algorithm::kTree ||
             shared.choose(Collective::kAllreduce, large) != Algorithm::kHalvingDoubling ||
             shared.choose(Collective::kBroadcast, large) != Algorithm::kRing));
    }
    // Calls under the file's rules still give the exact result.
    // (1 MiB: by single copy over TCP between ranks of a host, by the file's 4 KiB-page range.)
    for (std::size_t count : {std::size_t{7}, std::size_t{1500}, std::size_t{1} << 18})
      check_allreduce<float>(comm, Algorithm::kAutomatic, ReduceOp::kSum, count, false);
    // A split group keeps the file: its rules for its own shape, none here.
    std::optional<Communicator> half = comm.split(comm.rank() % 2, comm.rank());
    REQUIRE(half);
    CHECK(half->cost_model().point_to_point.alpha_us == 123.0);
    CHECK(half->options().single_copy_exchanges_on_small_pages ==
          *file.single_copy_exchanges_on_small_pages);

    // The API does the same for a communicator made without the variable.
    TuningFile tree_only;
    tree_only.rules.push_back({backend, Collective::kAllreduce, p, hosts, {{0, Algorithm::kTree}}});
    Communicator plain = coltrain::testing::make_communicator(backend);
    plain.use_tuning(tree_only);
    CHECK(plain.choose(Collective::kAllreduce, large) == Algorithm::kTree);
    // A file without single-copy ranges leaves the options' as they were; one with them replaces
    // them.
    CHECK(plain.options().single_copy_exchanges == CommOptions{}.single_copy_exchanges);
    CHECK(plain.options().single_copy_exchanges_on_small_pages == kNoCallSizes);
    plain.use_tuning(file);
    CHECK(plain.options().single_copy_exchanges_on_small_pages ==
          *file.single_copy_exchanges_on_small_pages);
    check_allreduce<float>(plain, Algorithm::kRing, ReduceOp::kSum, std::size_t{1} << 18, false);
  }
  // A file that is not a tuning file stops the communicator before it is made, naming the file.
  const auto bad = dir / "bad.json";
  std::ofstream(bad) << "{\"format\": \"coltrain-tuning\", \"version\": 7}";
  CommOptions options;
  options.tuning_file = bad;
  CHECK_THROWS_WITH(coltrain::testing::make_communicator(Backend::kTcp, options),
                    Catch::Contains("tuning file " + bad.string()) && Catch::Contains("not 7"));
  std::filesystem::remove_all(dir);
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
  const std::size_t p = static_cast<std::size_t>(tcp.size());
  std::vector<float> blocks(2 * p + 1);
  std::vector<float> blocks_out(2 * p + 1);
  if (p > 1) {  // 2p + 1 elements are not p equal blocks
    CHECK_THROWS_WITH(tcp.alltoall(std::span<const float>(blocks), std::span(blocks_out)),
                      Catch::Contains("input has " + std::to_string(2 * p + 1) + " elements"));
  }
  std::vector<float> exchange(4 * p);
  CHECK_THROWS_WITH(tcp.alltoall(std::span<const float>(exchange).first(2 * p),
                                 std::span(exchange).subspan(p, 2 * p)),
                    Catch::Contains("input and output overlap"));
  CHECK_THROWS_WITH(
      tcp.gather(std::span<const float>(data), std::span(gathered), 0, Algorithm::kNative),
      Catch::Contains("on the tcp backend gather has tree"));
  CHECK_THROWS_WITH(tcp.scatter(std::span<const float>(gathered), std::span(data), -1),
                    Catch::Contains("root -1 is not a rank of this"));
  CHECK_THROWS_WITH(tcp.alltoall(std::span(exchange), Algorithm::kRing),
                    Catch::Contains("alltoall has no algorithm 'ring'"));
  // The communicator is still usable: nothing was sent.
  tcp.allreduce(std::span(data));
  CHECK(data[0] == 0.0f);
}

namespace {

// The value rank r holds at index i in the compression tests: not exact in 16 bits, and near 1 for
// products so that they stay in f16's range over five ranks.
float compressible(ReduceOp op, int r, std::size_t i) {
  if (op == ReduceOp::kProd) return 1.0f + 0.0123f * static_cast<float>((r + i) % 7);
  return 0.37f * static_cast<float>(r + 1) - 0.0137f * static_cast<float>(i % 311);
}

template <class F>
float round_through(float x) {
  return static_cast<float>(F(x));
}

// What compressed allreduce defines: each input rounded to F, reduced in f32 in rank order, the
// result rounded to F once.
template <class F>
float compressed_reference(ReduceOp op, int ranks, std::size_t i) {
  float result = round_through<F>(compressible(op, 0, i));
  for (int r = 1; r < ranks; ++r) {
    const float x = round_through<F>(compressible(op, r, i));
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        result = result + x;
        break;
      case ReduceOp::kProd:
        result = result * x;
        break;
      case ReduceOp::kMin:
        result = x < result ? x : result;
        break;
      case ReduceOp::kMax:
        result = result < x ? x : result;
        break;
    }
  }
  if (op == ReduceOp::kAvg) result = result / static_cast<float>(ranks);
  return round_through<F>(result);
}

}  // namespace

TEST_CASE(
    "allreduce with wire compression gives the f32 reduction of the rounded inputs, rounded once",
    "[comm][allreduce][compression]") {
  const Backend backend = GENERATE(Backend::kMpi, Backend::kTcp);
  const WireCompression wire = GENERATE(WireCompression::kBFloat16, WireCompression::kFloat16);
  CAPTURE(name_of(backend), name_of(wire));
  Communicator& comm = shared_communicator(backend);
  const int rank = comm.rank();
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{4099}}) {
      CAPTURE(name_of(op), count);
      std::vector<float> input(count);
      for (std::size_t i = 0; i < count; ++i) input[i] = compressible(op, rank, i);
      std::vector<float> output(count, -1.0f);
      std::vector<float> in_place = input;
      std::vector<float> issued = input;
      comm.allreduce(std::span<const float>(input), std::span(output), op, Algorithm::kAutomatic,
                     wire);
      comm.allreduce(std::span(in_place), op, Algorithm::kAutomatic, wire);
      comm.iallreduce(std::span(issued), op, Algorithm::kAutomatic, wire).wait();
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const float expected = wire == WireCompression::kFloat16
                                   ? compressed_reference<half>(op, comm.size(), i)
                                   : compressed_reference<bfloat16>(op, comm.size(), i);
        wrong += output[i] != expected || in_place[i] != expected || issued[i] != expected;
      }
      CHECK(wrong == 0);
    }
  }
  // The communicator's default applies to f32 calls that do not say, and only to them.
  comm.set_wire_compression(wire);
  std::vector<float> halves(10, compressible(ReduceOp::kSum, rank, 5));
  std::vector<double> doubles(10, 0.1);
  comm.allreduce(std::span(halves));
  comm.allreduce(std::span(doubles));
  comm.set_wire_compression(WireCompression::kNone);
  CHECK(halves[0] == (wire == WireCompression::kFloat16
                          ? compressed_reference<half>(ReduceOp::kSum, comm.size(), 5)
                          : compressed_reference<bfloat16>(ReduceOp::kSum, comm.size(), 5)));
  CHECK(doubles[0] == Approx(0.1 * comm.size()).epsilon(1e-12));
  // Compression takes f32 and its own schedule.
  std::vector<double> wide(4, 1.0);
  CHECK_THROWS_WITH(comm.allreduce(std::span(wide), ReduceOp::kSum, Algorithm::kAutomatic, wire),
                    Catch::Contains("wire compression takes f32 data, not f64"));
  CHECK_THROWS_WITH(comm.allreduce(std::span(halves), ReduceOp::kSum, Algorithm::kRing, wire),
                    Catch::Contains("pass Algorithm::kAutomatic, not 'ring'"));
}
