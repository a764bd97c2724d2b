#pragma once
// coltrain's collectives on host buffers: allreduce, broadcast, allgather, reduce_scatter, reduce
// and barrier over MPI or our TCP transport, with the algorithm chosen per call.
//
//   auto comm = coltrain::comm::Communicator::from_env();        // mpiexec, srun, torchrun...
//   comm.allreduce(std::span(gradients), ReduceOp::kAvg);        // in place, automatic algorithm
//   comm.allreduce(std::span(in), std::span(out), ReduceOp::kMax, Algorithm::kRing);
//
// Every call is collective: all ranks call it in the same order with the same count, dtype, op,
// root and algorithm; coltrain's own algorithms check this in every message and throw MismatchError
// naming both ranks otherwise. f16 and bf16 are reduced in f32 and rounded once, at the end. A
// communicator is not thread-safe: one thread calls it at a time. After a communication error it is
// unusable.

#include <coltrain/comm/algorithms/barrier.hpp>
#include <coltrain/comm/algorithms/halving_doubling.hpp>
#include <coltrain/comm/algorithms/ring.hpp>
#include <coltrain/comm/algorithms/tree.hpp>
#include <coltrain/comm/cost_model.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/tcp_transport.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>

#if COLTRAIN_WITH_MPI
#include <mpi.h>

#include <coltrain/comm/mpi_native.hpp>
#include <coltrain/comm/mpi_transport.hpp>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::comm {
namespace detail {

#if COLTRAIN_WITH_MPI
// Initialises MPI when nobody has, and then finalises it when the last communicator using it goes.
// SERIALIZED: train::DataParallel calls MPI from its communication thread while a step is in flight
// and from the caller's thread otherwise, never from both at once.
class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    COLTRAIN_CHECK_MPI(MPI_Initialized(&initialized));
    if (!initialized) {
      int provided = 0;
      COLTRAIN_CHECK_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
      owns_mpi_ = true;
    }
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && !finalized) MPI_Finalize();
  }

 private:
  bool owns_mpi_ = false;
};
#endif

template <class T>
inline constexpr bool kNarrowFloat = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

// The element types the collectives take: those of DataType except u8.
template <class T>
concept CollectiveElement = ReducibleElement<T> || kNarrowFloat<T>;

}  // namespace detail

class Communicator {
  // Calls f with the transport of this communicator's backend. Defined first: the members below use
  // its deduced return type.
  template <class F>
  decltype(auto) with_transport(F&& f) {
#if COLTRAIN_WITH_MPI
    if (mpi_) return f(*mpi_);
#endif
    return f(*tcp_);
  }
  template <class F>
  decltype(auto) with_transport(F&& f) const {
#if COLTRAIN_WITH_MPI
    if (mpi_) return f(std::as_const(*mpi_));
#endif
    return f(std::as_const(*tcp_));
  }

 public:
  // From the launcher's environment. The backend is `backend`, else COLTRAIN_BACKEND (mpi or tcp),
  // else MPI when this build has it and an MPI launcher started the process, else TCP.
  static Communicator from_env(std::optional<Backend> backend = std::nullopt,
                               CommOptions options = comm_options_from_env()) {
    const LaunchEnv env = detect_launch_env();
    if (!backend) {
      if (const char* name = std::getenv("COLTRAIN_BACKEND"); name != nullptr && *name != '\0') {
        try {
          backend = parse_backend(name);
        } catch (const InvalidArgument& e) {
          throw ConfigError("COLTRAIN_BACKEND=" + std::string(name) + ": " + e.message());
        }
      } else {
        const bool mpi_launch =
            env.launcher == Launcher::kMpich || env.launcher == Launcher::kOpenMpi;
        backend = BuildConfig::kWithMpi && mpi_launch ? Backend::kMpi : Backend::kTcp;
      }
    }
    if (*backend == Backend::kTcp) return tcp(env, std::move(options));
#if COLTRAIN_WITH_MPI
    auto session = std::make_shared<detail::MpiSession>();
    Communicator communicator = mpi(MPI_COMM_WORLD, std::move(options));
    communicator.mpi_session_ = std::move(session);
    return communicator;
#else
    throw ConfigError(
        "the MPI backend was requested, but this program was built without MPI "
        "(compile with mpicxx, or set COLTRAIN_BACKEND=tcp)");
#endif
  }

  // Our TCP transport: rank 0 hosts the rendezvous on env.master_addr:env.master_port.
  static Communicator tcp(const LaunchEnv& env, CommOptions options = comm_options_from_env()) {
    Communicator communicator(Backend::kTcp);
    communicator.tcp_ = std::make_unique<TcpTransport>(env, options);
    return communicator;
  }

#if COLTRAIN_WITH_MPI
  // An MPI code hands over its own communicator (MPI must be initialised); coltrain works on a
  // duplicate of it, so its messages never meet the application's.
  static Communicator mpi(MPI_Comm comm, CommOptions options = comm_options_from_env()) {
    Communicator communicator(Backend::kMpi);
    communicator.mpi_ = std::make_unique<MpiTransport>(comm, std::move(options));
    return communicator;
  }
#endif

  Communicator(Communicator&&) noexcept = default;
  Communicator& operator=(Communicator&&) noexcept = default;

  int rank() const {
    return with_transport([](const auto& t) { return t.rank(); });
  }
  int size() const {
    return with_transport([](const auto& t) { return t.size(); });
  }
  Backend backend() const { return backend_; }

  const CostModel& cost_model() const { return cost_model_; }
  void set_cost_model(const CostModel& model) { cost_model_ = model; }
  const AlgorithmTuning& tuning() const { return tuning_; }
  void set_tuning(const AlgorithmTuning& tuning) { tuning_ = tuning; }

  // What kAutomatic runs for `collective` over an array of `bytes` bytes on this communicator.
  Algorithm choose(Collective collective, std::size_t bytes) const {
    return choose_algorithm(cost_model_, collective, size(), bytes, backend_ == Backend::kMpi);
  }

  // ---- allreduce: every rank ends with the reduction of all ranks' input ----
  template <detail::CollectiveElement T>
  void allreduce(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum,
                 Algorithm algorithm = Algorithm::kAutomatic) {
    require_size(Collective::kAllreduce, "output", output.size(), input.size());
    reduce_collective(Collective::kAllreduce, input, output, op, 0, algorithm);
  }
  template <detail::CollectiveElement T>
  void allreduce(std::span<T> data, ReduceOp op = ReduceOp::kSum,
                 Algorithm algorithm = Algorithm::kAutomatic) {
    allreduce(std::span<const T>(data), data, op, algorithm);
  }

  // ---- broadcast: root's data to every rank ----
  template <detail::CollectiveElement T>
  void broadcast(std::span<T> data, int root = 0, Algorithm algorithm = Algorithm::kAutomatic) {
    require_root(Collective::kBroadcast, root);
    const MessageHeader call = start(Collective::kBroadcast, data_type_v<T>, data.size(),
                                     ReduceOp::kSum, root, algorithm, data.size_bytes());
    with_transport([&](auto& t) {
      switch (call.algorithm) {
        case Algorithm::kRing:
          return ring_broadcast(t, data.data(), data.size(), root, call, tuning_);
        case Algorithm::kTree:
          return tree_broadcast(t, data.data(), data.size(), root, call, tuning_);
        default:
          return run_native(
              t, [&](auto& mpi) { native_broadcast(mpi, data.data(), data.size(), root); });
      }
    });
  }

  // ---- allgather: output[i * count, (i + 1) * count) = rank i's input; output has size() * count
  template <detail::CollectiveElement T>
  void allgather(std::span<const T> input, std::span<T> output,
                 Algorithm algorithm = Algorithm::kAutomatic) {
    require_size(Collective::kAllgather, "output", output.size(), input.size() * group_size());
    const MessageHeader call = start(Collective::kAllgather, data_type_v<T>, input.size(),
                                     ReduceOp::kSum, 0, algorithm, output.size_bytes());
    with_transport([&](auto& t) {
      if (call.algorithm == Algorithm::kRing) {
        return ring_allgather(t, input.data(), output.data(), input.size(), call, tuning_);
      }
      run_native(
          t, [&](auto& mpi) { native_allgather(mpi, input.data(), output.data(), input.size()); });
    });
  }
  // In place: data holds size() blocks; this rank's block is its input.
  template <detail::CollectiveElement T>
  void allgather(std::span<T> data, Algorithm algorithm = Algorithm::kAutomatic) {
    const std::size_t count = data.size() / group_size();
    require_size(Collective::kAllgather, "data", data.size(), count * group_size());
    allgather(std::span<const T>(data.subspan(count * static_cast<std::size_t>(rank()), count)),
              data, algorithm);
  }

  // ---- reduce_scatter: rank i gets block i of the reduction; input has size() * output.size()
  // ----
  template <detail::CollectiveElement T>
  void reduce_scatter(std::span<const T> input, std::span<T> output, ReduceOp op = ReduceOp::kSum,
                      Algorithm algorithm = Algorithm::kAutomatic) {
    require_size(Collective::kReduceScatter, "input", input.size(), output.size() * group_size());
    reduce_collective(Collective::kReduceScatter, input, output, op, 0, algorithm);
  }
  // In place: data holds size() blocks; the result lands in this rank's block.
  template <detail::CollectiveElement T>
  void reduce_scatter(std::span<T> data, ReduceOp op = ReduceOp::kSum,
                      Algorithm algorithm = Algorithm::kAutomatic) {
    const std::size_t count = data.size() / group_size();
    require_size(Collective::kReduceScatter, "data", data.size(), count * group_size());
    reduce_scatter(std::span<const T>(data),
                   data.subspan(count * static_cast<std::size_t>(rank()), count), op, algorithm);
  }

  // ---- reduce: the root gets the reduction; output is written (and checked) on the root only ----
  template <detail::CollectiveElement T>
  void reduce(std::span<const T> input, std::span<T> output, int root = 0,
              ReduceOp op = ReduceOp::kSum, Algorithm algorithm = Algorithm::kAutomatic) {
    require_root(Collective::kReduce, root);
    if (rank() == root) require_size(Collective::kReduce, "output", output.size(), input.size());
    reduce_collective(Collective::kReduce, input, output, op, root, algorithm);
  }
  template <detail::CollectiveElement T>
  void reduce(std::span<T> data, int root = 0, ReduceOp op = ReduceOp::kSum,
              Algorithm algorithm = Algorithm::kAutomatic) {
    reduce(std::span<const T>(data), data, root, op, algorithm);
  }

  // ---- barrier: returns on every rank once all ranks have entered it ----
  void barrier(Algorithm algorithm = Algorithm::kAutomatic) {
    const MessageHeader call =
        start(Collective::kBarrier, DataType::kUInt8, 0, ReduceOp::kSum, 0, algorithm, 0);
    with_transport([&](auto& t) {
      if (call.algorithm == Algorithm::kHalvingDoubling) return dissemination_barrier(t, call);
      run_native(t, [](auto& mpi) { native_barrier(mpi); });
    });
  }

 private:
  explicit Communicator(Backend backend)
      : backend_(backend), cost_model_(default_cost_model(backend)) {}

  std::size_t group_size() const { return static_cast<std::size_t>(size()); }

  // Runs `f` with the MPI transport; only reachable when the algorithm resolved to kNative, which
  // start() allows on the MPI backend only.
  template <class Tr, class F>
  static void run_native([[maybe_unused]] Tr& transport, [[maybe_unused]] F&& f) {
#if COLTRAIN_WITH_MPI
    if constexpr (std::is_same_v<Tr, MpiTransport>) f(transport);
#endif
  }

  // Validates the algorithm, resolves kAutomatic, and numbers the call.
  MessageHeader start(Collective collective, DataType dtype, std::size_t count, ReduceOp op,
                      int root, Algorithm algorithm, std::size_t bytes) {
    if (algorithm == Algorithm::kAutomatic) algorithm = choose(collective, bytes);
    const auto supported = algorithms_for(collective);
    if (std::find(supported.begin(), supported.end(), algorithm) == supported.end()) {
      std::string names;
      for (Algorithm a : supported)
        names += std::string(names.empty() ? "" : ", ") + std::string(name_of(a));
      throw InvalidArgument(std::string(name_of(collective)) + " has no algorithm '" +
                            std::string(name_of(algorithm)) + "' (it has: " + names +
                            ", automatic)");
    }
    if (algorithm == Algorithm::kNative && backend_ != Backend::kMpi) {
      throw InvalidArgument("algorithm 'native' needs the MPI backend; the " +
                            std::string(name_of(backend_)) +
                            " backend has ring, tree and "
                            "halving_doubling");
    }
    MessageHeader call;
    call.collective = collective;
    call.algorithm = algorithm;
    call.dtype = dtype;
    call.op = op;
    call.root = root;
    call.sequence = sequence_++;
    call.count = count;
    return call;
  }

  void require_size(Collective collective, const char* what, std::size_t actual,
                    std::size_t expected) const {
    if (actual != expected) {
      ErrorContext context;
      context.rank = rank();
      context.operation = std::string(name_of(collective));
      throw InvalidArgument(std::string(what) + " has " + std::to_string(actual) +
                                " elements, expected " + std::to_string(expected),
                            context);
    }
  }

  void require_root(Collective collective, int root) const {
    if (root < 0 || root >= size()) {
      ErrorContext context;
      context.rank = rank();
      context.operation = std::string(name_of(collective));
      throw InvalidArgument("root " + std::to_string(root) + " is not a rank of this " +
                                std::to_string(size()) + "-rank communicator",
                            context);
    }
  }

  template <ReducibleElement E>
  std::vector<E>& scratch() {
    return std::get<std::vector<E>>(scratch_);
  }

  // allreduce, reduce_scatter and reduce. f16/bf16 are widened to f32 around the reduction.
  template <detail::CollectiveElement T>
  void reduce_collective(Collective collective, std::span<const T> input, std::span<T> output,
                         ReduceOp op, int root, Algorithm algorithm) {
    const std::size_t count =
        collective == Collective::kReduceScatter ? output.size() : input.size();
    if constexpr (detail::kNarrowFloat<T>) {
      std::vector<float>& wide_input = widened_input_;
      std::vector<float>& wide_output = widened_output_;
      wide_input.resize(input.size());
      wide_output.resize(output.size());
      for (std::size_t i = 0; i < input.size(); ++i) wide_input[i] = static_cast<float>(input[i]);
      const MessageHeader call = start(collective, data_type_v<T>, count, op, root, algorithm,
                                       input.size() * sizeof(float));
      run_reduction(call, std::span<const float>(wide_input), std::span<float>(wide_output));
      if (collective != Collective::kReduce || rank() == root) {
        for (std::size_t i = 0; i < output.size(); ++i) output[i] = T(wide_output[i]);
      }
    } else {
      const MessageHeader call =
          start(collective, data_type_v<T>, count, op, root, algorithm, input.size_bytes());
      run_reduction(call, input, output);
    }
  }

  template <ReducibleElement E>
  void run_reduction(const MessageHeader& call, std::span<const E> input, std::span<E> output) {
    const ReduceOp op = call.op;
    const int root = call.root;
    with_transport([&](auto& t) {
      switch (call.collective) {
        case Collective::kAllreduce:
          switch (call.algorithm) {
            case Algorithm::kRing:
              return ring_allreduce(t, input.data(), output.data(), input.size(), op, call,
                                    tuning_);
            case Algorithm::kTree:
              return tree_allreduce(t, input.data(), output.data(), input.size(), op, call,
                                    tuning_);
            case Algorithm::kHalvingDoubling:
              return halving_doubling_allreduce(t, input.data(), output.data(), input.size(), op,
                                                call, scratch<E>());
            default:
              return run_native(t, [&](auto& mpi) {
                native_allreduce(mpi, input.data(), output.data(), input.size(), op);
              });
          }
        case Collective::kReduceScatter:
          if (call.algorithm == Algorithm::kRing) {
            return ring_reduce_scatter(t, input.data(), output.data(), output.size(), op, call,
                                       tuning_, scratch<E>());
          }
          return run_native(t, [&](auto& mpi) {
            native_reduce_scatter(mpi, input.data(), output.data(), output.size(), op);
          });
        case Collective::kReduce:
          switch (call.algorithm) {
            case Algorithm::kRing:
              return ring_reduce(t, input.data(), output.data(), input.size(), root, op, call,
                                 tuning_, scratch<E>());
            case Algorithm::kTree:
              return tree_reduce(t, input.data(), output.data(), input.size(), root, op, call,
                                 tuning_, scratch<E>());
            default:
              return run_native(t, [&](auto& mpi) {
                native_reduce(mpi, input.data(), output.data(), input.size(), root, op);
              });
          }
        default:
          throw InvalidArgument(std::string(name_of(call.collective)) + " does not reduce");
      }
    });
  }

  Backend backend_;
  CostModel cost_model_;
  AlgorithmTuning tuning_;
  std::uint64_t sequence_ = 0;
#if COLTRAIN_WITH_MPI
  std::shared_ptr<detail::MpiSession> mpi_session_;  // declared first: outlives mpi_
  std::unique_ptr<MpiTransport> mpi_;
#endif
  std::unique_ptr<TcpTransport> tcp_;
  std::tuple<std::vector<float>, std::vector<double>, std::vector<std::int32_t>,
             std::vector<std::int64_t>>
      scratch_;
  std::vector<float> widened_input_;
  std::vector<float> widened_output_;
};

}  // namespace coltrain::comm
