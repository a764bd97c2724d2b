// The Communicator's members that reach the host path (comm/host/host_collectives.hpp). Header-only
// builds include this file at the end of comm/communicator.hpp, as inline definitions; with
// COLTRAIN_SEPARATE_COMPILATION only <coltrain/src.hpp> includes it, in one translation unit, so
// the transports and algorithms are compiled there once.
#pragma once

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/device/staged_collectives.hpp>
#include <coltrain/comm/host/host_collectives.hpp>
#include <coltrain/comm/protocol/flight_recorder.hpp>
#include <coltrain/comm/tuning/backend_choice.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/timeline.hpp>

#if COLTRAIN_WITH_MPI
#include <coltrain/comm/transport/mpi/mpi_session.hpp>
#endif

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::comm {

COLTRAIN_DECL Communicator Communicator::from_env(std::optional<Backend> backend,
                                                  CommOptions options, Memory memory) {
  const LaunchEnv env = detect_launch_env();
  BackendEnvironment environment;
  environment.mpi_launch = env.started_by_mpi();
  const char* requested = std::getenv("COLTRAIN_BACKEND");
  [[maybe_unused]] const BackendChoice choice =
      choose_backend(backend, requested != nullptr ? requested : "", memory, environment);
#if COLTRAIN_WITH_MPI
  Communicator host = choice.host == Backend::kMpi ? mpi_world(options) : tcp(env, options);
#else
  Communicator host = tcp(env, options);
#endif
#if COLTRAIN_WITH_NCCL
  if (choice.backend == Backend::kNccl) return nccl(std::move(host), std::move(options));
#endif
  return host;
}

COLTRAIN_DECL Communicator Communicator::tcp(const LaunchEnv& env, CommOptions options) {
  return Communicator(Backend::kTcp, HostCollectives::tcp(env, options));
}

COLTRAIN_DECL Communicator Communicator::tcp(int rank, std::vector<detail::FileDescriptor> sockets,
                                             const LaunchEnv& env, CommOptions options) {
  return Communicator(Backend::kTcp, HostCollectives::tcp(rank, std::move(sockets), env, options));
}

#if COLTRAIN_WITH_MPI
COLTRAIN_DECL Communicator Communicator::mpi(MPI_Comm comm, CommOptions options) {
  return Communicator(Backend::kMpi, HostCollectives::mpi(comm, options));
}

COLTRAIN_DECL Communicator Communicator::mpi_world(const CommOptions& options) {
  // The session first: it initialises MPI when nobody has, and finalises it with the last
  // communicator that shares it.
  auto session = std::make_shared<detail::MpiSession>();
  return Communicator(Backend::kMpi,
                      HostCollectives::mpi(MPI_COMM_WORLD, options, std::move(session)));
}
#endif

#if COLTRAIN_WITH_NCCL
COLTRAIN_DECL Communicator Communicator::nccl(Communicator host, CommOptions options) {
  if (host.backend_ == Backend::kNccl) {
    throw InvalidArgument("Communicator::nccl needs an MPI or TCP communicator to bootstrap over");
  }
  const NcclFactory factory = registered_nccl_factory();
  if (factory == nullptr) {
    throw ConfigError(
        "the NCCL backend is not in this program: include "
        "<coltrain/comm/device/nccl/nccl_backend.hpp> in one of its files (nvcc-compiled files "
        "that include coltrain/comm/communicator.hpp have it), or set COLTRAIN_BACKEND=mpi or "
        "tcp");
  }
  const BroadcastWords broadcast = [&host](std::span<std::int64_t> words) {
    host.broadcast(words, 0);
  };
  host.device_.attach_nccl(factory(host.rank(), host.size(), broadcast, options));
  host.backend_ = Backend::kNccl;
  host.start_recording(options);
  return host;
}

COLTRAIN_DECL DeviceCollectives& Communicator::nccl() {
  if (!device_.nccl()) {
    throw InvalidArgument("this communicator's backend is " + std::string(name_of(backend_)) +
                          ", not nccl");
  }
  return *device_.nccl();
}
#endif

COLTRAIN_DECL Communicator::Communicator(Backend backend, std::unique_ptr<HostCollectives> host,
                                         bool names_process)
    : backend_(backend),
      host_backend_(backend),
      host_(std::move(host)),
      device_cost_model_(default_cost_model(Backend::kNccl)) {
  if (const auto& tuning = host_->tuning_file()) {
    if (const CostModel* nccl = tuning->cost_model_for(Backend::kNccl)) device_cost_model_ = *nccl;
  }
  start_recording(host_->options(), names_process);
}

COLTRAIN_DECL Communicator::Communicator(Communicator&&) noexcept = default;
COLTRAIN_DECL Communicator& Communicator::operator=(Communicator&&) noexcept = default;
COLTRAIN_DECL Communicator::~Communicator() { progress_.drain(); }

COLTRAIN_DECL int Communicator::rank() const { return host_->rank(); }
COLTRAIN_DECL int Communicator::size() const { return host_->size(); }
COLTRAIN_DECL const HostLayout& Communicator::host_layout() const { return host_->host_layout(); }
COLTRAIN_DECL const CommOptions& Communicator::options() const { return host_->options(); }
COLTRAIN_DECL bool Communicator::single_copy_with(int peer) const {
  return host_->single_copy_with(peer);
}
COLTRAIN_DECL bool Communicator::deterministic() const { return host_->options().deterministic; }

COLTRAIN_DECL const FlightRecorder& Communicator::flight_recorder() const {
  return host_->recorder();
}
COLTRAIN_DECL void Communicator::set_staging_options(const StagingOptions& options) {
  plan_chunks(0, 1, 1, options);  // rejects bad options here
  progress_.drain();              // queued staged calls keep the options they were issued under
  staging_options_ = options;
#if COLTRAIN_WITH_CUDA
  device_.set_staging_options(options);
#endif
}

COLTRAIN_DECL std::string Communicator::trace_dir() const {
  return host_->recorder().trace_dir().string();
}
COLTRAIN_DECL void Communicator::set_trace_dir(std::string dir) {
  host_->recorder().set_trace_dir(std::move(dir));
}

COLTRAIN_DECL const CostModel& Communicator::cost_model(Memory memory) const {
  return memory == Memory::kDevice && backend_ == Backend::kNccl ? device_cost_model_
                                                                 : host_->cost_model();
}
COLTRAIN_DECL void Communicator::set_cost_model(const CostModel& model, Memory memory) {
  (memory == Memory::kDevice && backend_ == Backend::kNccl ? device_cost_model_
                                                           : host_->cost_model()) = model;
}
COLTRAIN_DECL const AlgorithmTuning& Communicator::tuning() const { return host_->tuning(); }
COLTRAIN_DECL void Communicator::set_tuning(const AlgorithmTuning& tuning) {
  host_->tuning() = tuning;
}
COLTRAIN_DECL void Communicator::use_tuning(const TuningFile& tuning) {
  progress_.drain();  // queued calls run under the settings they were issued with
  if (const CostModel* nccl = tuning.cost_model_for(Backend::kNccl)) device_cost_model_ = *nccl;
  host_->use_tuning(std::make_shared<const TuningFile>(tuning));
}

COLTRAIN_DECL Algorithm Communicator::choose(Collective collective, std::size_t bytes,
                                             [[maybe_unused]] Memory memory) const {
#if COLTRAIN_WITH_CUDA
  if (memory == Memory::kDevice && device_.nccl()) {
    return choose_nccl_algorithm(device_cost_model_, collective, size(), bytes,
                                 device_.nccl()->device_reduction() != nullptr);
  }
#endif
  return host_->choose(collective, bytes);
}

COLTRAIN_DECL void Communicator::barrier(Algorithm algorithm) { ready_host().barrier(algorithm); }

COLTRAIN_DECL std::optional<Communicator> Communicator::split(int color, int key) {
  std::unique_ptr<HostCollectives> host = ready_host().split(color, key);
  std::optional<Communicator> child;
  // A split names no process in the timeline: the parent already did.
  if (host) child = Communicator(host_backend_, std::move(host), false);
#if COLTRAIN_WITH_CUDA
  if (device_.nccl()) {
    std::unique_ptr<DeviceCollectives> device = device_.nccl()->split(color, key);
    if (child) {
      child->device_.attach_nccl(std::move(device));
      child->backend_ = Backend::kNccl;
      child->start_recording(child->host_->options(), false);  // recorded as NCCL
    }
  }
#endif
  if (!child) return child;
  child->device_cost_model_ = device_cost_model_;
  child->compression_ = compression_;
  child->staging_options_ = staging_options_;
  child->set_trace_dir(trace_dir());
  return child;
}

COLTRAIN_DECL Request Communicator::post_message(bool sending, int peer, int tag, DataType dtype,
                                                 std::size_t count,
                                                 std::span<const std::byte> outgoing,
                                                 std::span<std::byte> incoming) {
  ErrorContext context = checks().context(Collective::kSendRecv);
  context.peer = peer;
  const char* call = sending ? "send" : "recv";
  if (peer < 0 || peer >= size() || peer == rank()) {
    throw InvalidArgument(std::string(call) + ": rank " + std::to_string(peer) +
                              (peer == rank() ? " is this rank; a rank does not send to itself"
                                              : " is not a rank of this " + std::to_string(size()) +
                                                    "-rank communicator"),
                          context);
  }
  if (tag < 0 || tag > kMaxTag) {
    throw InvalidArgument(std::string(call) + ": tag " + std::to_string(tag) + " is outside 0.." +
                              std::to_string(kMaxTag),
                          context);
  }
  // Device buffers wait in NCCL's message group, or travel through host memory of their own.
  std::function<void()> on_arrival;
#if COLTRAIN_WITH_CUDA
  const std::span<const std::byte> buffer = sending ? outgoing : incoming;
  if (memory_of_call(Collective::kSendRecv, buffer, buffer) == Memory::kDevice) {
    DevicePath<Communicator>& device = device_path();
    if (device.nccl()) {
      std::function<bool(bool)> flush =
          device.queue_nccl_message(sending, peer, tag, outgoing, incoming, context);
      progress_.drain();
      return book_message(std::move(flush));
    }
    on_arrival = device.bounce_message(sending, outgoing, incoming);
  }
#endif
  return ready_host().post_message(sending, peer, tag, dtype, count, outgoing, incoming,
                                   std::move(on_arrival), progress_.drainer());
}

COLTRAIN_DECL Request Communicator::book_message(std::function<bool(bool block)> advance) {
  return host_->book_message(std::move(advance), progress_.drainer());
}

COLTRAIN_DECL HostCollectives& Communicator::ready_host() {
  progress_.drain();
  return *host_;
}

COLTRAIN_DECL void Communicator::host_reduce(Collective collective,
                                             std::span<const std::byte> input,
                                             std::span<std::byte> output, DataType dtype,
                                             ReduceOp op, int root, Algorithm algorithm,
                                             WireCompression compression) {
  ready_host().reduce(collective, input, output, dtype, op, root, algorithm, compression);
}
COLTRAIN_DECL void Communicator::host_broadcast(std::span<std::byte> data, DataType dtype, int root,
                                                Algorithm algorithm) {
  ready_host().broadcast(data, dtype, root, algorithm);
}
COLTRAIN_DECL void Communicator::host_allgather(std::span<const std::byte> input,
                                                std::span<std::byte> output, DataType dtype,
                                                Algorithm algorithm) {
  ready_host().allgather(input, output, dtype, algorithm);
}
COLTRAIN_DECL void Communicator::host_allgatherv(std::span<const std::byte> input,
                                                 std::span<std::byte> output,
                                                 std::span<const std::size_t> bytes,
                                                 std::span<const std::size_t> offsets,
                                                 DataType dtype, Algorithm algorithm) {
  ready_host().allgatherv(input, output, bytes, offsets, dtype, algorithm);
}
COLTRAIN_DECL void Communicator::host_alltoall(std::span<const std::byte> input,
                                               std::span<std::byte> output, DataType dtype,
                                               Algorithm algorithm) {
  ready_host().alltoall(input, output, dtype, algorithm);
}
COLTRAIN_DECL void Communicator::host_alltoallv(std::span<const std::byte> input,
                                                std::span<const std::size_t> sent_bytes,
                                                std::span<const std::size_t> sent_offsets,
                                                std::span<std::byte> output,
                                                std::span<const std::size_t> received_bytes,
                                                std::span<const std::size_t> received_offsets,
                                                DataType dtype, Algorithm algorithm) {
  ready_host().alltoallv(input, sent_bytes, sent_offsets, output, received_bytes, received_offsets,
                         dtype, algorithm);
}
COLTRAIN_DECL void Communicator::host_rooted_blocks(Collective collective,
                                                    std::span<const std::byte> input,
                                                    std::span<std::byte> output,
                                                    std::size_t block_bytes, DataType dtype,
                                                    int root, Algorithm algorithm) {
  ready_host().rooted_blocks(collective, input, output, block_bytes, dtype, root, algorithm);
}

COLTRAIN_DECL void Communicator::start_recording(const CommOptions& options, bool names_process) {
  if (names_process) Timeline::instance().set_process(rank(), size());
  host_->recorder().set_identity(rank(), size(), name_of(backend_));
  if (!options.trace_dir.empty()) host_->recorder().set_trace_dir(options.trace_dir);
}

}  // namespace coltrain::comm
