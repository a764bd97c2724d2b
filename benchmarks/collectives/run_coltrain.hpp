#pragma once
// The mpi and tcp backends: coltrain's Communicator with every algorithm it has for the collective,
// on host buffers or staged device buffers, and the algorithm `automatic` chose.

#include "buffers.hpp"
#include "options.hpp"
#include "report.hpp"
#include "series.hpp"
#include "sizes.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/device/staged_collectives.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace coltrain::bench {

// Why `algorithm` does not exist for this collective on this backend, or empty.
inline std::string coltrain_unsupported(Collective collective, Algorithm algorithm, bool mpi) {
  if (algorithm == Algorithm::kAutomatic) return {};
  if (algorithm == Algorithm::kNative && !mpi) {
    return "the TCP backend has no native collectives";
  }
  const auto supported = coltrain::comm::algorithms_for(collective);
  if (std::find(supported.begin(), supported.end(), algorithm) != supported.end()) return {};
  std::string names;
  for (Algorithm a : supported) {
    if (a == Algorithm::kNative && !mpi) continue;
    names += (names.empty() ? "" : ", ") + std::string(coltrain::comm::name_of(a));
  }
  return std::string(coltrain::comm::name_of(collective)) + " has no " +
         std::string(coltrain::comm::name_of(algorithm)) + " algorithm (it has " + names + ")";
}

// The bytes the communicator gives its cost model: the full array, f16 and bf16 reductions in f32.
inline std::size_t model_bytes(const Case& c) {
  const bool widened =
      reduces(c.collective) && (c.dtype == DataType::kFloat16 || c.dtype == DataType::kBFloat16);
  return widened ? c.count * sizeof(float) : c.bytes();
}

// With staging each chunk is a collective of its own, sized by the first (largest) chunk.
inline std::size_t staged_model_bytes(const Case& c,
                                      const coltrain::comm::StagingOptions& staging) {
  const std::size_t blocks = per_rank_blocks(c.collective) ? static_cast<std::size_t>(c.ranks) : 1;
  Case chunk = c;
  chunk.block = coltrain::comm::plan_chunks(c.block, coltrain::size_of(c.dtype), blocks, staging)
                    .chunk(0)
                    .size;
  chunk.count = chunk.block * blocks;
  return model_bytes(chunk);
}

// Host or device buffers alike: Communicator stages device ones on MPI and TCP.
template <class T>
Prepared coltrain_collective(Communicator& comm, Algorithm algorithm, Workspace<T>& workspace,
                             const Case& c) {
  const std::span<const T> in(workspace.input(), workspace.input_count());
  const std::span<T> out(workspace.output(), workspace.output_count());
  switch (c.collective) {
    case Collective::kAllreduce:
      return {[&comm, in, out, c, algorithm] { comm.allreduce(in, out, c.op, algorithm); }};
    case Collective::kBroadcast:
      return {[&comm, out, c, algorithm] { comm.broadcast(out, c.root, algorithm); }};
    case Collective::kAllgather:
      return {[&comm, in, out, algorithm] { comm.allgather(in, out, algorithm); }};
    case Collective::kReduceScatter:
      return {[&comm, in, out, c, algorithm] { comm.reduce_scatter(in, out, c.op, algorithm); }};
    case Collective::kReduce:
      return {[&comm, in, out, c, algorithm] { comm.reduce(in, out, c.root, c.op, algorithm); }};
    case Collective::kAlltoall:
      if (in.data() == out.data())
        return {[&comm, out, algorithm] { comm.alltoall(out, algorithm); }};
      return {[&comm, in, out, algorithm] { comm.alltoall(in, out, algorithm); }};
    default:
      break;
  }
  throw coltrain::InvalidArgument("no such collective in the harness");
}

// A fresh communicator's first 20-30 ms run several times slower on the development VM, over MPI
// and TCP and whatever the algorithm (2 ranks, 8 KiB allreduce: 40-45 us against 4-5 after;
// 2026-12-06), so the first algorithm of every sweep looked slow at its small sizes and never won
// there. Every sweep of a communicator starts after `kSettle` of small broadcasts on it, timed by
// rank 0, whose flag the others follow.
inline constexpr auto kSettle = std::chrono::milliseconds(200);
inline void settle(Communicator& comm) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10'000'000; ++i) {
    std::int32_t go =
        comm.rank() == 0 && std::chrono::steady_clock::now() - start < kSettle ? 1 : 0;
    comm.broadcast(std::span(&go, 1), 0, Algorithm::kTree);
    if (go == 0) return;
  }
}

// Device buffers are staged by `comm`, which runs its algorithm per chunk.
template <class T>
void bench_coltrain(const Options& options, const World& world, Communicator& comm,
                    const std::string& backend, Report& report) {
  const bool mpi = comm.backend() == coltrain::comm::Backend::kMpi;
  const bool staged = options.memory == MemoryKind::kDevice;
  comm.set_staging_options(options.staging);
  const bool compressed = options.compression != coltrain::comm::WireCompression::kNone;
  comm.set_wire_compression(options.compression);
  settle(comm);
  std::string note = staged ? "staged through pinned host memory in chunks of at most " +
                                  std::to_string(options.staging.chunk_bytes) +
                                  " B; automatic chooses per chunk"
                            : "";
  if (compressed) {
    note = std::string("sent as ") + std::string(coltrain::comm::name_of(options.compression)) +
           ", reduced in f32; bandwidths count the f32 bytes";
  }
  for (const std::string& name : options.algorithms) {
    const Algorithm algorithm = coltrain::comm::parse_algorithm(name);
    if (std::string why = coltrain_unsupported(options.collective, algorithm, mpi); !why.empty()) {
      report.skip(backend + " / " + name, why);
      continue;
    }
    if (compressed &&
        (algorithm != Algorithm::kAutomatic || options.collective != Collective::kAllreduce ||
         options.dtype != DataType::kFloat32 || staged)) {
      report.skip(backend + " / " + name,
                  "--compression applies to f32 allreduce on host buffers with the automatic "
                  "algorithm");
      continue;
    }
    const Prepare<T> prepare = [&](Workspace<T>& workspace, const Case& c) {
      return coltrain_collective(comm, algorithm, workspace, c);
    };
    std::function<std::string(const Case&)> chosen;
    if (compressed) {
      chosen = [](const Case&) { return std::string("compressed"); };
    } else if (algorithm == Algorithm::kAutomatic) {
      chosen = [&comm, &options, staged](const Case& c) {
        const std::size_t bytes = staged ? staged_model_bytes(c, options.staging) : model_bytes(c);
        return std::string(coltrain::comm::name_of(comm.choose(c.collective, bytes)));
      };
    }
    run_series<T>(options, world, {backend, name, runs_in_place(options), note}, prepare, chosen,
                  report);
  }
}

}  // namespace coltrain::bench
