#pragma once
// DeviceDataParallel<Net>: train::DataParallel for a network on the GPU (nn::Network<Spec, T,
// tensor::Cuda>), over any comm::Communicator backend: NCCL, or MPI and TCP through staging.
//
//   cudaSetDevice(coltrain::select_cuda_device(env, count));
//   auto comm = comm::Communicator::from_env({}, comm::comm_options_from_env(), comm::Memory::kDevice);
//   nn::Network<Spec, half, tensor::Cuda> net({.seed = 1});
//   train::DeviceDataParallel ddp(net, comm);   // every rank now holds rank 0's parameters
//   ... forward, loss, net.backward(grad);      // buckets reduce during backward
//   ddp.finish_gradient_sync();                 // the network's stream waits for the averages
//   opt.unscale_and_check(); ddp.agree_on_overflow(opt.found_inf()); opt.apply();
//
// The buckets are DataParallel's (train/gradient_buckets.hpp). When the backward pass reports the
// last gradient of the next bucket, an event is recorded on the network's stream; a communication
// stream of our own waits for it and averages the bucket in place: its range of the network's
// gradient arena (nn/parameter_arena.hpp), as on the CPU. 16-bit gradients are widened into a flat
// f32 buffer, reduced in f32 and rounded once on the way back. The backward pass meanwhile goes on
// on the network's stream.
// - NCCL (stream-ordered): all of this is enqueued from the caller's thread; the host never waits,
//   and a whole step, collectives included, can be captured as a CUDA graph.
// - MPI and TCP (staged): each bucket is a non-blocking iallreduce (comm/request.hpp), issued
//   from the backward pass once the communication stream waits for its event; the
//   communicator's progress thread stages it from there, in order, as DataParallel's buckets.
// finish_gradient_sync() makes the network's stream wait (on the GPU) for the last bucket.
// On one rank nothing is communicated (the average of one is itself).
//
// The overflow flag of mixed precision (DevicePrecisionOptimizer::found_inf) is max-reduced on the
// device, so every rank skips an overflowed step together without the host reading it (NCCL; the
// staged backends read it on the host, as they must). BatchNorm running statistics are averaged
// by average_buffers(), which DeviceTrainer calls before every evaluation and checkpoint.

#if !defined(__CUDACC__)
#error "coltrain/cuda/train/data_parallel.cuh is CUDA code: compile it with nvcc"
#endif

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/cuda_handles.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/timer.hpp>
#include <coltrain/cuda/cast.cuh>
#include <coltrain/tensor/cuda_storage.hpp>
#include <coltrain/tensor/device.hpp>
#include <coltrain/tensor/tensor.hpp>
#include <coltrain/train/data_parallel.hpp>
#include <coltrain/train/gradient_buckets.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain::train {

// What DeviceDataParallel needs of a network: nn::Network on the GPU.
template <class Net>
concept DeviceDataParallelNetwork = std::is_same_v<typename Net::device_type, tensor::Cuda>;

template <DeviceDataParallelNetwork Net>
class DeviceDataParallel : public GradientSyncState {
  using T = typename Net::value_type;
  using B = detail::bucket_element_t<T>;  // f32 for 16-bit gradients
  static constexpr bool kInPlace = std::is_same_v<T, B>;  // the allreduce works on the arena

 public:
  // Broadcasts rank 0's parameters and buffers and checks that all ranks built the same buckets.
  // Collective. The network and the
  // communicator must outlive this object; the current CUDA device must be the network's.
  DeviceDataParallel(Net& network, comm::Communicator& communicator,
                     DataParallelOptions options = {})
      : GradientSyncState("DeviceDataParallel", communicator, options),
        network_(network),
        stream_ordered_(communicator.stream_ordered()) {
    require_unwrapped(network_);
    assign_buckets(network_, sizeof(B));
    auto& arena = network_.parameter_arena();
    for (const GradientBucket& bucket : buckets_) {
      const auto [first, end] = arena.range(bucket.parameters);
      ranges_.push_back({arena.gradients() + first, end - first});
      if constexpr (!kInPlace) buffers_.emplace_back(end - first);
      ready_.emplace_back();
    }
    check_same_buckets_on_every_rank();
    broadcast_parameters_and_buffers();
    network_.context().set_gradient_ready_hook(
        [this](const void* parameter) { on_gradient_ready(parameter); });
  }

  // Waits for the buckets still in flight (a step abandoned by an exception): they use its buffers.
  ~DeviceDataParallel() {
    network_.context().set_gradient_ready_hook(nullptr);
    for (const comm::Request& request : requests_) {
      try {
        request.wait();
      } catch (...) {  // the step's error was reported, or its owner is unwinding from one
      }
    }
  }

  // Launches what is left of this step's buckets and makes the network's stream wait for the
  // averaged gradients. Returns the seconds the host waited: 0 with NCCL or one rank, the wait for
  // the buckets' requests otherwise. Rethrows a communication error, prefixed with the bucket.
  // Under no_sync() it does nothing.
  double finish_gradient_sync() {
    throw_if_failed("finish_gradient_sync");
    if (!sync_enabled_ || buckets_.empty()) return 0.0;
    const std::size_t launched_during_backward = next_launch_;
    const std::size_t last = buckets_.size() - 1;
    if (!communicates()) {
      last_sync_ = {buckets_.size(), launched_during_backward, 0, 0.0};
      reset_step();
      return 0.0;
    }
    const Stopwatch watch;
    std::exception_ptr error;
    std::size_t error_bucket = 0;
    std::size_t reduced_before_wait = 0;
    if (stream_ordered_) {
      try {
        launch(last + 1);
      } catch (...) {
        error = std::current_exception();
        error_bucket = next_launch_;
      }
    } else {
      for (std::size_t b = 0; b < launched_during_backward; ++b) {
        try {
          reduced_before_wait += requests_[b].test() ? 1 : 0;
        } catch (...) {  // failed, so done: wait() below reports it
          ++reduced_before_wait;
        }
      }
      try {
        launch(last + 1);
      } catch (...) {
        error = std::current_exception();
        error_bucket = next_launch_;
      }
      // Every request is waited for, failed or not: they use the buckets' buffers.
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        try {
          std::exchange(requests_[b], comm::Request()).wait();
          if constexpr (!kInPlace) {
            if (!error) {
              cuda::cast(buffers_[b].data(), ranges_[b].data,
                         static_cast<std::int64_t>(ranges_[b].size), comm_stream_.get());
            }
          }
        } catch (...) {
          if (!error) {
            error = std::current_exception();
            error_bucket = b;
          }
        }
      }
    }
    if (!error) {
      synced_.record(comm_stream_.get());
      synced_.make_wait(compute_stream());
    }
    last_sync_ = {buckets_.size(), launched_during_backward, reduced_before_wait, watch.seconds()};
    reset_step();
    if (error) fail_bucket(error, error_bucket);
    return last_sync_.wait_seconds;
  }

  // Gradient accumulation without communication (GradientSyncState::NoSyncScope); InvalidArgument
  // inside a synchronised step.
  NoSyncScope no_sync() { return pause_sync(); }

  // Max-reduces the optimizer's overflow flag (a device int32, 1 if this rank saw Inf/NaN) across
  // ranks, ordered on the network's stream, so that every rank skips the same steps.
  void agree_on_overflow(std::int32_t* found_inf) {
    require_idle("agree_on_overflow");
    if (!communicates()) return;
    comm_.set_stream(compute_stream());
    comm_.allreduce(std::span<std::int32_t>(found_inf, 1), comm::ReduceOp::kMax);
  }

  // Averages the floating-point buffers (BatchNorm's running mean and variance) across ranks, in
  // f32 for 16-bit buffers, as DataParallel::average_buffers; integer buffers (num_batches_tracked)
  // advance alike on every rank and are only checked (MismatchError naming the buffer). Collective,
  // ordered on the network's stream; the host reads the integer buffers.
  void average_buffers() {
    require_idle("average_buffers");
    if (!communicates()) return;
    std::vector<std::int64_t> counts;
    std::vector<std::string> count_names;
    std::vector<std::size_t> count_owner;
    network_.visit_buffers([&](const std::string& name, auto& buffer) {
      using E = std::remove_cvref_t<decltype(*buffer.data())>;
      if constexpr (std::is_integral_v<E>) {
        std::vector<E> values(static_cast<std::size_t>(buffer.numel()));
        COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(values.data(), buffer.data(),
                                            values.size() * sizeof(E), cudaMemcpyDeviceToHost,
                                            compute_stream()));
        COLTRAIN_CHECK_CUDA(cudaStreamSynchronize(compute_stream()));
        count_names.push_back(name);
        for (const E v : values) {
          count_owner.push_back(count_names.size() - 1);
          counts.push_back(static_cast<std::int64_t>(v));
          counts.push_back(-static_cast<std::int64_t>(v));
        }
      }
    });
    detail::require_equal_counts(comm_, counts, count_names, count_owner,
                                 error_context("average_buffers"));
    comm_.set_stream(compute_stream());
    network_.visit_buffers([this](const std::string&, auto& buffer) {
      using E = std::remove_cvref_t<decltype(*buffer.data())>;
      const auto n = static_cast<std::size_t>(buffer.numel());
      if constexpr (std::is_same_v<E, float> || std::is_same_v<E, double>) {
        comm_.allreduce(std::span<E>(buffer.data(), n), comm::ReduceOp::kAvg);
      } else if constexpr (detail::kSixteenBit<E>) {
        scratch_.resize(tensor::Shape{static_cast<std::int64_t>(n)});
        cuda::cast(buffer.data(), scratch_.data(), static_cast<std::int64_t>(n), compute_stream());
        comm_.allreduce(std::span<float>(scratch_.data(), n), comm::ReduceOp::kAvg);
        cuda::cast(scratch_.data(), buffer.data(), static_cast<std::int64_t>(n), compute_stream());
      }
    });
  }

  // Rank 0's parameters and buffers to every rank (the constructor does this). Collective; the
  // host waits until they have arrived.
  void broadcast_parameters_and_buffers() {
    require_idle("broadcast_parameters_and_buffers");
    if (!communicates()) return;
    comm_.set_stream(compute_stream());
    const auto broadcast = [this](const std::string&, auto& tensor) {
      using E = std::remove_cvref_t<decltype(*tensor.data())>;
      comm_.broadcast(std::span<E>(tensor.data(), static_cast<std::size_t>(tensor.numel())));
    };
    network_.visit_parameters(
        [&](const std::string& name, auto& parameter) { broadcast(name, parameter.value); });
    network_.visit_buffers(broadcast);
    comm_.synchronize();
  }

  Net& network() { return network_; }
  // Whether a step, collectives included, can be captured as a CUDA graph: nothing blocks the host
  // (NCCL, or one rank).
  bool capturable() const { return stream_ordered_ || !communicates(); }

 private:
  struct ArenaRange {
    T* data;
    std::size_t size;
  };

  bool communicates() const { return world_size_ > 1; }
  cudaStream_t compute_stream() { return network_.context().stream(); }

  // The gradient-ready hook, on the thread running backward().
  void on_gradient_ready(const void* parameter) {
    if (!sync_enabled_) return;
    const std::size_t ready = record_report(parameter);
    if (communicates()) launch(ready);
  }

  // Buckets [next_launch_, end): their gradients are queued on the network's stream.
  void launch(std::size_t end) {
    if (end <= next_launch_) return;
    for (std::size_t b = next_launch_; b < end; ++b) ready_[b].record(compute_stream());
    for (std::size_t b = next_launch_; b < end; ++b) {
      next_launch_ = b;
      reduce_bucket(b);
    }
    next_launch_ = end;
  }

  // On the communication stream, after bucket b's event: average its range of the arena in
  // place, or (16-bit gradients) widened into its f32 buffer (and back: here on NCCL, after the
  // request on staged backends). NCCL enqueues the allreduce; a staged one is a request that the
  // progress thread runs after what the communication stream holds now.
  void reduce_bucket(std::size_t b) {
    cudaStream_t stream = comm_stream_.get();
    ready_[b].make_wait(stream);
    const ArenaRange range = ranges_[b];
    const auto n = static_cast<std::int64_t>(range.size);
    comm_.set_stream(stream);
    B* averaged = nullptr;
    if constexpr (kInPlace) {
      averaged = range.data;
    } else {
      averaged = buffers_[b].data();
      cuda::cast(range.data, averaged, n, stream);
    }
    if (!stream_ordered_) {
      requests_[b] = comm_.iallreduce(std::span<B>(averaged, range.size), comm::ReduceOp::kAvg,
                                      options_.algorithm);
      return;
    }
    comm_.allreduce(std::span<B>(averaged, range.size), comm::ReduceOp::kAvg, options_.algorithm);
    if constexpr (!kInPlace) cuda::cast(averaged, range.data, n, stream);
  }

  Net& network_;
  bool stream_ordered_;

  // Fixed at construction. Requests (GradientSyncState::requests_) are used on staged backends
  // only: the step's iallreduce per bucket.
  std::vector<ArenaRange> ranges_;  // by bucket: its gradients, in the network's arena
  std::vector<tensor::Storage<B, tensor::Cuda>> buffers_;  // by bucket, 16-bit only: f32 copy
  std::vector<CudaEvent> ready_;                           // per bucket, on the network's stream
  CudaStream comm_stream_;
  CudaEvent synced_;                             // the last bucket, on comm_stream_
  tensor::Tensor<float, tensor::Cuda> scratch_;  // 16-bit buffers widened for averaging
};

}  // namespace coltrain::train
