#pragma once
// CudaGraph: a training step (forward, loss, backward, allreduce, optimizer) recorded once into a
// CUDA graph and then replayed with one launch, so that a small model's step costs one host call
// instead of hundreds of kernel launches. Everything the recorded work touches must stay where it
// was (same tensors, same batch size): run the step once eagerly first, so that every tensor, cuDNN
// plan and workspace has its final size before recording, and record again when
// device_memory_generation() (core/device_memory.hpp) has moved since.
//
//   step();                                                          // eager: sizes everything
//   auto graph = CudaGraph::capture(ctx.stream(), [&] { step(); });  // records, runs nothing
//   for (...) graph.replay(ctx.stream());

#include <coltrain/core/config.hpp>

#if !COLTRAIN_WITH_CUDA
#error "coltrain/train/cuda_graph.hpp needs CUDA (COLTRAIN_WITH_CUDA=1)"
#endif

#include <coltrain/core/error.hpp>

#include <cuda_runtime.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace coltrain::train {

class CudaGraph {
 public:
  // Records what `record()` queues on `stream` (not the legacy default stream). The recording is
  // thread-local: other threads' CUDA calls go on as usual meanwhile. If record() throws, the
  // capture is ended and the exception passes on.
  template <class F>
  static CudaGraph capture(cudaStream_t stream, F&& record) {
    if (stream == nullptr)
      throw InvalidArgument("CudaGraph::capture: the legacy default stream cannot be captured");
    COLTRAIN_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      std::forward<F>(record)();
    } catch (...) {
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(stream, &partial);
      if (partial != nullptr) cudaGraphDestroy(partial);
      throw;
    }
    cudaGraph_t graph = nullptr;
    COLTRAIN_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    GraphHandle owned(graph);
    cudaGraphExec_t exec = nullptr;
    COLTRAIN_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    // Upload now, so that the first replay costs what every later one does.
    COLTRAIN_CHECK_CUDA(cudaGraphUpload(exec, stream));
    return CudaGraph(std::move(owned), ExecHandle(exec));
  }

  // Queues one run of the recorded work on `stream`.
  void replay(cudaStream_t stream) const {
    COLTRAIN_CHECK_CUDA(cudaGraphLaunch(exec_.get(), stream));
  }

  // Kernel, copy and other nodes in the graph, for logs.
  std::size_t node_count() const {
    std::size_t count = 0;
    COLTRAIN_CHECK_CUDA(cudaGraphGetNodes(graph_.get(), nullptr, &count));
    return count;
  }

 private:
  struct GraphDestroy {
    void operator()(cudaGraph_t graph) const { cudaGraphDestroy(graph); }
  };
  struct ExecDestroy {
    void operator()(cudaGraphExec_t exec) const { cudaGraphExecDestroy(exec); }
  };
  using GraphHandle = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDestroy>;
  using ExecHandle = std::unique_ptr<std::remove_pointer_t<cudaGraphExec_t>, ExecDestroy>;

  CudaGraph(GraphHandle graph, ExecHandle exec)
      : graph_(std::move(graph)), exec_(std::move(exec)) {}

  GraphHandle graph_;
  ExecHandle exec_;
};

}  // namespace coltrain::train
