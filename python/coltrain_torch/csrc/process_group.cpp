// ProcessGroupColtrain: coltrain's collectives as a torch.distributed backend (c10d::ProcessGroup
// of PyTorch 1.13). Ranks meet through the c10d Store that init_process_group made
// (tcp_over_store), then talk over coltrain's TCP transport (shared memory between ranks of a
// host). Every operation is one of coltrain's non-blocking calls: its Request runs on the
// communicator's progress thread, in issue order, and a completion thread of this group waits for
// the requests in that order, copies results where a staging buffer was needed, and completes the
// Work and its Future (DDP waits on the Future); a thread that waits on a Work with nothing to copy
// completes it itself, as soon as its request is done (ColtrainWork::wait). Errors (a peer that
// died, a mismatched call, a wrong secret) reach Python as RuntimeError with coltrain's message,
// which names rank, peer and operation.
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <pybind11/chrono.h>

// Built against a PyTorch with CUDA (setup.py decides): CUDA tensors go through coltrain's staged
// device collectives.
#ifndef COLTRAIN_TORCH_WITH_CUDA
#define COLTRAIN_TORCH_WITH_CUDA 0
#endif
#if COLTRAIN_TORCH_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/rendezvous/store_rendezvous.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/host_memory.hpp>
#include <coltrain/core/launch_env.hpp>

#include <c10/core/CPUAllocator.h>

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace coltrain_torch {

namespace comm = coltrain::comm;

inline constexpr bool kWithCuda = COLTRAIN_TORCH_WITH_CUDA != 0;

// c10d's Store as what coltrain's rendezvous reads and writes.
class C10dStore final : public comm::RendezvousStore {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, std::span<const std::byte> value) override {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(value.data());
    store_->set(key, std::vector<std::uint8_t>(bytes, bytes + value.size()));
  }
  std::vector<std::byte> get(const std::string& key) override {
    const std::vector<std::uint8_t> value = store_->get(key);
    const auto* bytes = reinterpret_cast<const std::byte*>(value.data());
    return {bytes, bytes + value.size()};
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// Lets the GIL go for its lifetime where this thread holds it.
class WithoutGil {
 public:
  WithoutGil() : state_(Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~WithoutGil() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;

 private:
  PyThreadState* state_;
};

// A Work that the group's completion thread finishes; its Future holds the output tensors.
class ColtrainWork final : public c10d::Work {
 public:
  ColtrainWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<at::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  // The Future first: a caller that returns from wait() may read it at once. Once: the waiting
  // thread and the completion thread may both complete a call (wait()).
  void complete(std::exception_ptr error) {
    if (completing_.exchange(true)) return;
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // A call with nothing left to do once its request completes (no staging copy to copy back) may
  // be completed by the thread that waits for it: that thread then waits for the request itself,
  // which the progress thread wakes, instead of for the completion thread, which the same request
  // wakes first (8 B allreduce of 2 ranks: 38-43 us against 35-90). Set before the Work reaches
  // the caller.
  void done_with(comm::Request request) { request_ = std::move(request); }

  bool wait(std::chrono::milliseconds timeout = kWaitForever) override {
    if (!request_ || timeout != kWaitForever) return Work::wait(timeout);
    const WithoutGil without_gil;
    try {
      request_->wait();
    } catch (...) {
      complete(std::current_exception());
      throw;
    }
    complete(nullptr);
    return true;
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
  // c10d's kNoTimeout, which PyTorch 1.13 declares outside the namespace and 2.x inside it.
  static constexpr std::chrono::milliseconds kWaitForever{0};
  std::optional<comm::Request> request_;
  std::atomic<bool> completing_{false};
};

// The element type coltrain moves a tensor as. Reductions need the tensor's own type (complex
// numbers as pairs of their real type, which SUM and AVG reduce part by part); data movement of
// the other types (uint8 of pickled objects, bool, int8, int16) goes as 32-bit words, through a
// padded staging copy where the byte count is not a multiple of 4.
enum class Element { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kWords };

inline Element element_of(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
    case at::kComplexFloat:
      return Element::kFloat32;
    case at::kDouble:
    case at::kComplexDouble:
      return Element::kFloat64;
    case at::kHalf:
      return Element::kFloat16;
    case at::kBFloat16:
      return Element::kBFloat16;
    case at::kInt:
      return Element::kInt32;
    case at::kLong:
      return Element::kInt64;
    default:
      return Element::kWords;
  }
}

template <class F>
decltype(auto) with_element(Element element, F&& f) {
  switch (element) {
    case Element::kFloat32:
      return f(float{});
    case Element::kFloat64:
      return f(double{});
    case Element::kFloat16:
      return f(coltrain::half{});
    case Element::kBFloat16:
      return f(coltrain::bfloat16{});
    case Element::kInt32:
      return f(std::int32_t{});
    case Element::kInt64:
      return f(std::int64_t{});
    case Element::kWords:
      return f(std::int32_t{});
  }
  throw std::logic_error("unknown element type");
}

template <class T>
std::span<T> span_of(const at::Tensor& tensor) {
  return {reinterpret_cast<T*>(tensor.data_ptr()),
          static_cast<std::size_t>(tensor.nbytes() / sizeof(T))};
}

// The buffer a call works on for `tensor`: the tensor itself when it is contiguous (and, for words,
// a multiple of 4 bytes), else a staging copy of `words` 32-bit words (0: the tensor's own size)
// whose bytes go back to the tensor after the call when `copy_back`.
struct Buffer {
  at::Tensor tensor;  // what the call reads and writes
  at::Tensor user;    // the caller's tensor
  bool staged = false;
};

// Whether coltrain can work on `tensor` in place: contiguous and, moved as words, a whole number
// of aligned words.
inline bool usable_in_place(const at::Tensor& tensor) {
  if (!tensor.is_contiguous()) return false;
  if (element_of(tensor) != Element::kWords) return true;
  return tensor.nbytes() % 4 == 0 && reinterpret_cast<std::uintptr_t>(tensor.data_ptr()) % 4 == 0;
}

inline std::size_t words_for(std::size_t bytes) { return (bytes + 3) / 4; }

// The bytes of a contiguous tensor, as a 1-D uint8 tensor sharing its memory (on its device).
// as_strided, not reshape: a contiguous tensor of one element may still carry another stride.
inline at::Tensor bytes_of(const at::Tensor& tensor) {
  return tensor.as_strided({tensor.numel()}, {1}).view(at::kByte);
}

inline Buffer buffer_for(const at::Tensor& tensor) {
  Buffer buffer{tensor, tensor, false};
  if (usable_in_place(tensor)) return buffer;
  if (element_of(tensor) != Element::kWords) {
    buffer.tensor = tensor.contiguous();
  } else {
    buffer.tensor = at::zeros({static_cast<std::int64_t>(words_for(tensor.nbytes()))},
                              tensor.options().dtype(at::kInt));
    bytes_of(buffer.tensor)
        .narrow(0, 0, static_cast<std::int64_t>(tensor.nbytes()))
        .copy_(bytes_of(tensor.contiguous()));
  }
  buffer.staged = true;
  return buffer;
}

// A flat buffer of `blocks` blocks shaped like `buffer` (one rank's block each), on its device.
inline at::Tensor blocks_like(const Buffer& buffer, int blocks) {
  const at::Tensor& block = buffer.tensor;
  if (element_of(buffer.user) == Element::kWords) {
    return at::empty({static_cast<std::int64_t>(blocks * (block.nbytes() / 4))},
                     block.options().dtype(at::kInt));
  }
  return at::empty({blocks * block.numel()}, block.options());
}

// Copies to.nbytes() bytes of the contiguous `from`, starting at byte `offset`, into `to`.
inline void copy_bytes_into(at::Tensor& to, const at::Tensor& from, std::size_t offset) {
  const at::Tensor source = bytes_of(from).narrow(0, static_cast<std::int64_t>(offset),
                                                  static_cast<std::int64_t>(to.nbytes()));
  to.copy_(source.view(to.scalar_type()).view(to.sizes()));
}

// Copies the bytes of `from` into the contiguous `to` at byte `offset`.
inline void copy_bytes_from(const at::Tensor& to, const at::Tensor& from, std::size_t offset) {
  bytes_of(to)
      .narrow(0, static_cast<std::int64_t>(offset), static_cast<std::int64_t>(from.nbytes()))
      .copy_(bytes_of(from.contiguous()));
}

inline void copy_back(Buffer& buffer) {
  if (buffer.staged) copy_bytes_into(buffer.user, buffer.tensor, 0);
}

// What a call on `buffer` does once its request completes: copy a staging copy back, or nothing.
inline std::function<void()> copy_back_after(const std::shared_ptr<Buffer>& buffer) {
  if (!buffer->staged) return {};
  return [buffer] { copy_back(*buffer); };
}

inline std::optional<comm::ReduceOp> coltrain_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return comm::ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return comm::ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return comm::ReduceOp::kProd;
    case c10d::ReduceOp::MIN:
      return comm::ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return comm::ReduceOp::kMax;
    default:
      return std::nullopt;
  }
}

inline const char* op_name(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNUSED";
  }
}

// COLTRAIN_TORCH_HUGE_PAGES, as its two readers take it: "0" turns HugePageInteriors off; "1"
// puts PyTorch's large allocations on huge pages (HugePageCpuAllocator).
inline const std::string& torch_huge_pages_setting() {
  static const std::string value = [] {
    const char* text = std::getenv("COLTRAIN_TORCH_HUGE_PAGES");
    return std::string(text == nullptr ? "" : text);
  }();
  return value;
}

// Where the kernel's THP policy is "madvise" (Debian's default), PyTorch 1.13's CPU tensors sit on
// 4 KiB pages. Between the ranks of a host, single copy beat the shared-memory rings at large
// sizes on huge pages on every machine measured, but on 4 KiB pages only on some (CommOptions), so
// such tensors go through the rings by default: a 25 MB allreduce of 2 ranks took 6.4-7.3 ms where
// the same tensor on huge pages took 3.4 (docs/benchmarks.md). A tensor that comes back to the
// collectives (DDP's buckets, every step) is therefore moved onto huge pages where it lies: from
// its second call, its 2 MiB-aligned interior is collapsed into huge pages (madvise MADV_COLLAPSE,
// Linux 6.1) and noted as huge pages for the transport while the call runs. Collapsing costs
// 0.25-3 ms a MiB where it moves pages and microseconds where they are huge already, so:
// - tensors seen once are left alone;
// - an interior whose pages were 4 KiB again at a later call (a tensor freed and allocated again
//   at the same address) is not collapsed again;
// - new collapses wait while collapsing has cost more than a tenth of the time of the large calls,
//   after an allowance for the first conversions.
// COLTRAIN_TORCH_HUGE_PAGES=0 turns it off; =1 puts every allocation on huge pages from the start
// (HugePageCpuAllocator).
class HugePageInteriors {
 public:
  // Tensors from this size, whose interior holds at least half of their bytes.
  static constexpr std::size_t kMinBytes = std::size_t{4} << 20;

  static HugePageInteriors& instance() {
    static auto* interiors = new HugePageInteriors;  // never destroyed: loans may outlive exit
    return *interiors;
  }

  // The interior of [data, data + bytes) noted as huge pages until the loan goes; null where
  // nothing was noted (a small tensor, one seen for the first time, a kernel that cannot collapse).
  std::shared_ptr<void> lend(const void* data, std::size_t bytes) {
    if (bytes < kMinBytes || coltrain::on_huge_pages(data, bytes)) return nullptr;
    const auto begin = reinterpret_cast<std::uintptr_t>(data);
    const std::uintptr_t first = (begin + kHuge - 1) / kHuge * kHuge;
    const std::uintptr_t last = (begin + bytes) / kHuge * kHuge;
    if (last <= first || 2 * (last - first) < bytes) return nullptr;
    const Range range{first, last - first};
    const std::lock_guard lock(mutex_);
    if (!enabled_) return nullptr;
    Interior& interior = seen(range);
    if (interior.loans == 0) {
      if (++interior.calls < 2 || interior.unstable || !collapse(range, interior)) return nullptr;
      coltrain::note_huge_page_memory(reinterpret_cast<void*>(first), range.bytes);
    }
    ++interior.loans;
    return std::shared_ptr<void>(reinterpret_cast<void*>(first), [this, range](void*) {
      const std::lock_guard lock(mutex_);
      auto it = interiors_.find(range);
      if (it != interiors_.end() && --it->second.loans == 0)
        coltrain::forget_huge_page_memory(reinterpret_cast<void*>(range.start));
    });
  }

  // A call with a tensor of kMinBytes or more took `seconds`, issue to completion.
  void served(double seconds) {
    const std::lock_guard lock(mutex_);
    served_seconds_ += seconds;
  }

 private:
  static constexpr std::uintptr_t kHuge = coltrain::kHugePageBytes;
  static constexpr double kAllowanceSeconds = 0.25, kShareOfCalls = 0.1;
  // A huge page collapsed again took 1-50 us where it still was one (the most just after the
  // tensor was written), 0.6-7 ms where its pages had to move (measured on 2 cores).
  static constexpr double kStableProbeSeconds = 200e-6;
  static constexpr std::size_t kMaxRemembered = 256;
  struct Range {
    std::uintptr_t start;
    std::size_t bytes;
    auto operator<=>(const Range&) const = default;
  };
  struct Interior {
    int calls = 0;  // calls that came with this interior while it was not on loan
    int loans = 0;
    bool collapsed = false;  // once on huge pages
    bool unstable = false;   // on 4 KiB pages again after that
  };

  HugePageInteriors() {
    enabled_ = torch_huge_pages_setting() != "0" && coltrain::huge_pages_wanted();
  }

  Interior& seen(const Range& range) {
    if (interiors_.size() >= kMaxRemembered && interiors_.find(range) == interiors_.end())
      std::erase_if(interiors_, [](const auto& entry) { return entry.second.loans == 0; });
    return interiors_[range];
  }

  // Whether the interior is on huge pages now. An interior collapsed before is probed by its first
  // huge page: where that one had to move, the pages are new, and the rest is left as it is.
  bool collapse(const Range& range, Interior& interior) {
    if (!interior.collapsed &&
        collapse_seconds_ > kAllowanceSeconds + kShareOfCalls * served_seconds_)
      return false;
    if (interior.collapsed) {
      const std::optional<double> seconds = collapse_timed(range.start, kHuge);
      if (!seconds) return false;
      if (*seconds > kStableProbeSeconds) {
        interior.unstable = true;
        return false;
      }
      return range.bytes == kHuge ||
             collapse_timed(range.start + kHuge, range.bytes - kHuge).has_value();
    }
    if (!collapse_timed(range.start, range.bytes)) return false;
    interior.collapsed = true;
    return true;
  }

  // madvise(MADV_COLLAPSE) of [start, start + bytes): its time, or nothing where it failed. EAGAIN
  // and ENOMEM pass (pages pinned by a peer's read, no huge page free now); the other errors
  // (EINVAL: no MADV_COLLAPSE, or THP "never"; EPERM) turn collapsing off.
  std::optional<double> collapse_timed(std::uintptr_t start, std::size_t bytes) {
    const auto begin = std::chrono::steady_clock::now();
    const int result = ::madvise(reinterpret_cast<void*>(start), bytes, kCollapse);
    const int error = errno;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    collapse_seconds_ += seconds;
    if (result == 0) return seconds;
    if (error != EAGAIN && error != ENOMEM) enabled_ = false;
    return std::nullopt;
  }

#ifdef MADV_COLLAPSE
  static constexpr int kCollapse = MADV_COLLAPSE;
#else
  static constexpr int kCollapse = 25;  // Linux 6.1's value; older headers lack the name
#endif
  std::mutex mutex_;
  std::map<Range, Interior> interiors_;
  double collapse_seconds_ = 0, served_seconds_ = 0;
  bool enabled_ = true;
};

class ProcessGroupColtrain final : public c10d::ProcessGroup {
 public:
  ProcessGroupColtrain(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout)
      : ProcessGroup(rank, size), communicator_(connect(store, rank, size, timeout)) {
    completer_ = std::thread([this] { complete_in_order(); });
  }

  // Python destroys a group holding the GIL, and the completion thread may need it (a Python
  // callback on a Work's Future), so the wait for that thread lets it go. What the completed
  // calls held is released here, on the caller's thread.
  ~ProcessGroupColtrain() override {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    const WithoutGil without_gil;
    completer_.join();
  }

  const std::string getBackendName() const override { return "coltrain"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const at::Tensor& tensor = one_tensor(tensors, "allreduce");
    const comm::ReduceOp op = reduce_op(opts.reduceOp, tensor, "allreduce");
    auto buffer = std::make_shared<Buffer>(buffer_for(tensor));
    return issue(c10d::OpType::ALLREDUCE, tensor.device(), {tensor},
                 [&, buffer] {
                   return with_element(element_of(tensor), [&](auto element) {
                     using T = decltype(element);
                     return communicator_.iallreduce(span_of<T>(buffer->tensor), op);
                   });
                 },
                 copy_back_after(buffer), {buffer->tensor});
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    if (tensors.empty()) throw_invalid("allreduce_coalesced", "needs at least one tensor");
    for (const at::Tensor& tensor : tensors) {
      check_device(tensor, "allreduce_coalesced");
      if (tensor.scalar_type() != tensors.front().scalar_type()) {
        throw_invalid("allreduce_coalesced", "needs tensors of one dtype");
      }
    }
    const comm::ReduceOp op = reduce_op(opts.reduceOp, tensors.front(), "allreduce_coalesced");
    std::vector<at::Tensor> flat_inputs;
    for (const at::Tensor& tensor : tensors) flat_inputs.push_back(tensor.reshape({-1}));
    auto flat = std::make_shared<at::Tensor>(at::cat(flat_inputs));
    std::vector<at::Tensor> outputs = tensors;
    return issue(
        c10d::OpType::ALLREDUCE_COALESCED, tensors.front().device(), outputs,
        [&, flat] {
          return with_element(element_of(*flat), [&](auto element) {
            using T = decltype(element);
            return communicator_.iallreduce(span_of<T>(*flat), op);
          });
        },
        [flat, outputs]() mutable {
          std::int64_t offset = 0;
          for (at::Tensor& tensor : outputs) {
            tensor.copy_(flat->narrow(0, offset, tensor.numel()).view(tensor.sizes()));
            offset += tensor.numel();
          }
        },
        {*flat});
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const at::Tensor& tensor = one_tensor(tensors, "broadcast");
    const int root = root_rank(opts.rootRank, "broadcast");
    auto buffer = std::make_shared<Buffer>(buffer_for(tensor));
    return issue(
        c10d::OpType::BROADCAST, tensor.device(), {tensor},
        [&, buffer] {
          return with_element(element_of(buffer->tensor), [&](auto element) {
            using T = decltype(element);
            return communicator_.ibroadcast(span_of<T>(buffer->tensor), root);
          });
        },
        copy_back_after(buffer));
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const at::Tensor& tensor = one_tensor(tensors, "reduce");
    const comm::ReduceOp op = reduce_op(opts.reduceOp, tensor, "reduce");
    const int root = root_rank(opts.rootRank, "reduce");
    auto buffer = std::make_shared<Buffer>(buffer_for(tensor));
    return issue(
        c10d::OpType::REDUCE, tensor.device(), {tensor},
        [&, buffer] {
          return with_element(element_of(tensor), [&](auto element) {
            using T = decltype(element);
            const std::span<T> data = span_of<T>(buffer->tensor);
            return communicator_.ireduce(std::span<const T>(data), data, root, op);
          });
        },
        copy_back_after(buffer));
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    const at::Tensor& input = one_tensor(inputs, "allgather");
    std::vector<at::Tensor> blocks = block_list(outputs, input, "allgather", "output");
    return allgather_blocks(c10d::OpType::ALLGATHER, blocks, blocks, input);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    check_device(input, "allgather_into_tensor");
    check_flat(output, input, getSize(), "allgather_into_tensor", "output");
    if (!output.is_contiguous())
      throw_invalid("allgather_into_tensor", "needs a contiguous output");
    // Views of the output, one block per rank, which the blocks are copied into.
    const at::Tensor flat = output.view({-1});
    std::vector<at::Tensor> blocks;
    for (int r = 0; r < getSize(); ++r)
      blocks.push_back(flat.narrow(0, r * input.numel(), input.numel()));
    return allgather_blocks(c10d::OpType::_ALLGATHER_BASE, {output}, blocks, input);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const at::Tensor& input = one_tensor(inputs, "gather");
    const int root = root_rank(opts.rootRank, "gather");
    const bool is_root = getRank() == root;
    std::vector<at::Tensor> blocks;
    if (is_root) {
      blocks = block_list(outputs, input, "gather", "output");
    } else if (!outputs.empty() && !outputs.front().empty()) {
      throw_invalid("gather",
                    "takes output tensors on the root only (rank " + std::to_string(root) + ")");
    }
    auto buffer = std::make_shared<Buffer>(buffer_for(input));
    auto flat = std::make_shared<at::Tensor>(blocks_like(*buffer, is_root ? getSize() : 0));
    return issue(
        c10d::OpType::GATHER, input.device(), blocks,
        [&, buffer, flat] {
          return with_element(element_of(input), [&](auto element) {
            using T = decltype(element);
            return communicator_.igather(std::span<const T>(span_of<T>(buffer->tensor)),
                                         span_of<T>(*flat), root);
          });
        },
        [blocks, flat, stride = buffer->tensor.nbytes()]() mutable {
          for (std::size_t r = 0; r < blocks.size(); ++r)
            copy_bytes_into(blocks[r], *flat, r * stride);
        });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const at::Tensor& output = one_tensor(outputs, "scatter");
    const int root = root_rank(opts.rootRank, "scatter");
    const bool is_root = getRank() == root;
    auto buffer = std::make_shared<Buffer>(buffer_for(output));
    auto flat = std::make_shared<at::Tensor>(blocks_like(*buffer, is_root ? getSize() : 0));
    if (is_root) {
      const std::vector<at::Tensor> blocks = block_list(inputs, output, "scatter", "input");
      const std::size_t stride = buffer->tensor.nbytes();
      for (std::size_t r = 0; r < blocks.size(); ++r) copy_bytes_from(*flat, blocks[r], r * stride);
    } else if (!inputs.empty() && !inputs.front().empty()) {
      throw_invalid("scatter",
                    "takes input tensors on the root only (rank " + std::to_string(root) + ")");
    }
    return issue(
        c10d::OpType::SCATTER, output.device(), {output},
        [&, buffer, flat] {
          return with_element(element_of(output), [&](auto element) {
            using T = decltype(element);
            return communicator_.iscatter(std::span<const T>(span_of<T>(*flat)),
                                          span_of<T>(buffer->tensor), root);
          });
        },
        copy_back_after(buffer));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor& output = one_tensor(outputs, "reduce_scatter");
    const comm::ReduceOp op = reduce_op(opts.reduceOp, output, "reduce_scatter");
    const std::vector<at::Tensor> blocks = block_list(inputs, output, "reduce_scatter", "input");
    std::vector<at::Tensor> flat_blocks;
    for (const at::Tensor& block : blocks) flat_blocks.push_back(block.reshape({-1}));
    return reduce_scatter_flat(c10d::OpType::REDUCE_SCATTER, at::cat(flat_blocks), output, op);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    check_device(output, "reduce_scatter_tensor");
    check_device(input, "reduce_scatter_tensor");
    check_flat(input, output, getSize(), "reduce_scatter_tensor", "input");
    const comm::ReduceOp op = reduce_op(opts.reduceOp, output, "reduce_scatter_tensor");
    return reduce_scatter_flat(c10d::OpType::_REDUCE_SCATTER_BASE, input.contiguous(), output, op);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<std::int64_t>& output_splits,
                                               std::vector<std::int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    check_device(output, "all_to_all_single");
    check_device(input, "all_to_all_single");
    if (output.scalar_type() != input.scalar_type()) {
      throw_invalid("all_to_all_single", "needs input and output of one dtype");
    }
    const std::size_t size = static_cast<std::size_t>(getSize());
    // Counts in bytes first: dim-0 splits times the bytes of a row; equal blocks when not given.
    const auto byte_counts = [&](const at::Tensor& tensor, const std::vector<std::int64_t>& splits,
                                 const char* which) {
      std::vector<std::size_t> counts(size);
      const std::size_t rows = tensor.dim() == 0 ? 1 : static_cast<std::size_t>(tensor.size(0));
      const std::size_t row_bytes = rows == 0 ? 0 : tensor.nbytes() / rows;
      if (splits.empty()) {
        if (rows % size != 0) {
          throw_invalid("all_to_all_single", std::string("cannot split the ") + which + "'s " +
                                                 std::to_string(rows) + " rows into " +
                                                 std::to_string(size) + " equal blocks");
        }
        std::fill(counts.begin(), counts.end(), rows / size * row_bytes);
      } else {
        if (splits.size() != size) {
          throw_invalid("all_to_all_single", std::string("has ") + std::to_string(splits.size()) +
                                                 " " + which + " split sizes for " +
                                                 std::to_string(size) + " ranks");
        }
        std::size_t total = 0;
        for (std::size_t r = 0; r < size; ++r) {
          counts[r] = static_cast<std::size_t>(splits[r]) * row_bytes;
          total += static_cast<std::size_t>(splits[r]);
        }
        if (total != rows) {
          throw_invalid("all_to_all_single", std::string("has ") + which +
                                                 " split sizes summing to " +
                                                 std::to_string(total) + ", not the " +
                                                 std::to_string(rows) + " rows of the " + which);
        }
      }
      return counts;
    };
    return alltoall_bytes(c10d::OpType::ALLTOALL_BASE, {output}, input.contiguous(),
                          byte_counts(input, input_splits, "input"), output,
                          byte_counts(output, output_splits, "output"), "all_to_all_single");
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    const std::size_t size = static_cast<std::size_t>(getSize());
    if (outputs.size() != size || inputs.size() != size) {
      throw_invalid("all_to_all",
                    "takes " + std::to_string(size) + " input and output tensors, not " +
                        std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
    }
    std::vector<std::size_t> send(size), received(size);
    std::vector<at::Tensor> flat_inputs, flat_outputs;
    for (std::size_t r = 0; r < size; ++r) {
      check_device(inputs[r], "all_to_all");
      check_device(outputs[r], "all_to_all");
      if (inputs[r].scalar_type() != inputs.front().scalar_type() ||
          outputs[r].scalar_type() != inputs.front().scalar_type()) {
        throw_invalid("all_to_all", "needs tensors of one dtype");
      }
      send[r] = inputs[r].nbytes();
      received[r] = outputs[r].nbytes();
      flat_inputs.push_back(inputs[r].reshape({-1}));
    }
    const at::Tensor input = at::cat(flat_inputs);
    std::int64_t total = 0;
    for (const at::Tensor& out : outputs) total += out.numel();
    const at::Tensor output = at::empty({total}, inputs.front().options());
    return alltoall_bytes(c10d::OpType::ALLTOALL, outputs, input, send, output, received,
                          "all_to_all", [outputs, output]() mutable {
                            std::size_t offset = 0;
                            for (at::Tensor& out : outputs) {
                              copy_bytes_into(out, output, offset);
                              offset += out.nbytes();
                            }
                          });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int peer,
                                      int tag) override {
    const at::Tensor& tensor = one_tensor(tensors, "send");
    check_peer(peer, tag, "send");
    auto buffer = std::make_shared<Buffer>(buffer_for(tensor));
    return issue(c10d::OpType::SEND, tensor.device(), {tensor}, [&, buffer] {
      return with_element(element_of(tensor), [&](auto element) {
        using T = decltype(element);
        return communicator_.isend(std::span<const T>(span_of<T>(buffer->tensor)), peer, tag);
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int peer,
                                      int tag) override {
    const at::Tensor& tensor = one_tensor(tensors, "recv");
    check_peer(peer, tag, "recv");
    auto buffer = std::make_shared<Buffer>(buffer_for(tensor));
    return issue(
        c10d::OpType::RECV, tensor.device(), {tensor},
        [&, buffer] {
          return with_element(element_of(tensor), [&](auto element) {
            using T = decltype(element);
            return communicator_.irecv(span_of<T>(buffer->tensor), peer, tag);
          });
        },
        copy_back_after(buffer));
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    throw_invalid("recv", "needs the source rank: coltrain matches messages by sender and tag");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return issue(c10d::OpType::BARRIER, at::Device(at::kCPU), {},
                 [&] { return communicator_.ibarrier(); });
  }

 private:
  using Issue = std::function<comm::Request()>;

  static comm::Communicator connect(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                    int size, std::chrono::milliseconds timeout) {
    comm::CommOptions options = comm::comm_options_from_env();
    // init_process_group's timeout, unless COLTRAIN_TIMEOUT says otherwise.
    if (comm::detail::nonempty_env("COLTRAIN_TIMEOUT") == nullptr && timeout.count() > 0) {
      options.timeout = timeout;
    }
    C10dStore adapter(store);
    return comm::tcp_over_store(adapter, rank, size, options);
  }

  [[noreturn]] void throw_invalid(const std::string& op, const std::string& what) const {
    TORCH_CHECK(false, "coltrain: rank ", getRank(), ": ", op, " ", what);
  }

  void check_device(const at::Tensor& tensor, const std::string& op) const {
    if (tensor.device().is_cpu() || (kWithCuda && tensor.device().is_cuda())) return;
    throw_invalid(op, "got a tensor on " + tensor.device().str() +
                          "; this build of coltrain_torch " +
                          (kWithCuda ? "takes CPU and CUDA tensors"
                                     : "takes CPU tensors (its PyTorch had no CUDA)"));
  }

  const at::Tensor& one_tensor(const std::vector<at::Tensor>& tensors,
                               const std::string& op) const {
    if (tensors.size() != 1) {
      throw_invalid(op, "takes one tensor per call, not " + std::to_string(tensors.size()));
    }
    check_device(tensors.front(), op);
    return tensors.front();
  }

  comm::ReduceOp reduce_op(const c10d::ReduceOp& op, const at::Tensor& tensor,
                           const std::string& name) const {
    const std::optional<comm::ReduceOp> ours = coltrain_op(op);
    if (!ours) {
      throw_invalid(name, std::string("does not support ReduceOp.") + op_name(op) +
                              "; coltrain reduces with SUM, AVG, PRODUCT, MIN and MAX");
    }
    if (tensor.is_complex() && *ours != comm::ReduceOp::kSum && *ours != comm::ReduceOp::kAvg) {
      throw_invalid(name, std::string("reduces ") + c10::toString(tensor.scalar_type()) +
                              " tensors with SUM and AVG only, not ReduceOp." + op_name(op));
    }
    if (element_of(tensor) == Element::kWords) {
      throw_invalid(name, "cannot reduce " + std::string(c10::toString(tensor.scalar_type())) +
                              " tensors; coltrain reduces float32, float64, float16, bfloat16, "
                              "int32 and int64");
    }
    return *ours;
  }

  int root_rank(std::int64_t root, const std::string& op) const {
    if (root < 0 || root >= getSize()) {
      throw_invalid(op, "root " + std::to_string(root) + " is outside a group of " +
                            std::to_string(getSize()) + " ranks");
    }
    return static_cast<int>(root);
  }

  void check_peer(int peer, int tag, const std::string& op) const {
    if (peer < 0 || peer >= getSize() || peer == getRank()) {
      throw_invalid(op, "cannot address rank " + std::to_string(peer) + " in a group of " +
                            std::to_string(getSize()) + " ranks");
    }
    if (tag < 0 || tag > comm::Communicator::kMaxTag) {
      throw_invalid(op, "takes tags from 0 to " + std::to_string(comm::Communicator::kMaxTag) +
                            ", not " + std::to_string(tag));
    }
  }

  // The one list of `size` blocks shaped like `block`, for the list forms of the collectives.
  std::vector<at::Tensor> block_list(const std::vector<std::vector<at::Tensor>>& lists,
                                     const at::Tensor& block, const std::string& op,
                                     const std::string& which) const {
    if (lists.size() != 1 || lists.front().size() != static_cast<std::size_t>(getSize())) {
      throw_invalid(op,
                    "takes one list of " + std::to_string(getSize()) + " " + which + " tensors");
    }
    for (const at::Tensor& tensor : lists.front()) {
      check_device(tensor, op);
      if (tensor.scalar_type() != block.scalar_type() || tensor.numel() != block.numel()) {
        throw_invalid(op, "needs every " + which + " tensor of the input's dtype and size (" +
                              std::to_string(block.numel()) + " elements)");
      }
    }
    return lists.front();
  }

  // `flat` holds `blocks` blocks of `block`'s dtype and size.
  void check_flat(const at::Tensor& flat, const at::Tensor& block, int blocks,
                  const std::string& op, const std::string& which) const {
    check_device(flat, op);
    if (flat.scalar_type() != block.scalar_type() || flat.numel() != blocks * block.numel()) {
      throw_invalid(op, "needs the " + which + " to hold " + std::to_string(blocks) + " x " +
                            std::to_string(block.numel()) + " elements of the other's dtype, not " +
                            std::to_string(flat.numel()));
    }
  }

  // alltoallv over byte counts: as the tensor's own elements, or as words when each count is a
  // whole number of words.
  c10::intrusive_ptr<c10d::Work> alltoall_bytes(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                const at::Tensor& input,
                                                const std::vector<std::size_t>& send_bytes,
                                                const at::Tensor& output,
                                                const std::vector<std::size_t>& receive_bytes,
                                                const std::string& op,
                                                std::function<void()> after = {}) {
    if (!output.is_contiguous()) throw_invalid(op, "needs a contiguous output");
    const Element element = element_of(input);
    const std::size_t unit = with_element(element, [](auto e) { return sizeof(e); });
    auto counts = std::make_shared<std::vector<std::size_t>>();
    for (const auto* bytes : {&send_bytes, &receive_bytes}) {
      std::size_t offset = 0;
      std::vector<std::size_t> displacements;
      for (std::size_t b : *bytes) {
        if (b % unit != 0) {
          throw_invalid(op, "moves " + std::string(c10::toString(input.scalar_type())) +
                                " blocks of whole 4-byte words only");
        }
        displacements.push_back(offset / unit);
        offset += b;
      }
      for (std::size_t b : *bytes) counts->push_back(b / unit);
      counts->insert(counts->end(), displacements.begin(), displacements.end());
    }
    auto kept = std::make_shared<std::pair<at::Tensor, at::Tensor>>(input, output);
    const std::size_t p = static_cast<std::size_t>(getSize());
    return issue(type, input.device(), std::move(outputs),
                 [&, counts, kept] {
                   return with_element(element, [&](auto e) {
                     using T = decltype(e);
                     const std::span<const std::size_t> all(*counts);
                     return communicator_.ialltoallv(std::span<const T>(span_of<T>(kept->first)),
                                                     all.subspan(0, p), all.subspan(p, p),
                                                     span_of<T>(kept->second),
                                                     all.subspan(2 * p, p), all.subspan(3 * p, p));
                   });
                 },
                 std::move(after), {kept->first, kept->second});
  }

  // allgather into `blocks` (one per rank, shaped like `input`); the Work holds `outputs`.
  c10::intrusive_ptr<c10d::Work> allgather_blocks(c10d::OpType type,
                                                  std::vector<at::Tensor> outputs,
                                                  std::vector<at::Tensor> blocks,
                                                  const at::Tensor& input) {
    auto buffer = std::make_shared<Buffer>(buffer_for(input));
    auto flat = std::make_shared<at::Tensor>(blocks_like(*buffer, getSize()));
    return issue(
        type, input.device(), std::move(outputs),
        [&, buffer, flat] {
          return with_element(element_of(input), [&](auto element) {
            using T = decltype(element);
            return communicator_.iallgather(std::span<const T>(span_of<T>(buffer->tensor)),
                                            span_of<T>(*flat));
          });
        },
        [blocks, flat, stride = buffer->tensor.nbytes()]() mutable {
          for (std::size_t r = 0; r < blocks.size(); ++r)
            copy_bytes_into(blocks[r], *flat, r * stride);
        },
        {buffer->tensor, *flat});
  }

  // reduce_scatter of the contiguous `input` (size() blocks) into `output`.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_flat(c10d::OpType type, at::Tensor input,
                                                     const at::Tensor& output, comm::ReduceOp op) {
    auto flat = std::make_shared<at::Tensor>(std::move(input));
    auto buffer = std::make_shared<Buffer>(buffer_for(output));
    return issue(type, output.device(), {output},
                 [&, buffer, flat] {
                   return with_element(element_of(output), [&](auto element) {
                     using T = decltype(element);
                     return communicator_.ireduce_scatter(std::span<const T>(span_of<T>(*flat)),
                                                          span_of<T>(buffer->tensor), op);
                   });
                 },
                 copy_back_after(buffer), {*flat, buffer->tensor});
  }

  // Issues the call (under the group's lock, so calls from several threads keep one order) and
  // queues its completion. The call and `after` keep the buffers they captured (staging copies,
  // flattened inputs) alive until the request is complete. `exchanged`: the CPU buffers whose
  // bytes go between the ranks both ways, which may be moved onto huge pages (HugePageInteriors).
  c10::intrusive_ptr<c10d::Work> issue(c10d::OpType type, const at::Device& device,
                                       std::vector<at::Tensor> outputs, Issue call,
                                       std::function<void()> after = {},
                                       const std::vector<at::Tensor>& exchanged = {}) {
    auto work = c10::make_intrusive<ColtrainWork>(getRank(), type, std::move(outputs));
    std::vector<std::shared_ptr<void>> loans;
    bool large = false;
    for (const at::Tensor& tensor : exchanged) {
      if (!tensor.device().is_cpu() || tensor.nbytes() < HugePageInteriors::kMinBytes) continue;
      large = true;
      if (auto loan = HugePageInteriors::instance().lend(tensor.data_ptr(), tensor.nbytes()))
        loans.push_back(std::move(loan));
    }
    std::vector<Pending> released;  // destroyed after the lock is let go
    const std::lock_guard lock(mutex_);
    released.swap(completed_);
#if COLTRAIN_TORCH_WITH_CUDA
    // Device tensors are staged through host memory after the work queued on PyTorch's current
    // stream (coltrain's staged calls wait for their caller's stream on the GPU); the request
    // completes once the result is in device memory.
    std::optional<c10::cuda::CUDAGuard> guard;
    if (device.is_cuda()) {
      guard.emplace(device);
      communicator_.set_stream(at::cuda::getCurrentCUDAStream(device.index()).stream());
    }
#else
    (void)device;
#endif
    Pending pending{comm::Request(),  work,  std::move(call), std::move(after), nullptr,
                    std::move(loans), large, clock::now()};
    try {
      pending.request = pending.call();
      if (!pending.after) work->done_with(pending.request);
    } catch (...) {
      pending.error = std::current_exception();
    }
    pending_.push_back(std::move(pending));
    queued_.notify_one();
    return work;
  }

  using clock = std::chrono::steady_clock;
  struct Pending {
    comm::Request request;
    c10::intrusive_ptr<ColtrainWork> work;
    Issue call;
    std::function<void()> after;
    std::exception_ptr error;
    std::vector<std::shared_ptr<void>> loans;  // interiors noted as huge pages for the call
    bool large = false;                        // with a tensor of HugePageInteriors::kMinBytes
    clock::time_point issued;
  };

  void complete_in_order() {
    for (;;) {
      Pending pending;
      {
        std::unique_lock lock(mutex_);
        queued_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
        if (pending_.empty()) return;
        pending = std::move(pending_.front());
        pending_.pop_front();
      }
      std::exception_ptr error = pending.error;
      if (!error) {
        try {
          pending.request.wait();
          if (pending.after) pending.after();
        } catch (...) {
          error = std::current_exception();
        }
      }
      if (pending.large) {
        HugePageInteriors::instance().served(
            std::chrono::duration<double>(clock::now() - pending.issued).count());
        pending.loans.clear();
      }
      pending.work->complete(error);
      // The completed call keeps its tensors (the Work's outputs, staging copies) until the next
      // call or the group's end releases them on a thread of the caller's: the last reference to
      // a tensor that Python let go of takes the GIL to free its Python object, which this thread
      // must not wait for (a Python thread holding the GIL may be waiting for this one) nor take
      // while the interpreter exits (the thread would be ended inside C++, and the process with
      // it).
      const std::lock_guard lock(mutex_);
      completed_.push_back(std::move(pending));
    }
  }

  comm::Communicator communicator_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Pending> pending_;
  std::vector<Pending> completed_;
  bool stopping_ = false;
  std::thread completer_;
};

}  // namespace coltrain_torch

namespace {

// PyTorch 1.13 allocates tensors on 4 KiB pages where the kernel's THP policy is "madvise"
// (Debian's default); between the ranks of a host their bytes then go through the shared-memory
// rings, since by default coltrain's single copy goes only where it paid on the machine it was
// built for: huge pages (CommOptions; a tuning file may say otherwise), and large allreduces lose
// it (docs/benchmarks.md). With COLTRAIN_TORCH_HUGE_PAGES=1 PyTorch's CPU
// allocations of 2 MiB and more are 2 MiB-aligned, advised as huge pages and noted as such for the
// transport, as PyTorch 2's THP_MEM_ALLOC_ENABLE=1 does (without the note); smaller ones are
// 64-byte aligned, as PyTorch's own: coltrain's allocate_uninitialized_host_memory. Every block is
// freed by one function, which PyTorch's raw_allocate/raw_deallocate need. Opt-in: it changes
// every later allocation of the process, not only the backend's.
class HugePageCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) const override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (bytes == 0) return {nullptr, nullptr, &coltrain::free_host_memory, cpu};
    void* memory = nullptr;
    try {
      memory = coltrain::allocate_uninitialized_host_memory(bytes, /*huge_pages=*/true);
    } catch (const std::bad_alloc&) {
      TORCH_CHECK(false, "coltrain: cannot allocate ", bytes,
                  " bytes (COLTRAIN_TORCH_HUGE_PAGES=1)");
    }
    return {memory, memory, &coltrain::free_host_memory, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &coltrain::free_host_memory; }
};

void use_huge_pages_if_asked() {
  if (coltrain_torch::torch_huge_pages_setting() != "1") return;
  static HugePageCpuAllocator allocator;
  c10::SetCPUAllocator(&allocator, /*priority=*/1);
}

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<coltrain_torch::ProcessGroupColtrain>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "coltrain's collectives as a torch.distributed backend";
  use_huge_pages_if_asked();
  module.def("create_process_group", &create_process_group, pybind11::arg("store"),
             pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"),
             pybind11::call_guard<pybind11::gil_scoped_release>(),
             "The backend's creator for torch.distributed.Backend.register_backend.");
  module.def(
      "launch_env",
      [] {
        const coltrain::LaunchEnv env = coltrain::detect_launch_env();
        pybind11::dict result;
        result["rank"] = env.rank;
        result["world_size"] = env.world_size;
        result["local_rank"] = env.local_rank;
        result["local_world_size"] =
            env.local_world_size ? pybind11::cast(*env.local_world_size) : pybind11::none();
        result["master_addr"] = env.master_addr;
        result["master_port"] = env.master_port;
        return result;
      },
      "Where this process sits in the job, read from the launcher's variables as coltrain reads "
      "them (torchrun, Kubeflow, Slurm, mpiexec of MPICH or Open MPI).");
}
