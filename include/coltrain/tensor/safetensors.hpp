#pragma once
// safetensors files (Hugging Face's checkpoint format, what PyTorch parity scripts and checkpoints
// exchange): an 8-byte little-endian header length N, N bytes of JSON describing each tensor
// (dtype, shape, byte range), then the tensors' bytes back to back.
//
// The header is untrusted input, so the reader checks every field and every byte range before
// anything is used, and a malformed file is an IoError that says what is wrong, in which tensor,
// in which file and, where it helps, at which byte offset. The writer replaces files atomically, so
// an interrupted checkpoint never leaves a half-written file under the real name.

#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <ranges>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

// Tensor bytes are copied between the file and memory unchanged; the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "coltrain: safetensors I/O assumes a little-endian host");

namespace coltrain::tensor {

// One tensor of a safetensors file. begin and end are byte offsets into the data section (the
// bytes after the header), as in the file's data_offsets.
struct SafetensorsEntry {
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<std::int64_t> shape;  // [] for a scalar
  std::uint64_t begin = 0, end = 0;

  // Product of the shape; 1 for a scalar, 0 when any dimension is 0.
  std::size_t numel() const {
    std::size_t count = 1;
    for (const std::int64_t dim : shape) count *= static_cast<std::size_t>(dim);
    return count;
  }
};

namespace detail {

// The reference implementation's limit: a larger header is a corrupt or hostile file.
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
inline constexpr std::string_view kSafetensorsMetadataKey = "__metadata__";

constexpr std::string_view safetensors_dtype_name(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "F32";
    case DataType::kFloat64:
      return "F64";
    case DataType::kFloat16:
      return "F16";
    case DataType::kBFloat16:
      return "BF16";
    case DataType::kInt32:
      return "I32";
    case DataType::kInt64:
      return "I64";
    case DataType::kUInt8:
      return "U8";
  }
  return "invalid";
}

inline std::optional<DataType> parse_safetensors_dtype(std::string_view text) {
  for (const DataType type : kAllDataTypes) {
    if (safetensors_dtype_name(type) == text) return type;
  }
  return std::nullopt;
}

// dtypes the format defines but coltrain has no element type for: named as such in errors, so a
// user knows the file is fine and coltrain is the limit.
inline bool is_other_safetensors_dtype(std::string_view text) {
  constexpr std::string_view kOthers[] = {"BOOL",    "I8",      "I16",     "U16",     "U32",
                                          "U64",     "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3",
                                          "F6_E3M2", "F4",      "C64"};
  return std::ranges::find(kOthers, text) != std::ranges::end(kOthers);
}

inline std::string safetensors_supported_dtypes() {
  std::string list;
  for (const DataType type : kAllDataTypes) {
    if (!list.empty()) list += ", ";
    list += safetensors_dtype_name(type);
  }
  return list;
}

inline std::string format_shape(std::span<const std::int64_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

// A name or JSON text from the file, cut short: the header may hold megabytes of it.
inline std::string quote(std::string_view text) {
  constexpr std::size_t kMax = 200;
  return "'" + std::string(text.substr(0, kMax)) + (text.size() > kMax ? "...'" : "'");
}

inline std::string brief(const Json& value) {
  constexpr std::size_t kMax = 200;
  std::string text = value.dump();
  if (text.size() > kMax) text = text.substr(0, kMax) + "...";
  return text;
}

inline std::string format_offsets(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// Element count of a shape, nullopt when it overflows 64 bits. Any zero dimension makes the count 0
// even when the other dimensions' product would overflow.
inline std::optional<std::uint64_t> checked_numel(std::span<const std::int64_t> shape) {
  if (std::ranges::find(shape, std::int64_t{0}) != shape.end()) return 0;
  std::uint64_t count = 1;
  for (const std::int64_t dim : shape) {
    const auto d = static_cast<std::uint64_t>(dim);
    if (count > std::numeric_limits<std::uint64_t>::max() / d) return std::nullopt;
    count *= d;
  }
  return count;
}

inline std::optional<std::uint64_t> checked_bytes(std::uint64_t numel, DataType type) {
  const std::uint64_t element = size_of(type);
  if (numel > std::numeric_limits<std::uint64_t>::max() / element) return std::nullopt;
  return numel * element;
}

inline std::string errno_text(int error) { return std::system_category().message(error); }

// Closes a POSIX file descriptor on scope exit.
class SafetensorsFd {
 public:
  explicit SafetensorsFd(int fd) : fd_(fd) {}
  SafetensorsFd(const SafetensorsFd&) = delete;
  SafetensorsFd& operator=(const SafetensorsFd&) = delete;
  ~SafetensorsFd() { ::close(fd_); }

 private:
  int fd_;
};

}  // namespace detail

// Reads a whole safetensors file into memory and validates it. Tensors are then read by name, as
// typed copies or as raw bytes.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::filesystem::path& file) : path_(file) {
    read_file();
    parse();
  }

  const std::filesystem::path& path() const { return path_; }
  // Ordered by their place in the data section.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  bool contains(std::string_view name) const { return index_.find(name) != index_.end(); }

  const SafetensorsEntry& entry(std::string_view name) const {
    const auto found = index_.find(name);
    if (found == index_.end()) {
      throw InvalidArgument(
          "no tensor '" + std::string(name) + "' in safetensors file " + path_.string(), context());
    }
    return entries_[found->second];
  }

  std::span<const std::byte> bytes(std::string_view name) const {
    const SafetensorsEntry& e = entry(name);
    return std::span<const std::byte>(data_.data() + data_start_ + e.begin, e.end - e.begin);
  }

  // T must be the tensor's element type exactly: a conversion here would hide a wrong checkpoint.
  template <class T>
  std::vector<T> read(std::string_view name) const {
    const SafetensorsEntry& e = typed_entry<T>(name);
    std::vector<T> values(e.numel());
    copy_out(e, values.data());
    return values;
  }

  template <class T>
  void read_into(std::string_view name, std::span<T> out) const {
    const SafetensorsEntry& e = typed_entry<T>(name);
    if (out.size() != e.numel()) {
      throw InvalidArgument("tensor '" + e.name + "' in " + path_.string() + " has " +
                                std::to_string(e.numel()) + " elements (shape " +
                                detail::format_shape(e.shape) + ") but the output holds " +
                                std::to_string(out.size()),
                            context());
    }
    copy_out(e, out.data());
  }

 private:
  ErrorContext context(std::optional<std::uint64_t> offset = std::nullopt) const {
    ErrorContext c;
    c.operation = "read safetensors";
    c.file = path_.string();
    c.offset = offset;
    return c;
  }

  [[noreturn]] void fail(const std::string& message,
                         std::optional<std::uint64_t> offset = std::nullopt) const {
    throw IoError(message, context(offset));
  }

  [[noreturn]] void fail_tensor(const std::string& name, const std::string& message,
                                std::optional<std::uint64_t> offset = std::nullopt) const {
    fail("tensor " + detail::quote(name) + ": " + message, offset);
  }

  template <class T>
  const SafetensorsEntry& typed_entry(std::string_view name) const {
    static_assert(!std::is_const_v<T> && !std::is_volatile_v<T>,
                  "coltrain: read safetensors into a non-const element type");
    constexpr DataType type = data_type_v<T>;
    const SafetensorsEntry& e = entry(name);
    if (e.dtype != type) {
      throw InvalidArgument("tensor '" + e.name + "' in " + path_.string() + " is " +
                                std::string(detail::safetensors_dtype_name(e.dtype)) + " (" +
                                std::string(name_of(e.dtype)) + ") but was read as " +
                                std::string(name_of(type)) + " (" +
                                std::string(detail::safetensors_dtype_name(type)) + ")",
                            context());
    }
    return e;
  }

  template <class T>
  void copy_out(const SafetensorsEntry& e, T* out) const {
    // memcpy, not a cast: tensors in the file need not be aligned for T.
    if (e.end != e.begin) std::memcpy(out, data_.data() + data_start_ + e.begin, e.end - e.begin);
  }

  void read_file() {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open: " + detail::errno_text(errno));
    detail::SafetensorsFd guard(fd);
    struct stat info {};
    if (::fstat(fd, &info) != 0) fail("cannot stat: " + detail::errno_text(errno));
    if (!S_ISREG(info.st_mode)) fail("not a regular file");
    data_.resize(static_cast<std::size_t>(info.st_size));
    std::size_t done = 0;
    while (done < data_.size()) {
      const ssize_t got = ::read(fd, data_.data() + done, data_.size() - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail("read failed: " + detail::errno_text(errno), done);
      if (got == 0) fail("file shrank while being read", done);
      done += static_cast<std::size_t>(got);
    }
  }

  // Refuses duplicate keys and nesting deeper than the format has (top object > entry > shape
  // array) while parsing, with the offset in the file.
  Json parse_header_json(std::uint64_t header_bytes) const {
    const std::string_view text(reinterpret_cast<const char*>(data_.data() + 8), header_bytes);
    try {
      return Json::parse(text, JsonParseOptions{.max_depth = 3});
    } catch (const JsonError& e) {
      const std::uint64_t at = 8 + e.offset().value_or(0);
      switch (e.reason()) {
        case JsonError::Reason::kTooDeep:
          fail("header nests objects or arrays deeper than the format allows", at);
        case JsonError::Reason::kDuplicateKey: {
          // Nested duplicates sit in an entry, whose pointer is "/" and its escaped name.
          const std::string& pointer = e.object_pointer();
          fail(pointer.empty()
                   ? "duplicate tensor name " + detail::quote(e.key())
                   : detail::quote(coltrain::detail::json_pointer_key(pointer.substr(1))) +
                         ": duplicate key " + detail::quote(e.key()),
               at);
        }
        default:
          fail("header is not valid JSON: " + e.description(), at);
      }
    }
  }

  static std::optional<std::int64_t> as_dimension(const Json& value) {
    if (!value.is_number_unsigned()) return std::nullopt;
    const auto dim = value.get<std::uint64_t>();
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return std::nullopt;
    }
    return static_cast<std::int64_t>(dim);
  }

  SafetensorsEntry parse_entry(const std::string& name, const Json& value,
                               std::uint64_t data_bytes) const {
    if (!value.is_object())
      fail_tensor(name, "entry is not a JSON object: " + detail::brief(value));
    for (const auto& [key, field] : value.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        fail_tensor(
            name, "unknown field " + detail::quote(key) + " (expected dtype, shape, data_offsets)");
      }
    }
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(key)) fail_tensor(name, std::string("missing field '") + key + "'");
    }
    SafetensorsEntry e;
    e.name = name;

    const Json& dtype = value["dtype"];
    if (!dtype.is_string()) fail_tensor(name, "dtype is not a string: " + detail::brief(dtype));
    const auto& dtype_text = dtype.as_string();
    const std::optional<DataType> type = detail::parse_safetensors_dtype(dtype_text);
    if (!type) {
      fail_tensor(name,
                  (detail::is_other_safetensors_dtype(dtype_text)
                       ? "dtype " + detail::quote(dtype_text) + " is not supported by coltrain"
                       : "unknown dtype " + detail::quote(dtype_text)) +
                      " (supported: " + detail::safetensors_supported_dtypes() + ")");
    }
    e.dtype = *type;

    const Json& shape = value["shape"];
    if (!shape.is_array()) fail_tensor(name, "shape is not an array: " + detail::brief(shape));
    for (std::size_t i = 0; i < shape.size(); ++i) {
      const std::optional<std::int64_t> dim = as_dimension(shape[i]);
      if (!dim) {
        fail_tensor(name, "shape " + detail::brief(shape) + ": dimension " + std::to_string(i) +
                              " (" + detail::brief(shape[i]) +
                              ") is not a non-negative 64-bit integer");
      }
      e.shape.push_back(*dim);
    }

    const Json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      fail_tensor(name, "data_offsets " + detail::brief(offsets) +
                            " is not a pair of non-negative 64-bit integers [begin, end]");
    }
    e.begin = offsets[0].get<std::uint64_t>();
    e.end = offsets[1].get<std::uint64_t>();
    const std::uint64_t data_start = data_start_;
    if (e.begin > e.end) {
      fail_tensor(name, "data_offsets " + detail::format_offsets(e.begin, e.end) +
                            " are out of order (begin after end)");
    }
    if (e.end > data_bytes) {
      fail_tensor(name,
                  "data_offsets " + detail::format_offsets(e.begin, e.end) +
                      " extend past the end of the file, whose data section holds " +
                      std::to_string(data_bytes) + " bytes (truncated file?)",
                  data_start + std::min(e.begin, data_bytes));
    }

    const std::optional<std::uint64_t> numel = detail::checked_numel(e.shape);
    const std::optional<std::uint64_t> bytes =
        numel ? detail::checked_bytes(*numel, e.dtype) : std::nullopt;
    // The round trip through size_t matters only where size_t is narrower than 64 bits.
    if (!bytes || static_cast<std::size_t>(*numel) != *numel) {
      fail_tensor(name, "shape " + detail::format_shape(e.shape) + " of " + dtype_text +
                            ": the element count or byte size overflows 64 bits");
    }
    if (e.end - e.begin != *bytes) {
      fail_tensor(name,
                  "size mismatch: data_offsets " + detail::format_offsets(e.begin, e.end) +
                      " hold " + std::to_string(e.end - e.begin) + " bytes but shape " +
                      detail::format_shape(e.shape) + " of " + dtype_text + " needs " +
                      std::to_string(*bytes),
                  data_start + e.begin);
    }
    return e;
  }

  void parse() {
    const std::uint64_t file_bytes = data_.size();
    if (file_bytes < 8) {
      fail("file is " + std::to_string(file_bytes) +
               " bytes, too short for the 8-byte header length (truncated file?)",
           0);
    }
    std::uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, data_.data(), 8);
    if (header_bytes > detail::kSafetensorsMaxHeaderBytes) {
      fail("header length " + std::to_string(header_bytes) + " exceeds the limit of " +
               std::to_string(detail::kSafetensorsMaxHeaderBytes) + " bytes",
           0);
    }
    if (header_bytes > file_bytes - 8) {
      fail("header length " + std::to_string(header_bytes) + " is larger than the " +
               std::to_string(file_bytes - 8) + " bytes after it (truncated file?)",
           0);
    }
    data_start_ = 8 + header_bytes;
    const std::uint64_t data_bytes = file_bytes - data_start_;

    const Json header = parse_header_json(header_bytes);
    if (!header.is_object()) fail("header is not a JSON object", 8);
    for (const auto& [key, value] : header.items()) {
      if (key == detail::kSafetensorsMetadataKey) {
        if (!value.is_object()) fail("__metadata__ is not a JSON object: " + detail::brief(value));
        for (const auto& [meta_key, meta_value] : value.items()) {
          if (!meta_value.is_string()) {
            fail("__metadata__ value of " + detail::quote(meta_key) +
                 " is not a string: " + detail::brief(meta_value));
          }
          metadata_.emplace(meta_key, meta_value.get<std::string>());
        }
      } else {
        entries_.push_back(parse_entry(key, value, data_bytes));
      }
    }

    // The data section must be tiled exactly, in offset order: no gaps, no overlaps, nothing after.
    std::ranges::stable_sort(entries_, [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
      return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
    });
    std::uint64_t covered = 0;
    const SafetensorsEntry* previous = nullptr;
    for (const SafetensorsEntry& e : entries_) {
      if (e.begin < covered) {
        fail_tensor(e.name,
                    "data_offsets " + detail::format_offsets(e.begin, e.end) + " overlap tensor " +
                        detail::quote(previous->name) + " " +
                        detail::format_offsets(previous->begin, previous->end),
                    data_start_ + e.begin);
      }
      if (e.begin > covered) {
        fail_tensor(e.name,
                    "gap of " + std::to_string(e.begin - covered) +
                        " bytes before its data_offsets " + detail::format_offsets(e.begin, e.end) +
                        " (the data before ends at " + std::to_string(covered) + ")",
                    data_start_ + covered);
      }
      covered = e.end;
      previous = &e;
    }
    if (covered != data_bytes) {
      fail(std::to_string(data_bytes - covered) + " trailing bytes after the last tensor's data",
           data_start_ + covered);
    }

    for (std::size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
  }

  std::filesystem::path path_;
  std::vector<std::byte> data_;  // the whole file
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors (copied, so callers' buffers may go away) and metadata, then writes them as one
// safetensors file.
class SafetensorsWriter {
 public:
  template <class T>
  void add(std::string name, std::vector<std::int64_t> shape, std::span<const T> data) {
    add_bytes(std::move(name), data_type_v<T>, std::move(shape), std::as_bytes(data));
  }

  // Any contiguous range (std::vector, std::array, std::span of non-const...), so that the element
  // type need not be spelled at the call.
  template <std::ranges::contiguous_range Range>
  requires std::ranges::sized_range<Range>
  void add(std::string name, std::vector<std::int64_t> shape, const Range& data) {
    using T = std::remove_cv_t<std::ranges::range_value_t<Range>>;
    add<T>(std::move(name), std::move(shape),
           std::span<const T>(std::ranges::data(data), std::ranges::size(data)));
  }

  void add_bytes(std::string name, DataType dtype, std::vector<std::int64_t> shape,
                 std::span<const std::byte> data) {
    auto invalid = [&](const std::string& message) {
      ErrorContext c;
      c.operation = "add safetensors tensor";
      throw InvalidArgument("tensor '" + name + "': " + message, c);
    };
    if (name == detail::kSafetensorsMetadataKey) invalid("the name is reserved for metadata");
    if (!is_valid_utf8(name)) invalid("the name is not valid UTF-8");
    if (names_.contains(name)) invalid("duplicate tensor name");
    if (size_of(dtype) == 0) invalid("invalid dtype");
    for (const std::int64_t dim : shape) {
      if (dim < 0) invalid("negative dimension in shape " + detail::format_shape(shape));
    }
    const std::optional<std::uint64_t> numel = detail::checked_numel(shape);
    const std::optional<std::uint64_t> bytes =
        numel ? detail::checked_bytes(*numel, dtype) : std::nullopt;
    if (!bytes || *bytes != data.size()) {
      invalid("shape " + detail::format_shape(shape) + " of " +
              std::string(detail::safetensors_dtype_name(dtype)) + " needs " +
              (bytes ? std::to_string(*numel) + " elements (" + std::to_string(*bytes) + " bytes)"
                     : std::string("a count that overflows 64 bits")) +
              " but the data holds " + std::to_string(data.size() / size_of(dtype)) +
              " elements (" + std::to_string(data.size()) + " bytes)");
    }
    names_.insert(name);
    tensors_.push_back(Pending{std::move(name), dtype, std::move(shape),
                               std::vector<std::byte>(data.begin(), data.end())});
  }

  // A later value for the same key replaces the earlier one.
  void set_metadata(std::string key, std::string value) {
    if (!is_valid_utf8(key) || !is_valid_utf8(value)) {
      ErrorContext c;
      c.operation = "add safetensors metadata";
      throw InvalidArgument("metadata '" + key + "' is not valid UTF-8", c);
    }
    metadata_.insert_or_assign(std::move(key), std::move(value));
  }

  // Replaces `file` atomically (core/atomic_file.hpp): readers and crashes see either the old file
  // or the complete new one. On failure `file` is untouched and the temporary file removed.
  void write(const std::filesystem::path& file) const {
    const std::string header = header_json();
    const std::uint64_t header_bytes = header.size();
    std::byte length[8];
    std::memcpy(length, &header_bytes, 8);
    AtomicFileWriter out(file, "write safetensors");
    out.write(length);
    out.write(header);
    for (const std::size_t i : data_order()) out.write(tensors_[i].data);
    out.commit();
  }

 private:
  struct Pending {
    std::string name;
    DataType dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::byte> data;
  };

  static bool is_valid_utf8(const std::string& text) {
    return !coltrain::detail::find_invalid_utf8(text).has_value();
  }

  // Widest elements first, stable otherwise (the reference writer's order): with the header padded
  // to 8 bytes every tensor then starts aligned for its element type, for readers that map the
  // file.
  std::vector<std::size_t> data_order() const {
    std::vector<std::size_t> order(tensors_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::ranges::stable_sort(order, [&](std::size_t a, std::size_t b) {
      return size_of(tensors_[a].dtype) > size_of(tensors_[b].dtype);
    });
    return order;
  }

  std::string header_json() const {
    Json header = Json::object();
    if (!metadata_.empty()) {
      Json& metadata = header[detail::kSafetensorsMetadataKey];
      for (const auto& [key, value] : metadata_) metadata[key] = value;
    }
    std::uint64_t offset = 0;
    for (const std::size_t i : data_order()) {
      const Pending& t = tensors_[i];
      header[t.name] =
          Json::object({{"dtype", detail::safetensors_dtype_name(t.dtype)},
                        {"shape", t.shape},
                        {"data_offsets", Json::array({offset, offset + t.data.size()})}});
      offset += t.data.size();
    }
    std::string text = header.dump();
    // Spaces are JSON whitespace; padding to 8 keeps the data section 8-byte aligned.
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
  }

  std::vector<Pending> tensors_;
  std::set<std::string, std::less<>> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace coltrain::tensor
