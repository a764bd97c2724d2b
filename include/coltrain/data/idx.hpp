#pragma once
// IDX files, the format of MNIST (and Fashion-MNIST, KMNIST...): a big-endian u32 magic number
// 0x00000803 (unsigned bytes, 3 dimensions: images) or 0x00000801 (1 dimension: labels), a u32
// count, for images u32 rows and u32 cols, then the bytes row-major. Pixels start at byte 16,
// labels at byte 8. Raw or gzip-compressed (the official files are gzipped).
//
// Every header field and the exact payload length are checked; an error names the file, the byte
// offset (in the decompressed data for a gzip file) and what was expected there.

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/data/file_io.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coltrain::data {

inline constexpr std::uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;
inline constexpr std::size_t kIdxImagesHeaderBytes = 16;
inline constexpr std::size_t kIdxLabelsHeaderBytes = 8;

// The images of an IDX file: `count` images of rows x cols bytes, one after the other.
struct IdxImages {
  std::int64_t count = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::uint8_t> pixels;
};

namespace detail {

inline std::uint32_t load_be32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 |
         std::uint32_t{p[3]};
}

inline void store_be32(std::uint8_t* p, std::uint32_t value) {
  p[0] = static_cast<std::uint8_t>(value >> 24);
  p[1] = static_cast<std::uint8_t>(value >> 16);
  p[2] = static_cast<std::uint8_t>(value >> 8);
  p[3] = static_cast<std::uint8_t>(value);
}

inline std::string count_of_bytes(std::uint64_t n) {
  return std::to_string(n) + (n == 1 ? " byte" : " bytes");
}

inline std::string hex32(std::uint32_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) text += kDigits[(value >> shift) & 0xf];
  return text;
}

// Reads a file for one IDX parser and reports its faults with the file, the offset and what was
// expected there.
class IdxParser {
 public:
  IdxParser(const std::filesystem::path& file, const char* operation)
      : file_(file), operation_(operation), contents_(read_file(file)) {}

  std::span<const std::uint8_t> bytes() const { return contents_.bytes; }

  // The bytes after the header, taken out of the parser.
  std::vector<std::uint8_t> take_payload(std::size_t header_bytes) {
    std::vector<std::uint8_t> payload = std::move(contents_.bytes);
    payload.erase(payload.begin(), payload.begin() + static_cast<std::ptrdiff_t>(header_bytes));
    return payload;
  }

  [[noreturn]] void fail(const std::string& message, std::uint64_t offset) const {
    throw IoError(contents_.gzip ? message + " (offsets count decompressed bytes)" : message,
                  file_context(file_, operation_, offset));
  }

  // The header: the magic number, then `fields` u32 values.
  std::vector<std::uint32_t> header(std::uint32_t magic, int fields, const char* kind,
                                    const char* other_kind) const {
    const std::size_t header_bytes = 4 + 4 * static_cast<std::size_t>(fields);
    const std::span<const std::uint8_t> b = bytes();
    if (b.size() < 4) {
      fail("expected an IDX " + std::string(kind) + " header of " + std::to_string(header_bytes) +
               " bytes, the file ends after " + count_of_bytes(b.size()),
           0);
    }
    const std::uint32_t found = load_be32(b.data());
    if (found != magic) {
      const std::uint32_t other = magic == kIdxImagesMagic ? kIdxLabelsMagic : kIdxImagesMagic;
      fail("expected the IDX " + std::string(kind) + " magic number " + hex32(magic) + ", found " +
               hex32(found) +
               (found == other ? std::string(" (an IDX ") + other_kind + " file)" : ""),
           0);
    }
    if (b.size() < header_bytes) {
      fail("expected an IDX " + std::string(kind) + " header of " + std::to_string(header_bytes) +
               " bytes, the file ends after " + count_of_bytes(b.size()),
           b.size());
    }
    std::vector<std::uint32_t> values;
    for (int i = 0; i < fields; ++i) values.push_back(load_be32(b.data() + 4 + 4 * i));
    return values;
  }

  // The payload after the header must be exactly `expected` bytes.
  void check_payload(std::size_t header_bytes, std::uint64_t expected,
                     const std::string& what) const {
    const std::uint64_t present = bytes().size() - header_bytes;
    if (present < expected) {
      fail("expected " + std::to_string(expected) + " bytes of " + what + ", the file ends after " +
               std::to_string(present) + " (truncated file?)",
           header_bytes);
    }
    if (present > expected) {
      fail("expected the file to end after " + std::to_string(expected) + " bytes of " + what +
               ", found " + count_of_bytes(present - expected) + " more",
           header_bytes + expected);
    }
  }

 private:
  std::filesystem::path file_;
  const char* operation_;
  FileContents contents_;
};

inline std::vector<std::uint8_t> idx_header(std::initializer_list<std::uint32_t> fields) {
  std::vector<std::uint8_t> bytes(4 * fields.size());
  std::size_t at = 0;
  for (const std::uint32_t value : fields) {
    store_be32(bytes.data() + at, value);
    at += 4;
  }
  return bytes;
}

inline void check_idx_u32(std::int64_t value, const char* what, const char* operation,
                          const std::filesystem::path& file) {
  if (value < 0 || value > std::numeric_limits<std::uint32_t>::max()) {
    throw InvalidArgument(
        std::string(what) + " " + std::to_string(value) + " does not fit an IDX header's u32 field",
        file_context(file, operation));
  }
}

}  // namespace detail

// Reads an IDX images file (raw or gzip). Rows and columns must be positive; MNIST's 28 x 28 is
// checked by load_mnist, not here.
inline IdxImages read_idx_images(const std::filesystem::path& file) {
  detail::IdxParser parser(file, "read IDX images");
  const std::vector<std::uint32_t> h = parser.header(kIdxImagesMagic, 3, "images", "labels");
  IdxImages images;
  images.count = h[0];
  images.rows = h[1];
  images.cols = h[2];
  if (images.rows == 0) parser.fail("expected a positive number of rows, found 0", 8);
  if (images.cols == 0) parser.fail("expected a positive number of columns, found 0", 12);
  // At most 2^32 x 2^64: checked before multiplying.
  const std::uint64_t image_bytes = std::uint64_t{h[1]} * h[2];
  if (image_bytes != 0 && h[0] > std::numeric_limits<std::uint64_t>::max() / image_bytes) {
    parser.fail("the image count times rows x columns overflows 64 bits", 4);
  }
  parser.check_payload(kIdxImagesHeaderBytes, image_bytes * h[0],
                       "pixels (" + std::to_string(h[0]) + " images of " + std::to_string(h[1]) +
                           " x " + std::to_string(h[2]) + ")");
  images.pixels = parser.take_payload(kIdxImagesHeaderBytes);
  return images;
}

// Reads an IDX labels file (raw or gzip); every label must be below `num_classes`.
inline std::vector<std::uint8_t> read_idx_labels(const std::filesystem::path& file,
                                                 int num_classes = 10) {
  detail::IdxParser parser(file, "read IDX labels");
  const std::vector<std::uint32_t> h = parser.header(kIdxLabelsMagic, 1, "labels", "images");
  parser.check_payload(kIdxLabelsHeaderBytes, h[0], "labels (" + std::to_string(h[0]) + " items)");
  std::vector<std::uint8_t> labels = parser.take_payload(kIdxLabelsHeaderBytes);
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      parser.fail("label " + std::to_string(labels[i]) + " of item " + std::to_string(i) +
                      " is not below the number of classes, " + std::to_string(num_classes),
                  kIdxLabelsHeaderBytes + i);
    }
  }
  return labels;
}

// Writes `pixels` (whole images of rows x cols bytes) as an IDX images file, atomically.
inline void write_idx_images(const std::filesystem::path& file, std::int64_t rows,
                             std::int64_t cols, std::span<const std::uint8_t> pixels,
                             Compression compression = Compression::kNone) {
  constexpr const char* kOperation = "write IDX images";
  if (rows <= 0 || cols <= 0) {
    throw InvalidArgument("images of " + std::to_string(rows) + " x " + std::to_string(cols) +
                              ": rows and columns must be positive",
                          detail::file_context(file, kOperation));
  }
  detail::check_idx_u32(rows, "rows", kOperation, file);
  detail::check_idx_u32(cols, "columns", kOperation, file);
  const auto image_bytes = static_cast<std::size_t>(rows * cols);
  if (pixels.size() % image_bytes != 0) {
    throw InvalidArgument(std::to_string(pixels.size()) + " pixels are not a whole number of " +
                              std::to_string(rows) + " x " + std::to_string(cols) + " images",
                          detail::file_context(file, kOperation));
  }
  const auto count = static_cast<std::int64_t>(pixels.size() / image_bytes);
  detail::check_idx_u32(count, "image count", kOperation, file);
  std::vector<std::uint8_t> bytes =
      detail::idx_header({kIdxImagesMagic, static_cast<std::uint32_t>(count),
                          static_cast<std::uint32_t>(rows), static_cast<std::uint32_t>(cols)});
  bytes.insert(bytes.end(), pixels.begin(), pixels.end());
  write_file_atomically(file, bytes, compression);
}

// Writes `labels` as an IDX labels file, atomically.
inline void write_idx_labels(const std::filesystem::path& file,
                             std::span<const std::uint8_t> labels,
                             Compression compression = Compression::kNone) {
  detail::check_idx_u32(static_cast<std::int64_t>(labels.size()), "label count", "write IDX labels",
                        file);
  std::vector<std::uint8_t> bytes =
      detail::idx_header({kIdxLabelsMagic, static_cast<std::uint32_t>(labels.size())});
  bytes.insert(bytes.end(), labels.begin(), labels.end());
  write_file_atomically(file, bytes, compression);
}

}  // namespace coltrain::data
