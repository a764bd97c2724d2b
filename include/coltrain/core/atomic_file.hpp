#pragma once
// Crash-safe file replacement, for checkpoints, run records and dataset files: the new contents go
// to a temporary file in the same directory, which is flushed to disk and renamed over the target,
// and then the directory is flushed so that the rename itself survives a power cut. Readers and
// crashes see the old file or the complete new one, never a mixture.
//
// The temporary file is ".<name>.tmp.<pid>.<n>" (<name> cut to 160 bytes, so that the temporary
// name stays within the filesystem's limit), created with O_EXCL: a name left by a crashed process
// of the same pid is skipped, never reused. A later cleanup recognises what an interrupted write
// left behind with is_atomic_write_temporary().

#include <coltrain/core/error.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace coltrain {

namespace detail {

inline std::string errno_message(int error) { return std::system_category().message(error); }

[[noreturn]] inline void fail_io(std::string_view operation, const std::filesystem::path& file,
                                 const std::string& message) {
  ErrorContext context;
  context.operation = std::string(operation);
  context.file = file.string();
  throw IoError(message, context);
}

// Writes all of `bytes` to `fd`, retrying short writes and EINTR; returns 0 or the errno.
inline int write_all(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t wrote = ::write(fd, bytes.data(), bytes.size());
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) return errno;
    bytes = bytes.subspan(static_cast<std::size_t>(wrote));
  }
  return 0;
}

inline std::filesystem::path directory_of(const std::filesystem::path& file) {
  return file.parent_path().empty() ? std::filesystem::path(".") : file.parent_path();
}

inline constexpr std::size_t kTemporaryStemBytes = 160;
inline constexpr std::string_view kTemporaryMarker = ".tmp.";

// Flushes a directory's entries; returns 0 or the errno. Some filesystems cannot sync a directory
// (EINVAL, EROFS, ENOTSUP): there is nothing more to do there, so that is success.
inline int sync_directory_errno(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int error = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return error == EINVAL || error == EROFS || error == ENOTSUP ? 0 : error;
}

}  // namespace detail

// Flushes a directory's entries (renames, creations, removals) to disk. Throws IoError naming the
// directory when it cannot be opened or flushed.
inline void sync_directory(const std::filesystem::path& directory) {
  if (const int error = detail::sync_directory_errno(directory); error != 0) {
    detail::fail_io("sync directory", directory,
                    "cannot flush the directory: " + detail::errno_message(error));
  }
}

// Whether `name` (a file name without its directory) is the temporary file of a write to a target
// whose name starts with `prefix`: what a write interrupted by a crash leaves behind.
inline bool is_atomic_write_temporary(std::string_view name, std::string_view prefix) {
  auto drop_number = [&name] {
    const std::size_t keep = name.find_last_not_of("0123456789") + 1;  // npos + 1 == 0
    const bool found = keep < name.size();
    name = name.substr(0, keep);
    return found;
  };
  if (!name.starts_with('.')) return false;
  name.remove_prefix(1);
  if (!drop_number() || !name.ends_with('.')) return false;
  name.remove_suffix(1);
  if (!drop_number() || !name.ends_with(detail::kTemporaryMarker)) return false;
  name.remove_suffix(detail::kTemporaryMarker.size());
  return !name.empty() && name.starts_with(prefix);
}

// Replaces a file atomically (see the top of this header), written in pieces: construct, write(),
// then commit(). Until commit() returns the target is untouched; a writer destroyed before, or a
// failed write() or commit(), removes its temporary file. Errors are IoError naming the target,
// the temporary file, what failed and why, under the caller's `operation`.
class AtomicFileWriter {
 public:
  // Creates the temporary file next to `file`.
  explicit AtomicFileWriter(std::filesystem::path file, std::string operation = "write file")
      : file_(std::move(file)), operation_(std::move(operation)) {
    static std::atomic<unsigned> counter{0};
    const std::string stem = file_.filename().string().substr(0, detail::kTemporaryStemBytes);
    int error = 0;
    for (int attempt = 0; attempt < 100; ++attempt) {
      temporary_ = detail::directory_of(file_) /
                   ("." + stem + std::string(detail::kTemporaryMarker) +
                    std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)));
      // 0666 as for any new file: the umask decides.
      fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0) return;
      error = errno;
      if (error != EEXIST) break;
    }
    detail::fail_io(operation_, file_,
                    "cannot create temporary file " + temporary_.string() + ": " +
                        detail::errno_message(error));
  }
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter() { abandon(); }

  const std::filesystem::path& path() const { return file_; }
  const std::filesystem::path& temporary_path() const { return temporary_; }

  // Appends to the temporary file.
  void write(std::span<const std::byte> bytes) {
    require_pending("write");
    if (const int error = detail::write_all(fd_, bytes); error != 0) fail("write", error);
  }
  void write(std::string_view text) { write(std::as_bytes(std::span(text.data(), text.size()))); }

  // Flushes the temporary file to disk, renames it over the target and flushes the directory. When
  // only the directory flush fails, the new file is in place and the IoError says so.
  void commit() {
    require_pending("commit");
    if (::fsync(fd_) != 0) fail("flush", errno);
    // close() can report a deferred write error (network filesystems).
    if (::close(std::exchange(fd_, -1)) != 0) fail("close", errno);
    if (::rename(temporary_.c_str(), file_.c_str()) != 0) fail("rename", errno, " into place");
    pending_ = false;
    const std::filesystem::path directory = detail::directory_of(file_);
    if (const int error = detail::sync_directory_errno(directory); error != 0) {
      detail::fail_io(operation_, file_,
                      "the file is in place, but its directory " + directory.string() +
                          " cannot be flushed: " + detail::errno_message(error));
    }
  }

 private:
  void abandon() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    if (pending_) ::unlink(temporary_.c_str());
    pending_ = false;
  }

  [[noreturn]] void fail(std::string_view what, int error, std::string_view how = {}) {
    abandon();
    detail::fail_io(operation_, file_,
                    "cannot " + std::string(what) + " temporary file " + temporary_.string() +
                        std::string(how) + ": " + detail::errno_message(error));
  }

  // After a failure the temporary file is gone: writing on would commit a file with a hole.
  void require_pending(std::string_view what) const {
    if (!pending_) {
      ErrorContext context;
      context.operation = operation_;
      context.file = file_.string();
      throw InvalidArgument(
          "cannot " + std::string(what) + ": this atomic write was already committed or has failed",
          context);
    }
  }

  std::filesystem::path file_;
  std::string operation_;
  std::filesystem::path temporary_{};
  int fd_ = -1;
  bool pending_ = true;  // the temporary file exists and is not yet renamed into place
};

// Replaces `file` with `contents` atomically and durably (see AtomicFileWriter).
inline void write_file_atomically(const std::filesystem::path& file,
                                  std::span<const std::byte> contents,
                                  std::string operation = "write file") {
  AtomicFileWriter writer(file, std::move(operation));
  writer.write(contents);
  writer.commit();
}

inline void write_file_atomically(const std::filesystem::path& file, std::string_view contents,
                                  std::string operation = "write file") {
  write_file_atomically(file, std::as_bytes(std::span(contents.data(), contents.size())),
                        std::move(operation));
}

}  // namespace coltrain
