// One 256 MB allreduce per backend and algorithm of our own (CTest label `slow`): the sizes where
// chunk counts, socket buffers and MPI's 2 GB count limits matter.
#include <catch2/catch.hpp>

#include "collective_fixtures.hpp"

#include <coltrain/comm.hpp>

#include <vector>

using namespace coltrain;
using namespace coltrain::comm;

TEST_CASE("a 256 MB float allreduce is exact on every backend", "[comm][slow]") {
  constexpr std::size_t kCount = std::size_t{64} << 20;  // 256 MB of float
  for (Backend backend : {Backend::kMpi, Backend::kTcp}) {
    Communicator& comm = coltrain::testing::shared_communicator(backend);
    const int p = comm.size();
    for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kTree, Algorithm::kHalvingDoubling}) {
      INFO(name_of(backend) << " " << name_of(algorithm));
      std::vector<float> data = coltrain::testing::inputs<float>(comm.rank(), kCount);
      comm.allreduce(std::span(data), ReduceOp::kSum, algorithm);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < kCount; ++i) {
        wrong += data[i] != coltrain::testing::reference<float>(ReduceOp::kSum, p, i);
      }
      CHECK(wrong == 0);
    }
  }
}
