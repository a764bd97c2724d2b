#pragma once
// coltrain's exceptions. Each carries the context an HPC user needs to find the fault in a job of
// many ranks: which rank, which peer, which operation and its sequence number, which file and
// offset. The check macros at the end turn MPI, CUDA, cuBLAS, cuDNN and NCCL return codes into
// BackendError with the library's own message and the file:line of the call.

#include <coltrain/core/config.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace coltrain {

// Where an error happened. Only the fields that are set are printed.
struct ErrorContext {
  std::optional<int> rank;
  std::optional<int> peer;
  std::string operation;                  // "allreduce", "connect", "read IDX header"...
  std::optional<std::uint64_t> sequence;  // the collective's sequence number on its communicator
  std::string file;                       // a data file, or the source file of a failed call
  std::optional<std::uint64_t> offset;    // byte offset in `file` (data files)
  std::optional<int> line;                // source line (failed library calls)
};

namespace detail {

// "rank 3, peer 1, operation allreduce, sequence #12": the fields of `c` that are set.
COLTRAIN_DECL std::string describe(const ErrorContext& c);

// "coltrain: <message> [<describe(c)>]", what() of every coltrain exception.
COLTRAIN_DECL std::string format_error(const std::string& message, const ErrorContext& c);

}  // namespace detail

// Base of every exception coltrain throws. what() is the message followed by the context.
class Error : public std::runtime_error {
 public:
  explicit Error(std::string message, ErrorContext context = {})
      : std::runtime_error(detail::format_error(message, context)),
        message_(std::move(message)),
        context_(std::move(context)) {}

  // The message alone, without the bracketed context.
  const std::string& message() const noexcept { return message_; }
  const ErrorContext& context() const noexcept { return context_; }

 private:
  std::string message_;
  ErrorContext context_;
};

// The launch environment or the build configuration is wrong (missing or conflicting variables).
class ConfigError : public Error {
  using Error::Error;
};

// An argument to a coltrain function is invalid (wrong size, unknown name, out of range).
class InvalidArgument : public Error {
  using Error::Error;
};

// A file could not be opened, read or written, or its contents are malformed; names the file and
// offset.
class IoError : public Error {
  using Error::Error;
};

// Communication failed. Subclasses say how; the context names the rank, peer, operation and
// sequence.
class CommError : public Error {
  using Error::Error;
};

// A wait passed its deadline (COLTRAIN_TIMEOUT).
class TimeoutError : public CommError {
  using CommError::CommError;
};

// A peer closed or reset its connection, or its process died.
class PeerLostError : public CommError {
  using CommError::CommError;
};

// Ranks called different collectives, counts or dtypes, or a peer spoke the wrong protocol.
class MismatchError : public CommError {
  using CommError::CommError;
};

// A call into MPI, CUDA, cuBLAS, cuDNN or NCCL returned an error code.
class BackendError : public Error {
 public:
  BackendError(std::string library, long code, std::string message, ErrorContext context = {})
      : Error(library + " error " + std::to_string(code) + ": " + message, std::move(context)),
        library_(std::move(library)),
        code_(code) {}

  const std::string& library() const noexcept { return library_; }
  long code() const noexcept { return code_; }

 private:
  std::string library_;
  long code_;
};

namespace detail {

// Throws BackendError for a failed library call (the check macros below).
[[noreturn]] COLTRAIN_DECL void throw_backend_error(const char* library, long code,
                                                    const std::string& reason, const char* call,
                                                    const char* file, int line);

}  // namespace detail
}  // namespace coltrain

// The check macros expand at the call site, where the library's own header is already included, so
// this header needs none of them. Each evaluates its argument exactly once; the call is quoted as
// written, before its macros (MPI_COMM_WORLD...) expand.

// Shared body: unless `call` returned `success`, throws BackendError with `describe(status)` as the
// library's message.
#define COLTRAIN_DETAIL_CHECK(library, call, call_text, success, describe)                     \
  do {                                                                                         \
    const auto coltrain_status_ = (call);                                                      \
    if (coltrain_status_ != (success)) {                                                       \
      ::coltrain::detail::throw_backend_error(library, static_cast<long>(coltrain_status_),    \
                                              describe(coltrain_status_), call_text, __FILE__, \
                                              __LINE__);                                       \
    }                                                                                          \
  } while (0)

#define COLTRAIN_CHECK_MPI(call)                                          \
  COLTRAIN_DETAIL_CHECK("MPI", call, #call, MPI_SUCCESS, [](int status) { \
    char text[MPI_MAX_ERROR_STRING];                                      \
    int length = 0;                                                       \
    MPI_Error_string(status, text, &length);                              \
    return std::string(text, length);                                     \
  })

#define COLTRAIN_CHECK_CUDA(call)                                                           \
  COLTRAIN_DETAIL_CHECK("CUDA", call, #call, cudaSuccess, [](cudaError_t status) {          \
    return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")"; \
  })

// After a kernel launch: reports launch-configuration errors at the line of the launch.
#define COLTRAIN_CHECK_CUDA_LAUNCH() COLTRAIN_CHECK_CUDA(cudaGetLastError())

#define COLTRAIN_CHECK_CUBLAS(call) \
  COLTRAIN_DETAIL_CHECK("cuBLAS", call, #call, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)

#define COLTRAIN_CHECK_CUDNN(call) \
  COLTRAIN_DETAIL_CHECK("cuDNN", call, #call, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)

// NCCL's nonblocking communicators return ncclInProgress from calls still running; code that uses
// them checks for it before this macro.
#define COLTRAIN_CHECK_NCCL(call) \
  COLTRAIN_DETAIL_CHECK("NCCL", call, #call, ncclSuccess, ncclGetErrorString)

#if !COLTRAIN_SEPARATE_COMPILATION
#include <coltrain/core/impl/error.ipp>
#endif
