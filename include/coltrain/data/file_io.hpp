#pragma once
// Whole-file I/O for dataset files: reading with transparent gzip decompression (recognised by the
// gzip magic bytes 1f 8b, not by the file name) and atomic writing, optionally gzip-compressed.
// Dataset files are small enough to hold in memory (MNIST's largest is 47 MB decompressed), and
// holding them whole lets the format readers check every size before they copy anything.
//
// gzip goes through zlib (COLTRAIN_WITH_ZLIB, see core/config.hpp; programs link it with -lz or
// ZLIB::ZLIB). Without it a gzip file is a ConfigError that says so.

#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#if COLTRAIN_WITH_ZLIB
#include <zlib.h>
#endif

namespace coltrain::data {

enum class Compression {
  kNone,
  kGzip,  // level 9, no file name, modification time 0: the same bytes for the same content
};

// A file's contents, decompressed when it was gzip data.
struct FileContents {
  std::vector<std::uint8_t> bytes;
  bool gzip = false;
};

namespace detail {

inline std::string errno_message(int error) { return std::system_category().message(error); }

inline ErrorContext file_context(const std::filesystem::path& file, std::string operation,
                                 std::optional<std::uint64_t> offset = std::nullopt) {
  ErrorContext c;
  c.operation = std::move(operation);
  c.file = file.string();
  c.offset = offset;
  return c;
}

// Closes a file descriptor on scope exit.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { ::close(fd_); }

 private:
  int fd_;
};

inline std::vector<std::uint8_t> read_raw_file(const std::filesystem::path& file) {
  auto fail = [&](const std::string& message, std::optional<std::uint64_t> offset = {}) {
    throw IoError(message, file_context(file, "read", offset));
  };
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open: " + errno_message(errno));
  FileDescriptor guard(fd);
  struct stat info {};
  if (::fstat(fd, &info) != 0) fail("cannot stat: " + errno_message(errno));
  if (!S_ISREG(info.st_mode)) fail("not a regular file");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(info.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail("read failed: " + errno_message(errno), done);
    if (got == 0) fail("file shrank while being read", done);
    done += static_cast<std::size_t>(got);
  }
  return bytes;
}

inline bool is_gzip(std::span<const std::uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

[[noreturn]] inline void throw_no_zlib(const std::filesystem::path& file, const char* operation) {
  throw ConfigError(
      "the file is gzip-compressed but coltrain was built without zlib (COLTRAIN_WITH_ZLIB=0); "
      "install zlib (Debian: zlib1g-dev) and rebuild linking -lz, or gunzip the file",
      file_context(file, operation));
}

#if COLTRAIN_WITH_ZLIB
// zlib counts in uInt (32 bits): larger buffers go through in pieces.
inline constexpr std::size_t kZlibChunk = std::size_t{1} << 30;

// Decompresses every gzip member of `compressed` (concatenated members are one stream, as gunzip
// reads them). Offsets in errors count compressed bytes.
inline std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> compressed,
                                        const std::filesystem::path& file) {
  z_stream stream{};
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK)
    throw IoError("zlib could not start decompressing", file_context(file, "gunzip"));
  struct End {
    z_stream& s;
    ~End() { inflateEnd(&s); }
  } end{stream};

  // The trailer's ISIZE (the size modulo 2^32) is only a hint: the output grows as needed. Deflate
  // expands at most 1032-fold, which bounds what a corrupt trailer can make us reserve.
  std::vector<std::uint8_t> out;
  if (compressed.size() >= 18) {
    const std::uint8_t* t = compressed.data() + compressed.size() - 4;
    const std::uint32_t isize = std::uint32_t{t[0]} | std::uint32_t{t[1]} << 8 |
                                std::uint32_t{t[2]} << 16 | std::uint32_t{t[3]} << 24;
    out.reserve(std::min<std::size_t>(isize, compressed.size() * 1032));
  }
  std::size_t in_done = 0, out_done = 0;
  for (;;) {
    if (out_done == out.size()) out.resize(std::max<std::size_t>(out.size() * 2, 1 << 16));
    const std::size_t in_chunk = std::min(compressed.size() - in_done, kZlibChunk);
    const std::size_t out_chunk = std::min(out.size() - out_done, kZlibChunk);
    // zlib's interface is not const-correct; it never writes through next_in.
    stream.next_in = const_cast<Bytef*>(compressed.data() + in_done);
    stream.avail_in = static_cast<uInt>(in_chunk);
    stream.next_out = out.data() + out_done;
    stream.avail_out = static_cast<uInt>(out_chunk);
    const int status = inflate(&stream, Z_NO_FLUSH);
    in_done += in_chunk - stream.avail_in;
    out_done += out_chunk - stream.avail_out;
    if (status == Z_STREAM_END) {
      if (in_done == compressed.size()) break;
      if (!is_gzip(compressed.subspan(in_done))) {
        throw IoError(std::to_string(compressed.size() - in_done) +
                          " bytes after the end of the gzip data that are not another gzip member",
                      file_context(file, "gunzip", in_done));
      }
      inflateReset(&stream);
    } else if (status == Z_BUF_ERROR && in_done == compressed.size()) {
      throw IoError("the gzip data ends before its end-of-stream marker (truncated file?); " +
                        std::to_string(out_done) + " bytes decompressed so far",
                    file_context(file, "gunzip", in_done));
    } else if (status != Z_OK && status != Z_BUF_ERROR) {
      throw IoError(
          std::string("corrupt gzip data: ") +
              (stream.msg != nullptr ? stream.msg : "zlib error " + std::to_string(status)),
          file_context(file, "gunzip", in_done));
    }
  }
  out.resize(out_done);
  out.shrink_to_fit();
  return out;
}

inline std::vector<std::uint8_t> gzip(std::span<const std::uint8_t> data,
                                      const std::filesystem::path& file) {
  z_stream stream{};
  if (deflateInit2(&stream, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw IoError("zlib could not start compressing", file_context(file, "gzip"));
  struct End {
    z_stream& s;
    ~End() { deflateEnd(&s); }
  } end{stream};
  std::vector<std::uint8_t> out(std::max<std::size_t>(data.size() / 2, 1 << 16));
  std::size_t in_done = 0, out_done = 0;
  for (;;) {
    if (out_done == out.size()) out.resize(out.size() * 2);
    const std::size_t in_chunk = std::min(data.size() - in_done, kZlibChunk);
    const std::size_t out_chunk = std::min(out.size() - out_done, kZlibChunk);
    stream.next_in = const_cast<Bytef*>(data.data() + in_done);
    stream.avail_in = static_cast<uInt>(in_chunk);
    stream.next_out = out.data() + out_done;
    stream.avail_out = static_cast<uInt>(out_chunk);
    const bool last = in_done + in_chunk == data.size();
    const int status = deflate(&stream, last ? Z_FINISH : Z_NO_FLUSH);
    in_done += in_chunk - stream.avail_in;
    out_done += out_chunk - stream.avail_out;
    if (status == Z_STREAM_END) break;
    if (status != Z_OK && status != Z_BUF_ERROR)
      throw IoError("zlib error " + std::to_string(status) + " while compressing",
                    file_context(file, "gzip"));
  }
  out.resize(out_done);
  return out;
}
#endif

}  // namespace detail

// Reads a whole file; gzip data (magic bytes 1f 8b) is decompressed.
inline FileContents read_file(const std::filesystem::path& file) {
  FileContents contents{detail::read_raw_file(file), false};
  if (detail::is_gzip(contents.bytes)) {
#if COLTRAIN_WITH_ZLIB
    contents.bytes = detail::gunzip(contents.bytes, file);
    contents.gzip = true;
#else
    detail::throw_no_zlib(file, "read");
#endif
  }
  return contents;
}

// Replaces `file` with `data`, gzip-compressed if asked, atomically (core/atomic_file.hpp):
// readers and crashes see the old file or the complete new one, never a part. On failure `file` is
// untouched and the temporary file removed.
inline void write_file_atomically(const std::filesystem::path& file,
                                  std::span<const std::uint8_t> data,
                                  Compression compression = Compression::kNone) {
  std::vector<std::uint8_t> compressed;
  if (compression == Compression::kGzip) {
#if COLTRAIN_WITH_ZLIB
    compressed = detail::gzip(data, file);
    data = compressed;
#else
    detail::throw_no_zlib(file, "write");
#endif
  }
  coltrain::write_file_atomically(file, std::as_bytes(data));
}

}  // namespace coltrain::data
