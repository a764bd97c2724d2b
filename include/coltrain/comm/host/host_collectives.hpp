#pragma once
// HostCollectives: the host path of a Communicator. It owns the MPI or TCP transport and runs
// coltrain's algorithms (or MPI's own) over it on host buffers: it checks and numbers each call,
// resolves Algorithm::kAutomatic from the cost model, runs the algorithm from the tables below,
// and records the call in the flight recorder (and on the timeline). Send/recv messages are
// numbered per peer and tag here and driven by the message book.
//
// Buffers arrive as bytes with their DataType, and the algorithms run over AnyTransport: each is
// compiled once, not once per transport and element type, and this class is not a template, so a
// program built with COLTRAIN_SEPARATE_COMPILATION compiles it once (<coltrain/src.hpp>).
//
// Communicator (comm/communicator.hpp) is the facade: typed spans, device buffers, non-blocking
// calls. It waits for its queued calls before it calls in here; nothing here waits for them.

#include <coltrain/comm/algorithms/alltoall.hpp>
#include <coltrain/comm/algorithms/barrier.hpp>
#include <coltrain/comm/algorithms/compressed_allreduce.hpp>
#include <coltrain/comm/algorithms/gather_scatter.hpp>
#include <coltrain/comm/algorithms/halving_doubling.hpp>
#include <coltrain/comm/algorithms/hierarchical.hpp>
#include <coltrain/comm/algorithms/rank_order.hpp>
#include <coltrain/comm/algorithms/ring.hpp>
#include <coltrain/comm/algorithms/tree.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/protocol/flight_recorder.hpp>
#include <coltrain/comm/protocol/message_book.hpp>
#include <coltrain/comm/rendezvous/split.hpp>
#include <coltrain/comm/request.hpp>
#include <coltrain/comm/transport/any_transport.hpp>
#include <coltrain/comm/transport/tcp/tcp_transport.hpp>
#include <coltrain/comm/tuning/cost_model.hpp>
#include <coltrain/comm/tuning/tuning_file.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timeline.hpp>
#include <coltrain/core/timer.hpp>

#if COLTRAIN_WITH_MPI
#include <mpi.h>

#include <coltrain/comm/transport/mpi/mpi_native.hpp>
#include <coltrain/comm/transport/mpi/mpi_session.hpp>
#include <coltrain/comm/transport/mpi/mpi_transport.hpp>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::comm {

class HostCollectives {
  // Calls f with the transport. Defined first: the members below use its deduced return type.
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
  // Our TCP transport: rank 0 hosts the rendezvous on env.master_addr:env.master_port.
  static std::unique_ptr<HostCollectives> tcp(const LaunchEnv& env, const CommOptions& options) {
    auto host = std::unique_ptr<HostCollectives>(new HostCollectives(Backend::kTcp, options));
    host->tcp_ = std::make_unique<TcpTransport>(env, host->options_);
    return host;
  }
  // Over an established TCP mesh, one connected socket per other rank.
  static std::unique_ptr<HostCollectives> tcp(int rank, std::vector<detail::FileDescriptor> sockets,
                                              const LaunchEnv& env, const CommOptions& options) {
    auto host = std::unique_ptr<HostCollectives>(new HostCollectives(Backend::kTcp, options));
    host->tcp_ = std::make_unique<TcpTransport>(rank, std::move(sockets), env, host->options_);
    return host;
  }
#if COLTRAIN_WITH_MPI
  // A duplicate of `comm`; `session`, when given, finalises MPI once every communicator that
  // shares it is gone.
  static std::unique_ptr<HostCollectives> mpi(MPI_Comm comm, const CommOptions& options,
                                              std::shared_ptr<detail::MpiSession> session = {}) {
    auto host = std::unique_ptr<HostCollectives>(new HostCollectives(Backend::kMpi, options));
    host->mpi_session_ = std::move(session);
    host->mpi_ = std::make_unique<MpiTransport>(comm, host->options_);
    return host;
  }
#endif

  HostCollectives(const HostCollectives&) = delete;
  HostCollectives& operator=(const HostCollectives&) = delete;

  int rank() const {
    return with_transport([](const auto& t) { return t.rank(); });
  }
  int size() const {
    return with_transport([](const auto& t) { return t.size(); });
  }
  const HostLayout& host_layout() const {
    return with_transport([](const auto& t) -> const HostLayout& { return t.host_layout(); });
  }
  Backend backend() const { return backend_; }
  const CommOptions& options() const { return options_; }
  // Whether large payloads to `peer` can go by single copy (TCP only: a rank on this host whose
  // memory this rank may read).
  bool single_copy_with(int peer) const { return tcp_ && tcp_->single_copy_with(peer); }
  FlightRecorder& recorder() { return recorder_; }
  const FlightRecorder& recorder() const { return recorder_; }
  CostModel& cost_model() { return cost_model_; }
  const CostModel& cost_model() const { return cost_model_; }
  AlgorithmTuning& tuning() { return tuning_; }
  const AlgorithmTuning& tuning() const { return tuning_; }

  // Measurements to choose from (comm/tuning/tuning_file.hpp): the file's constants for this
  // backend replace the cost model's, its rules come first, and its single-copy ranges replace
  // the options' (the transport's too, once it exists). No call may be in flight.
  void use_tuning(std::shared_ptr<const TuningFile> tuning) {
    if (tuning) {
      if (const CostModel* model = tuning->cost_model_for(backend_)) cost_model_ = *model;
      if (const auto& range = tuning->single_copy_exchanges)
        options_.single_copy_exchanges = *range;
      if (const auto& range = tuning->single_copy_exchanges_on_small_pages)
        options_.single_copy_exchanges_on_small_pages = *range;
      if (tcp_)
        tcp_->set_single_copy_exchanges(options_.single_copy_exchanges,
                                        options_.single_copy_exchanges_on_small_pages);
    }
    tuning_file_ = std::move(tuning);
  }
  const std::shared_ptr<const TuningFile>& tuning_file() const { return tuning_file_; }

  // What kAutomatic runs for `collective` over `bytes` bytes: the tuning file's rule for this
  // job's shape where it has one, else the cheapest by the cost model.
  Algorithm choose(Collective collective, std::size_t bytes) const {
    if (tuning_file_) {
      const std::optional<Algorithm> measured =
          tuning_file_->rule_for(backend_, collective, size(), host_layout().hosts(), bytes);
      if (measured && (*measured != Algorithm::kNative || native_is_candidate())) return *measured;
    }
    // Without shared memory the ranks of a host reach each other like ranks of other hosts
    // (loopback TCP under COLTRAIN_SHM=0).
    CostModel model = cost_model_;
    if (!with_transport([](const auto& t) { return t.hosts_share_memory(); }))
      model.same_host = model.point_to_point;
    return choose_algorithm(model, collective, host_layout(), bytes, native_is_candidate());
  }
  // Whether kAutomatic may pick MPI's own collectives. Not where a node's ranks outnumber its
  // cores: MPICH 4.0.2 (ch4:ucx) spins inside them without giving the core away, so each waiting
  // rank burns its time slice (5 ranks on 2 cores, 64-byte allreduce: 24.3 ms against 0.40 ms for
  // coltrain's ring over MPI point-to-point, whose waits yield; docs/collectives.md).
  bool native_is_candidate() const {
#if COLTRAIN_WITH_MPI
    if (mpi_) return !mpi_->shares_cores();
#endif
    return false;
  }

  // allreduce, reduce_scatter and reduce of `dtype` elements; f16 and bf16 are widened to f32
  // around the reduction and rounded once, at the end. `compression` (f32 allreduce only) sends
  // the data in 16 bits over the pairwise schedule.
  void reduce(Collective collective, std::span<const std::byte> input, std::span<std::byte> output,
              DataType dtype, ReduceOp op, int root, Algorithm algorithm,
              WireCompression compression) {
    const std::size_t element_bytes = size_of(dtype);
    const std::size_t count =
        (collective == Collective::kReduceScatter ? output.size() : input.size()) / element_bytes;
    if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) {
      const std::size_t input_count = input.size() / element_bytes;
      widened_input_.resize(input_count);
      widened_output_.resize(output.size() / element_bytes);
      convert_elements(dtype, input.data(), widened_input_.data(), input_count);
      const MessageHeader call =
          start(collective, dtype, count, op, root, algorithm, input_count * sizeof(float));
      run_reduction(call, element_reduction<float>(op), std::as_bytes(std::span(widened_input_)),
                    std::as_writable_bytes(std::span(widened_output_)));
      if (collective != Collective::kReduce || rank() == root)
        convert_elements(dtype, widened_output_.data(), output.data(), widened_output_.size());
      return;
    }
    MessageHeader call = start(collective, dtype, count, op, root, algorithm, input.size());
    if (compression != WireCompression::kNone) {
      call.algorithm = Algorithm::kPairwise;  // the schedule compressed_allreduce runs
      call.compression = compression;
    }
    run_reduction(call, reduction_of(dtype, op), input, output);
  }

  // Broadcast and allgather move bytes of any element type.
  void broadcast(std::span<std::byte> data, DataType dtype, int root, Algorithm algorithm) {
    const std::size_t element_bytes = size_of(dtype);
    const std::size_t count = data.size() / element_bytes;
    const MessageHeader call =
        start(Collective::kBroadcast, dtype, count, ReduceOp::kSum, root, algorithm, data.size());
    recorded(call, [&] {
      AnyTransport t = algorithm_transport();
      switch (call.algorithm) {
        case Algorithm::kRing:
          return ring_broadcast(t, data.data(), count, element_bytes, root, call, tuning_);
        case Algorithm::kTree:
          return tree_broadcast(t, data.data(), count, element_bytes, root, call, tuning_);
        default:
          return run_native(
              [&](auto& mpi) { native_broadcast(mpi, data.data(), data.size(), root); });
      }
    });
  }

  void allgather(std::span<const std::byte> input, std::span<std::byte> output, DataType dtype,
                 Algorithm algorithm) {
    const std::size_t element_bytes = size_of(dtype);
    const std::size_t count = input.size() / element_bytes;
    const MessageHeader call =
        start(Collective::kAllgather, dtype, count, ReduceOp::kSum, 0, algorithm, output.size());
    recorded(call, [&] {
      AnyTransport t = algorithm_transport();
      if (call.algorithm == Algorithm::kRing) {
        return ring_allgather(t, input.data(), output.data(), count, element_bytes, call, tuning_);
      }
      run_native(
          [&](auto& mpi) { native_allgather(mpi, input.data(), output.data(), input.size()); });
    });
  }

  // Rank i's block of bytes[i] bytes lands at offsets[i] of every rank's output.
  void allgatherv(std::span<const std::byte> input, std::span<std::byte> output,
                  std::span<const std::size_t> bytes, std::span<const std::size_t> offsets,
                  DataType dtype, Algorithm algorithm) {
    const std::size_t element_bytes = size_of(dtype);
    const MessageHeader call = start(Collective::kAllgatherv, dtype, output.size() / element_bytes,
                                     ReduceOp::kSum, 0, algorithm, output.size());
    recorded(call, [&] {
      AnyTransport t = algorithm_transport();
      if (call.algorithm == Algorithm::kRing) {
        return ring_allgatherv(t, input.data(), output.data(), bytes, offsets, element_bytes, call);
      }
      run_native(
          [&](auto& mpi) { native_allgatherv(mpi, input.data(), output.data(), bytes, offsets); });
    });
  }

  void alltoall(std::span<const std::byte> input, std::span<std::byte> output, DataType dtype,
                Algorithm algorithm) {
    const std::size_t block_bytes = input.size() / group_size();
    const MessageHeader call = start(Collective::kAlltoall, dtype, block_bytes / size_of(dtype),
                                     ReduceOp::kSum, 0, algorithm, input.size());
    recorded(call, [&] {
      AnyTransport t = algorithm_transport();
      switch (call.algorithm) {
        case Algorithm::kPairwise:
          return pairwise_alltoall(t, input.data(), output.data(), block_bytes, call);
        case Algorithm::kBruck:
          return bruck_alltoall(t, input.data(), output.data(), block_bytes, call,
                                scratch_.partial);
        default:
          return run_native(
              [&](auto& mpi) { native_alltoall(mpi, input.data(), output.data(), block_bytes); });
      }
    });
  }

  // Block j of the input (sent_bytes[j] bytes at sent_offsets[j]) goes to rank j; rank i's block
  // lands at received_offsets[i].
  void alltoallv(std::span<const std::byte> input, std::span<const std::size_t> sent_bytes,
                 std::span<const std::size_t> sent_offsets, std::span<std::byte> output,
                 std::span<const std::size_t> received_bytes,
                 std::span<const std::size_t> received_offsets, DataType dtype,
                 Algorithm algorithm) {
    const std::size_t element_bytes = size_of(dtype);
    const MessageHeader call = start(Collective::kAlltoallv, dtype, input.size() / element_bytes,
                                     ReduceOp::kSum, 0, algorithm, input.size());
    recorded(call, [&] {
      AnyTransport t = algorithm_transport();
      if (call.algorithm == Algorithm::kPairwise) {
        return pairwise_alltoallv(t, input.data(), sent_bytes, sent_offsets, output.data(),
                                  received_bytes, received_offsets, element_bytes, call);
      }
      run_native([&](auto& mpi) {
        native_alltoallv(mpi, input.data(), sent_bytes, sent_offsets, output.data(), received_bytes,
                         received_offsets);
      });
    });
  }

  // Gather and scatter: `block_bytes` per rank; the root's side holds size() blocks.
  void rooted_blocks(Collective collective, std::span<const std::byte> input,
                     std::span<std::byte> output, std::size_t block_bytes, DataType dtype, int root,
                     Algorithm algorithm) {
    const MessageHeader call = start(collective, dtype, block_bytes / size_of(dtype),
                                     ReduceOp::kSum, root, algorithm, block_bytes * group_size());
    recorded(call, [&] {
      AnyTransport t = algorithm_transport();
      const bool gather = collective == Collective::kGather;
      if (call.algorithm == Algorithm::kTree) {
        return gather ? binomial_gather(t, input.data(), output.data(), block_bytes, root, call)
                      : binomial_scatter(t, input.data(), output.data(), block_bytes, root, call);
      }
      run_native([&](auto& mpi) {
        if (gather)
          native_gather(mpi, input.data(), output.data(), block_bytes, root);
        else
          native_scatter(mpi, input.data(), output.data(), block_bytes, root);
      });
    });
  }

  void barrier(Algorithm algorithm) {
    const MessageHeader call =
        start(Collective::kBarrier, DataType::kUInt8, 0, ReduceOp::kSum, 0, algorithm, 0);
    recorded(call, [&] {
      AnyTransport t = algorithm_transport();
      if (call.algorithm == Algorithm::kHalvingDoubling) return dissemination_barrier(t, call);
      run_native([](auto& mpi) { native_barrier(mpi); });
    });
  }

  // Posts a send (outgoing) or receive (incoming) of `count` elements to or from `peer`, numbered
  // within the rank pair and tag; the request drives the transport until it completes, after
  // `drain` (the caller's queued calls). `on_arrival` runs once a receive is in. The arguments
  // are checked by the caller.
  Request post_message(bool sending, int peer, int tag, DataType dtype, std::size_t count,
                       std::span<const std::byte> outgoing, std::span<std::byte> incoming,
                       std::function<void()> on_arrival,
                       const detail::ProgressThread::Drainer& drain) {
    MessageHeader header;
    header.collective = Collective::kSendRecv;
    header.algorithm = Algorithm::kNative;
    header.dtype = dtype;
    header.root = tag;
    header.count = count;
    header.bytes = sending ? outgoing.size() : incoming.size();
    header.sequence = (sending ? sent_ : received_)[{peer, tag}]++;
    return with_transport([&](auto& t) {
      const auto request =
          sending ? t.isend(peer, header, outgoing) : t.irecv(peer, header, incoming);
      return book_message(
          [transport = &t, request, on_arrival = std::move(on_arrival)](bool block) {
            if (!block && !transport->test(request)) return false;
            if (block) transport->wait(request);
            if (on_arrival) on_arrival();
            return true;
          },
          drain);
    });
  }

  // A request in the message book, which `advance` completes (comm/protocol/message_book.hpp);
  // the book drains the caller's queued calls with `drain` before it drives the transport.
  Request book_message(std::function<bool(bool block)> advance,
                       const detail::ProgressThread::Drainer& drain) {
    if (!messages_.book) messages_.book = std::make_shared<detail::MessageBook>(drain);
    return messages_.book->add(std::move(advance));
  }

  // The group of the ranks that pass the same color, ordered by key, then rank; nullptr for a
  // negative color. MPI_Comm_split on MPI; on TCP a mesh of connections of its own
  // (comm/rendezvous/split.hpp). The new group has this one's options, cost model and tuning.
  std::unique_ptr<HostCollectives> split(int color, int key) {
    std::unique_ptr<HostCollectives> child = split_transport(color, key);
    if (child) {
      child->cost_model_ = cost_model_;
      child->tuning_ = tuning_;
      child->tuning_file_ = tuning_file_;
    }
    return child;
  }

 private:
  HostCollectives(Backend backend, const CommOptions& options)
      : backend_(backend), options_(options), cost_model_(default_cost_model(backend)) {
    if (!options.tuning_file.empty())
      use_tuning(std::make_shared<const TuningFile>(load_tuning_file(options.tuning_file)));
  }

  std::size_t group_size() const { return static_cast<std::size_t>(size()); }

  // What coltrain's algorithms run over: one type for every transport, so that each algorithm is
  // compiled once (comm/transport/any_transport.hpp).
  AnyTransport algorithm_transport() {
    return with_transport([](auto& t) { return AnyTransport(t); });
  }

  // Runs `f` with the MPI transport; only reachable when the algorithm resolved to kNative, which
  // start() allows on the MPI backend only.
  template <class F>
  void run_native([[maybe_unused]] F&& f) {
#if COLTRAIN_WITH_MPI
    f(*mpi_);
#endif
  }

  std::unique_ptr<HostCollectives> split_transport(int color, int key) {
    ErrorContext context;
    context.rank = rank();
    context.operation = "split";
#if COLTRAIN_WITH_MPI
    if (mpi_) {
      MPI_Comm raw = MPI_COMM_NULL;
      COLTRAIN_CHECK_MPI(
          MPI_Comm_split(mpi_->comm(), color < 0 ? MPI_UNDEFINED : color, key, &raw));
      if (raw == MPI_COMM_NULL) return nullptr;
      auto child =
          std::unique_ptr<HostCollectives>(new HostCollectives(Backend::kMpi, options_for_split()));
      child->mpi_session_ = mpi_session_;
      try {
        child->mpi_ = std::make_unique<MpiTransport>(raw, options_);  // a duplicate of raw
      } catch (...) {
        MPI_Comm_free(&raw);
        throw;
      }
      MPI_Comm_free(&raw);
      return child;
    }
#endif
    detail::SplitEntry mine;
    mine.color = color < 0 ? -1 : color;
    mine.key = key;
    mine.nonce = detail::make_nonce();
    detail::FileDescriptor listener;
    if (color >= 0) {
      listener = detail::listen_tcp({tcp_->local_address(), 0}, detail::kSocketBufferBytes,
                                    "connections of a split communicator", context);
      mine.address = detail::PeerAddress::of(detail::local_endpoint(listener.get()));
    }
    std::vector<detail::SplitEntry> entries(group_size());
    allgather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(entries)),
              DataType::kUInt8, Algorithm::kAutomatic);
    if (color < 0) return nullptr;
    const std::vector<int> members = detail::split_members(entries, mine.color);
    const auto position = std::find(members.begin(), members.end(), rank()) - members.begin();
    const int new_rank = static_cast<int>(position);
    std::vector<detail::FileDescriptor> sockets =
        detail::connect_split_mesh(entries, members, new_rank, listener, options_, context);
    return tcp(new_rank, std::move(sockets), tcp_->launch_env(), options_for_split());
  }

  // A split group's options: this group's, without the tuning file's path. split() hands the group
  // this group's tuning, already read, so the file is not read again (nor missed, if it has gone).
  CommOptions options_for_split() const {
    CommOptions options = options_;
    options.tuning_file.clear();
    return options;
  }

  // Validates the algorithm, resolves kAutomatic, and numbers the call.
  MessageHeader start(Collective collective, DataType dtype, std::size_t count, ReduceOp op,
                      int root, Algorithm algorithm, std::size_t bytes) {
    const bool reduces = collective == Collective::kAllreduce ||
                         collective == Collective::kReduce ||
                         collective == Collective::kReduceScatter;
    if (options_.deterministic && reduces) algorithm = Algorithm::kRankOrder;
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
      std::string others;
      for (Algorithm a : supported) {
        if (a != Algorithm::kNative)
          others += std::string(others.empty() ? "" : ", ") + std::string(name_of(a));
      }
      throw InvalidArgument("algorithm 'native' needs the MPI backend; on the " +
                            std::string(name_of(backend_)) + " backend " +
                            std::string(name_of(collective)) + " has " + others);
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

  // Runs a numbered call's communication, recorded in the flight recorder; a failure is recorded
  // with its message and the recorder written out before the error goes on to the caller.
  // With the timeline on (core/timeline.hpp), the call is also a span of it.
  template <class F>
  void recorded(const MessageHeader& call, F&& communicate) {
    Timeline& timeline = Timeline::instance();
    const bool timed = timeline.enabled();
    const Clock::time_point begin = timed ? Clock::now() : Clock::time_point{};
    const auto span = [&] {
      timeline.complete(name_of(call.collective), "collective", begin, Clock::now(),
                        "\"sequence\": " + std::to_string(call.sequence) + ", \"algorithm\": \"" +
                            std::string(name_of(call.algorithm)) + "\", \"dtype\": \"" +
                            std::string(name_of(call.dtype)) +
                            "\", \"count\": " + std::to_string(call.count),
                        rank());
    };
    recorder_.started(call);
    try {
      std::forward<F>(communicate)();
    } catch (const std::exception& error) {
      recorder_.failed(call.sequence, error.what());
      recorder_.dump("error in " + detail::describe_call(call));
      if (timed) span();
      throw;
    }
    recorder_.done(call.sequence);
    if (timed) span();
  }

  // The reduction of `dtype` elements, for the types the algorithms reduce.
  static ElementReduction reduction_of(DataType dtype, ReduceOp op) {
    switch (dtype) {
      case DataType::kFloat32:
        return element_reduction<float>(op);
      case DataType::kFloat64:
        return element_reduction<double>(op);
      case DataType::kInt32:
        return element_reduction<std::int32_t>(op);
      case DataType::kInt64:
        return element_reduction<std::int64_t>(op);
      default:
        throw InvalidArgument("no reduction of " + std::string(name_of(dtype)) + " elements");
    }
  }

  // f16 or bf16 elements to f32 and back (rounded to nearest even).
  static void convert_elements(DataType dtype, const std::byte* narrow, float* wide,
                               std::size_t count) {
    if (dtype == DataType::kFloat16)
      return widen(reinterpret_cast<const half*>(narrow), wide, count);
    widen(reinterpret_cast<const bfloat16*>(narrow), wide, count);
  }
  static void convert_elements(DataType dtype, const float* wide, std::byte* narrow,
                               std::size_t count) {
    if (dtype == DataType::kFloat16) return narrow_to(wide, reinterpret_cast<half*>(narrow), count);
    narrow_to(wide, reinterpret_cast<bfloat16*>(narrow), count);
  }
  template <class Narrow>
  static void widen(const Narrow* in, float* out, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<float>(in[i]);
  }
  template <class Narrow>
  static void narrow_to(const float* in, Narrow* out, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) out[i] = Narrow(in[i]);
  }

  // The element type travels in `reduction`, not in a template parameter: each algorithm is
  // compiled once, not once per element type.
  void run_reduction(const MessageHeader& call, const ElementReduction& reduction,
                     std::span<const std::byte> input_bytes, std::span<std::byte> output_bytes) {
    const int root = call.root;
    const std::byte* input = input_bytes.data();
    std::byte* output = output_bytes.data();
    const std::size_t input_count = input_bytes.size() / reduction.element_bytes();
    const std::size_t output_count = output_bytes.size() / reduction.element_bytes();
    recorded(call, [&] {
      AnyTransport t = algorithm_transport();
      switch (call.collective) {
        case Collective::kAllreduce:
          if (call.compression != WireCompression::kNone) {
            return compressed_allreduce(t, reinterpret_cast<const float*>(input),
                                        reinterpret_cast<float*>(output), input_count, call.op,
                                        call, tuning_, scratch_.partial);
          }
          switch (call.algorithm) {
            case Algorithm::kRing:
              return ring_allreduce(t, input, output, input_count, reduction, call, tuning_,
                                    scratch_);
            case Algorithm::kTree:
              return tree_allreduce(t, input, output, input_count, reduction, call, tuning_,
                                    scratch_);
            case Algorithm::kHalvingDoubling:
              return halving_doubling_allreduce(t, input, output, input_count, reduction, call,
                                                tuning_, scratch_);
            case Algorithm::kHierarchical:
              return hierarchical_allreduce(t, host_layout(), input, output, input_count, reduction,
                                            call, tuning_, scratch_);
            case Algorithm::kRankOrder:
              return rank_order_allreduce(t, input, output, input_count, reduction, call, tuning_,
                                          scratch_);
            default:
              return run_native(
                  [&](auto& mpi) { native_allreduce(mpi, input, output, input_count, reduction); });
          }
        case Collective::kReduceScatter:
          if (call.algorithm == Algorithm::kRing) {
            return ring_reduce_scatter(t, input, output, output_count, reduction, call, tuning_,
                                       scratch_);
          }
          if (call.algorithm == Algorithm::kRankOrder) {
            return rank_order_reduce_scatter(t, input, output, output_count, reduction, call,
                                             tuning_, scratch_);
          }
          return run_native([&](auto& mpi) {
            native_reduce_scatter(mpi, input, output, output_count, reduction);
          });
        case Collective::kReduce:
          switch (call.algorithm) {
            case Algorithm::kRing:
              return ring_reduce(t, input, output, input_count, root, reduction, call, tuning_,
                                 scratch_);
            case Algorithm::kTree:
              return tree_reduce(t, input, output, input_count, root, reduction, call, tuning_,
                                 scratch_);
            case Algorithm::kRankOrder:
              return rank_order_reduce(t, input, output, input_count, root, reduction, call,
                                       tuning_, scratch_);
            default:
              return run_native([&](auto& mpi) {
                native_reduce(mpi, input, output, input_count, root, reduction);
              });
          }
        default:
          throw InvalidArgument(std::string(name_of(call.collective)) + " does not reduce");
      }
    });
  }

  // Owns the message book; closes it (failing what is pending) before the transport it drives
  // goes, which is why it is declared after the transports.
  struct MessageBookHandle {
    std::shared_ptr<detail::MessageBook> book;
    MessageBookHandle() = default;
    MessageBookHandle(const MessageBookHandle&) = delete;
    MessageBookHandle& operator=(const MessageBookHandle&) = delete;
    ~MessageBookHandle() {
      if (book) book->close();
    }
  };

  Backend backend_;
  CommOptions options_;
  CostModel cost_model_;
  std::shared_ptr<const TuningFile> tuning_file_;  // null: the cost model alone
  AlgorithmTuning tuning_;
  std::uint64_t sequence_ = 0;
  // SIGUSR1's thread holds its address: this object never moves (Communicator holds it by pointer).
  FlightRecorder recorder_;
#if COLTRAIN_WITH_MPI
  std::shared_ptr<detail::MpiSession> mpi_session_;  // declared first: outlives mpi_
  std::unique_ptr<MpiTransport> mpi_;
#endif
  std::unique_ptr<TcpTransport> tcp_;
  MessageBookHandle messages_;                         // after the transports: goes before them
  std::map<std::pair<int, int>, std::uint64_t> sent_;  // messages per (peer, tag), both ways
  std::map<std::pair<int, int>, std::uint64_t> received_;
  AlgorithmScratch scratch_;  // the algorithms' buffers, reused across calls
  std::vector<float> widened_input_;
  std::vector<float> widened_output_;
};

}  // namespace coltrain::comm
