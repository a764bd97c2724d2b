#pragma once
// The alpha-beta-gamma cost model behind Algorithm::kAutomatic. A message of n bytes costs
// alpha + n beta; reducing n bytes costs n gamma. Each algorithm's time is predicted from its step
// and byte counts (docs/collectives.md derives them), and automatic picks the cheapest. The
// constants are per backend: MPI and TCP measured on the 2-core development machine with
// coltrain_tune (see docs/benchmarks.md); NCCL's are set for GPUs linked by NVLink or InfiniBand
// (see default_cost_model). Other machines measure their own (coltrain_tune, COLTRAIN_TUNING_FILE)
// or set them through Communicator::set_cost_model.

#include <coltrain/comm/host_layout.hpp>
#include <coltrain/comm/tuning/algorithm_tuning.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

namespace coltrain::comm {

struct LinkCosts {
  double alpha_us = 0;           // per message
  double beta_us_per_byte = 0;   // per byte moved
  double gamma_us_per_byte = 0;  // per byte reduced
};

// How the backend's own allreduce is predicted: MPICH's choice (recursive doubling small,
// Rabenseifner large) or NCCL's (the cheaper of its ring and its tree; reductions fused into the
// transfer, so no gamma term).
enum class NativeShape : std::uint8_t { kMpich, kNccl };

struct CostModel {
  LinkCosts point_to_point;  // coltrain's algorithms over this backend
  LinkCosts native;          // the backend's own collectives (MPI, NCCL); unused for TCP
  // Between ranks of one host, where they differ from point_to_point (the TCP backend's shared
  // memory): what hierarchical allreduce's phases inside a host cost. point_to_point then stands
  // for the links between hosts.
  LinkCosts same_host;
  std::size_t chunk_bytes = std::size_t{256} << 10;  // AlgorithmTuning's default
  NativeShape native_shape = NativeShape::kMpich;
};

// TCP's alpha and beta fitted by coltrain_tune on the development machine (AMD EPYC VM, 2 cores,
// 2 ranks; 2026-12-06, between two runs' fits, docs/benchmarks.md) to every allreduce from 8 B to
// 64 MiB. Gamma is the reduction out of cache, 6 GB/s: where it decided (halving-doubling's
// reductions of whole halves, before they were pipelined) the operands came from memory, and
// coltrain_tune's in-cache kernel rate (24-33 GB/s) made automatic pick halving-doubling at 2-128
// MiB, 1.1-1.7x slower there than the ring (2 ranks, TCP). MPI's constants are the 2026-11 fit
// (MPICH 4.0.2, 2 ranks, at 8 B and 64 MB) but for coltrain's alpha over MPI, 1.0 us (2026-12-07:
// coltrain_tune fitted 1.02-1.28 us): with 0.85 rank order's one-round allreduce took the 8-byte
// calls from MPI_Allreduce, which ran them in 0.8-1.0 us against its 1.3-1.4 (docs/benchmarks.md,
// "Small allreduces in one round"). coltrain_tune's (0.9 us and 6 GB/s; MPICH's own 0.7 us and 4.5
// GB/s) move MPI_Allreduce's share up to 4 KiB, where a rank whose call differs from the others'
// (another wire compression) can no longer be told: MPI's own collectives cannot detect a
// mismatch, and its peer waits inside MPI_Allreduce for good. The TCP constants before are in
// docs/results/cost_model_defaults_before_2026-12-06.tuning.json.
inline CostModel default_cost_model(Backend backend) {
  CostModel model;
  if (backend == Backend::kMpi) {
    model.point_to_point = {1.0, 1.0 / 3500.0, 1.0 / 6000.0};
    model.native = {0.9, 1.0 / 1750.0, 1.0 / 6000.0};
    model.same_host = model.point_to_point;  // MPICH's own shared memory, which it was fitted on
  } else if (backend == Backend::kNccl) {
    // Device buffers on NCCL. Not fitted here (the development machine has no GPU): 40 GB/s per
    // link, between one H100's NVLink share in an 8-GPU node and 4 x 100 Gb/s InfiniBand; NCCL's
    // own collectives start in about 10 us. coltrain's ring and tree issue one NCCL group and one
    // reduction kernel per round, about 25 us; their kernel reduces at HBM speed (1 TB/s of
    // result). Where NCCL's tuning misses a topology, fitted constants let them win.
    model.native = {10.0, 1.0 / 40000.0, 0.0};
    model.point_to_point = {25.0, 1.0 / 40000.0, 1.0 / 1000000.0};
    model.chunk_bytes = std::size_t{1} << 20;  // the NCCL ring's and tree's chunk
    model.native_shape = NativeShape::kNccl;
    model.same_host = model.point_to_point;
  } else {
    // Between hosts: TCP over loopback, without shared memory (COLTRAIN_SHM=0).
    model.point_to_point = {5.5, 1.0 / 3500.0, 1.0 / 6000.0};
    // Shared memory between ranks of one host, large payloads read in place (single copy).
    model.same_host = {0.7, 1.0 / 13000.0, 1.0 / 6000.0};
  }
  return model;
}

namespace detail {

inline double log2_ceil(int p) { return std::ceil(std::log2(static_cast<double>(p))); }

}  // namespace detail

// Predicted time in microseconds of `algorithm` for `collective` on p ranks with n bytes (the
// collective's full array: the allreduce vector, the broadcast buffer, the gathered output).
inline double predict_us(const CostModel& model, Collective collective, Algorithm algorithm, int p,
                         std::size_t n_bytes) {
  if (p <= 1) return 0;
  const double n = static_cast<double>(n_bytes);
  const double steps = p - 1;
  const double share = steps / p;
  const double lg = detail::log2_ceil(p);
  const bool power_of_two = std::has_single_bit(static_cast<unsigned>(p));
  const LinkCosts& c = algorithm == Algorithm::kNative ? model.native : model.point_to_point;
  const double chunk = static_cast<double>(model.chunk_bytes);
  const double chunks = std::max(1.0, std::ceil(n / p / chunk));
  switch (collective) {
    case Collective::kAllreduce:
      switch (algorithm) {
        // Ring and tree are pipelined: reductions overlap transfers, and only the last chunk's
        // reduction adds to the time.
        case Algorithm::kRing:
          return 2 * steps * chunks * c.alpha_us + 2 * share * n * c.beta_us_per_byte +
                 std::min(share * n, chunk) * c.gamma_us_per_byte;
        case Algorithm::kTree: {
          // Each tree carries n/2 in k chunks, and each iteration moves a chunk of either tree up
          // and one down, so the pipeline is 2k units long plus the trees' depth. A rank inside
          // one tree and a leaf of the other sends n/2 up and 2 x n/2 down in the first and n/2
          // up in the second.
          const double tree_chunks = std::max(1.0, std::ceil(n / 2 / chunk));
          return 2 * (lg + tree_chunks) * c.alpha_us + 2 * n * c.beta_us_per_byte +
                 std::min(n / 2, chunk) * c.gamma_us_per_byte;
        }
        case Algorithm::kNative: {
          if (model.native_shape == NativeShape::kNccl) {
            const double ring = 2 * steps * c.alpha_us + 2 * share * n * c.beta_us_per_byte;
            const double tree = 2 * lg * c.alpha_us + 2 * n * c.beta_us_per_byte;
            return std::min(ring, tree) + share * n * c.gamma_us_per_byte;
          }
          // MPICH's own choice: recursive doubling for small vectors, Rabenseifner for large,
          // whose reductions wait for whole halves.
          double rabenseifner = 2 * lg * c.alpha_us + 2 * share * n * c.beta_us_per_byte +
                                share * n * c.gamma_us_per_byte;
          if (!power_of_two) rabenseifner += 2 * c.alpha_us + 2 * n * c.beta_us_per_byte;
          const double doubling =
              lg * (c.alpha_us + n * (c.beta_us_per_byte + c.gamma_us_per_byte));
          return std::min(doubling, rabenseifner);
        }
        case Algorithm::kHalvingDoubling: {
          // coltrain's pipelines its reducing steps as the ring does: the halving step that sends
          // n/2^k bytes sends them in chunks, and only its last chunk's reduction adds. The
          // doubling steps send whole windows. Other p: q = 2^floor(lg p) ranks run it, after a
          // fold of n bytes (pipelined too) and before the whole result goes back.
          const int halvings = std::bit_width(static_cast<unsigned>(p)) - 1;  // lg q
          const auto pipelined = [&](double bytes) {
            return std::max(1.0, std::ceil(bytes / chunk)) * c.alpha_us +
                   bytes * c.beta_us_per_byte + std::min(bytes, chunk) * c.gamma_us_per_byte;
          };
          double time = 0;
          double bytes = n;
          for (int step = 0; step < halvings; ++step) {
            bytes /= 2;
            time += pipelined(bytes) + c.alpha_us + bytes * c.beta_us_per_byte;
          }
          if (!power_of_two) time += pipelined(n) + c.alpha_us + n * c.beta_us_per_byte;
          return time;
        }
        case Algorithm::kRankOrder:
          // Small: every input to every rank in one round of p-1 messages, each rank folding all
          // p copies. Else the ring's bytes, p-1 messages per chunk each way.
          if (n <= static_cast<double>(kRankOrderDirectBytes))
            return steps * (c.alpha_us + n * (c.beta_us_per_byte + c.gamma_us_per_byte));
          return 2 * steps * chunks * c.alpha_us + 2 * share * n * c.beta_us_per_byte +
                 share * n * c.gamma_us_per_byte;
        case Algorithm::kAutomatic:
        case Algorithm::kPairwise:
        case Algorithm::kBruck:
        case Algorithm::kHierarchical:  // needs the hosts: predict_hierarchical_us
          break;
      }
      break;
    case Collective::kBroadcast:
    case Collective::kReduce: {
      const double gamma = collective == Collective::kReduce ? c.gamma_us_per_byte : 0;
      const double pieces = std::max(1.0, std::ceil(n / chunk));
      if (algorithm == Algorithm::kRing) {
        return (steps + pieces - 1) * c.alpha_us + n * (c.beta_us_per_byte + gamma);
      }
      if (algorithm == Algorithm::kTree) {
        return (lg + pieces - 1) * c.alpha_us + 2 * n * c.beta_us_per_byte + n * gamma;
      }
      if (algorithm == Algorithm::kNative) {
        return lg * c.alpha_us + n * (c.beta_us_per_byte + gamma);
      }
      if (algorithm == Algorithm::kRankOrder && collective == Collective::kReduce) {
        return (steps * chunks + steps) * c.alpha_us + 2 * share * n * c.beta_us_per_byte +
               share * n * gamma;
      }
      break;
    }
    case Collective::kAllgather:
    case Collective::kAllgatherv:  // n: the gathered output; blocks of any size, not chunked
    case Collective::kReduceScatter: {
      const double gamma = collective == Collective::kReduceScatter ? c.gamma_us_per_byte : 0;
      if (algorithm == Algorithm::kRing ||
          (algorithm == Algorithm::kRankOrder && collective == Collective::kReduceScatter)) {
        return steps * chunks * c.alpha_us + share * n * (c.beta_us_per_byte + gamma);
      }
      if (algorithm == Algorithm::kNative) {
        return lg * c.alpha_us + share * n * (c.beta_us_per_byte + gamma);
      }
      break;
    }
    case Collective::kBarrier:  // dissemination (kHalvingDoubling) or MPI_Barrier
      if (algorithm == Algorithm::kHalvingDoubling || algorithm == Algorithm::kNative) {
        return lg * c.alpha_us;
      }
      break;
    case Collective::kAlltoall:
    case Collective::kAlltoallv: {
      // n is one rank's input: p blocks of n/p. Pairwise sends each block straight to its rank;
      // Bruck forwards about half of them at each of lg p steps. MPICH's own picks Bruck for
      // small blocks and an exchange like pairwise for large ones.
      const double pairwise = steps * (c.alpha_us + n / p * c.beta_us_per_byte);
      const double bruck = lg * (c.alpha_us + n / 2 * c.beta_us_per_byte);
      if (algorithm == Algorithm::kPairwise) return pairwise;
      if (algorithm == Algorithm::kBruck && collective == Collective::kAlltoall) return bruck;
      if (algorithm == Algorithm::kNative) return std::min(pairwise, bruck);
      break;
    }
    case Collective::kGather:
    case Collective::kScatter:
      // n is the root's whole buffer. A binomial tree (kTree) sends lg p messages along the
      // longest path and (p-1)/p of n into or out of the root.
      if (algorithm == Algorithm::kTree || algorithm == Algorithm::kNative) {
        return lg * c.alpha_us + share * n * c.beta_us_per_byte;
      }
      break;
    case Collective::kSendRecv:
      break;
  }
  return std::numeric_limits<double>::infinity();  // the algorithm does not do this collective
}

// Predicted time in microseconds of hierarchical allreduce (algorithms/hierarchical.hpp) of n bytes
// over `hosts`: the phases inside a host at same_host costs, those across hosts at point_to_point
// costs. The L rings across hosts share each host's network link, so together they move what one
// ring over the hosts would: 2(H-1)/H n bytes per host.
inline double predict_hierarchical_us(const CostModel& model, const HostLayout& hosts,
                                      std::size_t n_bytes) {
  const int h = hosts.hosts();
  const int l = hosts.largest_host();
  if (h * l <= 1) return 0;
  const double n = static_cast<double>(n_bytes);
  const double chunk = static_cast<double>(model.chunk_bytes);
  const LinkCosts& local = model.same_host;
  const LinkCosts& across = model.point_to_point;
  const double across_share = static_cast<double>(h - 1) / h;
  if (!hosts.uniform()) {  // chain to the first rank, ring among first ranks, chain back
    const double pieces = std::max(1.0, std::ceil(n / chunk));
    const double chain = (l - 1 + pieces - 1) * local.alpha_us + n * local.beta_us_per_byte;
    const double chunks = std::max(1.0, std::ceil(n / h / chunk));
    const double ring = 2 * (h - 1) * chunks * across.alpha_us +
                        2 * across_share * n * across.beta_us_per_byte +
                        std::min(across_share * n, chunk) * across.gamma_us_per_byte;
    return 2 * chain + n * local.gamma_us_per_byte + (h > 1 ? ring : 0);
  }
  const double local_share = static_cast<double>(l - 1) / l;
  const double local_chunks = std::max(1.0, std::ceil(n / l / chunk));
  const double inside = 2 * (l - 1) * local_chunks * local.alpha_us +
                        2 * local_share * n * local.beta_us_per_byte +
                        local_share * n * local.gamma_us_per_byte;
  const double across_chunks = std::max(1.0, std::ceil(n / l / h / chunk));
  const double between = 2 * (h - 1) * across_chunks * across.alpha_us +
                         2 * across_share * n * across.beta_us_per_byte +
                         std::min(across_share * n / l, chunk) * across.gamma_us_per_byte;
  return inside + (h > 1 ? between : 0);
}

// The algorithms that carry out `collective` (kNative only where the backend has its own).
inline std::span<const Algorithm> algorithms_for(Collective collective) {
  static constexpr Algorithm kAllreduce[] = {Algorithm::kNative,       Algorithm::kRing,
                                             Algorithm::kTree,         Algorithm::kHalvingDoubling,
                                             Algorithm::kHierarchical, Algorithm::kRankOrder};
  static constexpr Algorithm kRooted[] = {Algorithm::kNative, Algorithm::kRing, Algorithm::kTree};
  static constexpr Algorithm kReduce[] = {Algorithm::kNative, Algorithm::kRing, Algorithm::kTree,
                                          Algorithm::kRankOrder};
  static constexpr Algorithm kGatherScatter[] = {Algorithm::kNative, Algorithm::kRing};
  static constexpr Algorithm kReduceScatter[] = {Algorithm::kNative, Algorithm::kRing,
                                                 Algorithm::kRankOrder};
  static constexpr Algorithm kBarrier[] = {Algorithm::kNative, Algorithm::kHalvingDoubling};
  static constexpr Algorithm kAlltoall[] = {Algorithm::kNative, Algorithm::kPairwise,
                                            Algorithm::kBruck};
  static constexpr Algorithm kRootedBlocks[] = {Algorithm::kNative, Algorithm::kTree};
  static constexpr Algorithm kAlltoallv[] = {Algorithm::kNative, Algorithm::kPairwise};
  switch (collective) {
    case Collective::kAllreduce:
      return kAllreduce;
    case Collective::kBroadcast:
      return kRooted;
    case Collective::kReduce:
      return kReduce;
    case Collective::kAllgather:
    case Collective::kAllgatherv:
      return kGatherScatter;
    case Collective::kReduceScatter:
      return kReduceScatter;
    case Collective::kBarrier:
      return kBarrier;
    case Collective::kAlltoall:
      return kAlltoall;
    case Collective::kGather:
    case Collective::kScatter:
      return kRootedBlocks;
    case Collective::kAlltoallv:
      return kAlltoallv;
    case Collective::kSendRecv:
      break;  // a message, not a collective: no algorithm to choose
  }
  return {};
}

// The cheapest of `candidates` by `price(algorithm)`, in microseconds (the first of them when none
// applies).
template <class Price>
Algorithm cheapest_of(std::span<const Algorithm> candidates, Price price) {
  Algorithm best = candidates.empty() ? Algorithm::kRing : candidates.front();
  double best_us = std::numeric_limits<double>::infinity();
  for (Algorithm algorithm : candidates) {
    const double us = price(algorithm);
    // A tie between ring and halving-doubling (two ranks, up to two chunks: the same messages and
    // bytes) goes to halving-doubling, which measured faster than the ring at 8 B-512 KiB over MPI
    // and TCP (2 ranks, 2026-12-06 and 2026-12-07, docs/benchmarks.md).
    const bool tie_to_halving_doubling = algorithm == Algorithm::kHalvingDoubling &&
                                         best == Algorithm::kRing && us <= best_us * (1 + 1e-12);
    if (us < best_us || tie_to_halving_doubling) {
      best = algorithm;
      best_us = us;
    }
  }
  return best;
}

// The cheapest of `candidates` by the model.
inline Algorithm choose_among(const CostModel& model, Collective collective, int p,
                              std::size_t n_bytes, std::span<const Algorithm> candidates) {
  return cheapest_of(candidates, [&](Algorithm algorithm) {
    return predict_us(model, collective, algorithm, p, n_bytes);
  });
}

// What automatic chooses from on a host backend, hierarchical aside (it competes where there are
// hosts).
struct AutomaticCandidates {
  std::array<Algorithm, 5> algorithms{};
  std::size_t count = 0;
  std::span<const Algorithm> list() const { return std::span(algorithms.data(), count); }
};

inline AutomaticCandidates automatic_candidates(Collective collective, std::size_t n_bytes,
                                                bool native_available) {
  AutomaticCandidates candidates;
  for (Algorithm algorithm : algorithms_for(collective)) {
    // Rank order only as its one-round allreduce (up to kRankOrderDirectBytes); its chunked
    // schedules, which hold p chunks at a time, by name or in deterministic mode.
    if (algorithm == Algorithm::kHierarchical) continue;
    if (algorithm == Algorithm::kRankOrder &&
        (collective != Collective::kAllreduce || n_bytes > kRankOrderDirectBytes))
      continue;
    if (algorithm != Algorithm::kNative || native_available)
      candidates.algorithms.at(candidates.count++) = algorithm;
  }
  return candidates;
}

// The cheapest algorithm by the model on a host backend of p ranks, all of them on one host or each
// on its own.
inline Algorithm choose_algorithm(const CostModel& model, Collective collective, int p,
                                  std::size_t n_bytes, bool native_available) {
  return choose_among(model, collective, p, n_bytes,
                      automatic_candidates(collective, n_bytes, native_available).list());
}

// The same, for ranks on `hosts`. On one host every message goes at same_host costs. Over several
// hosts the flat algorithms' bytes between hosts share each host's network link: the ring's as
// many times as it has links leaving a host (HostLayout::ring_links_leaving_a_host),
// halving-doubling's as its steps cross (halving_doubling_load_leaving_a_host); hierarchical
// allreduce competes where some host has several ranks.
inline Algorithm choose_algorithm(const CostModel& model, Collective collective,
                                  const HostLayout& hosts, std::size_t n_bytes,
                                  bool native_available) {
  const int p = hosts.ranks();
  if (hosts.hosts() == 1) {
    CostModel local = model;
    local.point_to_point = model.same_host;
    return choose_algorithm(local, collective, p, n_bytes, native_available);
  }
  if (hosts.largest_host() == 1)
    return choose_algorithm(model, collective, p, n_bytes, native_available);
  CostModel flat_model = model;
  flat_model.point_to_point.beta_us_per_byte *= hosts.ring_links_leaving_a_host();
  CostModel halving_doubling_model = model;
  halving_doubling_model.point_to_point.beta_us_per_byte *=
      hosts.halving_doubling_load_leaving_a_host();
  const auto flat_us = [&](Algorithm algorithm) {
    return predict_us(
        algorithm == Algorithm::kHalvingDoubling ? halving_doubling_model : flat_model, collective,
        algorithm, p, n_bytes);
  };
  const Algorithm flat =
      cheapest_of(automatic_candidates(collective, n_bytes, native_available).list(), flat_us);
  if (collective != Collective::kAllreduce) return flat;
  return predict_hierarchical_us(model, hosts, n_bytes) < flat_us(flat) ? Algorithm::kHierarchical
                                                                        : flat;
}

// The algorithms of `collective` on NCCL device buffers: NCCL's own, and for allreduce coltrain's
// ring and tree over ncclSend/ncclRecv where their reduction kernel is available.
inline std::span<const Algorithm> nccl_algorithms_for(Collective collective,
                                                      bool device_reduction) {
  static constexpr Algorithm kAll[] = {Algorithm::kNative, Algorithm::kRing, Algorithm::kTree};
  return collective == Collective::kAllreduce && device_reduction ? std::span<const Algorithm>(kAll)
                                                                  : std::span(kAll, 1);
}

// What kAutomatic runs on NCCL device buffers.
inline Algorithm choose_nccl_algorithm(const CostModel& model, Collective collective, int p,
                                       std::size_t n_bytes, bool device_reduction) {
  return choose_among(model, collective, p, n_bytes,
                      nccl_algorithms_for(collective, device_reduction));
}

}  // namespace coltrain::comm
