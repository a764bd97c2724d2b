#pragma once
// DeviceLoader: a Loader's batches in GPU memory, copied while the previous batch trains.
//
//   data::Loader<half> host(train, sampler, {.batch_size = 512}, transform);
//   data::DeviceLoader device(host, net.context().stream());
//   device.start_epoch(epoch);
//   while (const data::DeviceBatch<half>* batch = device.next())
//     step(batch->images, batch->labels);   // device views, valid until the next next()
//
// The host Loader's thread prepares batches (decode, augment) as before. next() hands out the
// batch copied during the previous step, then starts copying the one after: its images and labels
// go into a pinned buffer (a host memcpy, at memory speed) and from there to the device on a copy
// stream of our own, asynchronously. Two slots alternate; events keep the order without the host
// waiting: the consumer's stream waits for a slot's copy, and a slot's next copy waits until the
// consumer's stream has finished the step that read it. Runtime API only: g++ builds it.

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/data/device_loader.hpp needs CUDA (COLTRAIN_WITH_CUDA=1)"
#endif

#include <coltrain/core/cuda_handles.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/loader.hpp>
#include <coltrain/tensor/cuda_storage.hpp>
#include <coltrain/tensor/device.hpp>
#include <coltrain/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace coltrain::data {

template <class T>
struct DeviceBatch {
  tensor::TensorView<const T, tensor::Cuda> images;              // [B, C, H, W]
  tensor::TensorView<const std::int32_t, tensor::Cuda> labels;  // [B]
  std::int64_t number = 0;                                       // of this batch in its epoch

  std::int64_t size() const { return labels.numel(); }
};

template <class T, SampleTransform Transform = ImageTransform>
class DeviceLoader {
 public:
  // `host` must outlive this object; batches are read on `consumer` (the network's stream) on the
  // current device.
  DeviceLoader(Loader<T, Transform>& host, cudaStream_t consumer)
      : host_(host), consumer_(consumer) {}

  DeviceLoader(const DeviceLoader&) = delete;
  DeviceLoader& operator=(const DeviceLoader&) = delete;
  // The copy stream's work reads the slots: finish it before they go.
  ~DeviceLoader() { cudaStreamSynchronize(copy_stream_.get()); }

  std::int64_t batches_per_epoch() const { return host_.batches_per_epoch(); }
  Loader<T, Transform>& host() { return host_; }

  // Starts an epoch (the host loader's, and its sampler's) and the copy of its first batch.
  void start_epoch(std::uint64_t epoch) {
    release_handed_out();
    host_.start_epoch(epoch);
    ready_ = 0;
    stage(ready_);
  }

  // The next batch of the epoch, or nullptr at its end. The consumer's stream waits (on the GPU)
  // for its copy; the views stay valid until the next call of next() or start_epoch(). Rethrows
  // the host loader's errors.
  const DeviceBatch<T>* next() {
    release_handed_out();
    Slot& slot = slots_[ready_];
    if (!slot.filled) return nullptr;
    slot.copied.make_wait(consumer_);
    handed_out_ = static_cast<int>(ready_);
    ready_ = 1 - ready_;
    stage(ready_);  // the batch after this one, while this one trains
    return &slot.batch;
  }

 private:
  struct Slot {
    tensor::PinnedBuffer<T> host_images;
    tensor::PinnedBuffer<std::int32_t> host_labels;
    tensor::Tensor<T, tensor::Cuda> images;
    tensor::Tensor<std::int32_t, tensor::Cuda> labels;
    CudaEvent copied;    // on the copy stream: the slot's device tensors hold the batch
    CudaEvent consumed;  // on the consumer's stream: the step that read the slot is done
    bool consumed_recorded = false;
    bool filled = false;
    DeviceBatch<T> batch;
  };

  // The batch handed out last is no longer needed once the consumer's stream gets here.
  void release_handed_out() {
    if (handed_out_ < 0) return;
    Slot& slot = slots_[static_cast<std::size_t>(handed_out_)];
    slot.consumed.record(consumer_);
    slot.consumed_recorded = true;
    handed_out_ = -1;
  }

  void stage(std::size_t index) {
    Slot& slot = slots_[index];
    slot.filled = false;
    const Batch<T>* batch = host_.next();
    if (batch == nullptr) return;
    const auto images = static_cast<std::size_t>(batch->images.numel());
    const auto labels = batch->labels.size();
    // The pinned buffers' last copy to the device went two batches ago; it is long done.
    slot.copied.synchronize();
    if (slot.host_images.size() < images) slot.host_images = tensor::PinnedBuffer<T>(images);
    if (slot.host_labels.size() < labels)
      slot.host_labels = tensor::PinnedBuffer<std::int32_t>(labels);
    std::memcpy(slot.host_images.data(), batch->images.data(), images * sizeof(T));
    std::memcpy(slot.host_labels.data(), batch->labels.data(), labels * sizeof(std::int32_t));
    // Growing a device tensor frees the old memory, which cudaFree does only once the device is
    // idle, so no step still reads it.
    slot.images.resize(batch->images.shape());
    slot.labels.resize(tensor::Shape{static_cast<std::int64_t>(labels)});
    cudaStream_t copy = copy_stream_.get();
    if (slot.consumed_recorded) slot.consumed.make_wait(copy);
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(slot.images.data(), slot.host_images.data(),
                                        images * sizeof(T), cudaMemcpyHostToDevice, copy));
    COLTRAIN_CHECK_CUDA(cudaMemcpyAsync(slot.labels.data(), slot.host_labels.data(),
                                        labels * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                                        copy));
    slot.copied.record(copy);
    slot.batch = {slot.images.view(), slot.labels.view(), batch->number};
    slot.filled = true;
  }

  Loader<T, Transform>& host_;
  cudaStream_t consumer_;
  CudaStream copy_stream_;
  std::array<Slot, 2> slots_;
  std::size_t ready_ = 0;  // the slot next() hands out
  int handed_out_ = -1;    // the slot the consumer may still read
};

}  // namespace coltrain::data
