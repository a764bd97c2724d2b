// A program that uses coltrain as a downstream code would. It is built by CMake (find_package and
// add_subdirectory) and by bare compiler lines (mpicxx, g++), and checks its own results.
#include <coltrain/coltrain.hpp>

#include <cstdio>
#include <exception>
#include <vector>

#if COLTRAIN_SEPARATE_COMPILATION
int rank_of(const coltrain::comm::Communicator& comm);  // second_file.cpp
#endif

int main() {
  try {
    const coltrain::LaunchEnv env = coltrain::detect_launch_env();
    // MPI under an MPI launcher when built with it; coltrain's TCP transport otherwise.
    coltrain::comm::Communicator comm = coltrain::comm::Communicator::from_env();
    if (comm.rank() != env.rank || comm.size() != env.world_size) {
      std::fprintf(stderr, "communicator says rank %d of %d, launcher says %d of %d\n", comm.rank(),
                   comm.size(), env.rank, env.world_size);
      return 1;
    }
#if COLTRAIN_SEPARATE_COMPILATION
    if (rank_of(comm) != comm.rank()) {
      std::fprintf(stderr, "the second file sees rank %d, main sees %d\n", rank_of(comm),
                   comm.rank());
      return 1;
    }
#endif
    // Every rank contributes rank + 1 in fp16; 1 + 2 + ... + n is exact in fp16 here.
    std::vector<coltrain::half> values{coltrain::half(static_cast<float>(env.rank + 1))};
    comm.allreduce(std::span(values));
    const float expected = static_cast<float>(env.world_size * (env.world_size + 1) / 2);
    if (static_cast<float>(values[0]) != expected) {
      std::fprintf(stderr, "rank %d: sum %g, expected %g\n", env.rank,
                   static_cast<double>(static_cast<float>(values[0])),
                   static_cast<double>(expected));
      return 1;
    }
    const coltrain::Logger logger(env.rank, env.world_size);
    logger.print_root("consumer ok: coltrain ", coltrain::BuildConfig::kVersion, ", ", comm.size(),
                      " rank(s), launcher ", coltrain::name_of(env.launcher), ", backend ",
                      coltrain::comm::name_of(comm.backend()), ", MPI ",
                      coltrain::BuildConfig::kWithMpi ? "on" : "off", ", CUDA ",
                      coltrain::BuildConfig::kWithCuda ? "on" : "off",
                      COLTRAIN_SEPARATE_COMPILATION ? ", compiled separately" : "");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
