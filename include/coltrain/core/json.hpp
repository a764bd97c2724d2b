#pragma once
// A JSON value: what the run records, checkpoint sidecars and safetensors headers are read and
// written with. Objects keep their members in insertion order (config.json reads in the order the
// trainer names its options); the parser is strict RFC 8259, refuses duplicate keys and nesting
// deeper than a limit, and reports the byte offset of what it refused.
//
// Why not nlohmann/json, which coltrain used before: its templates cost about 9 s of every nvcc
// build of a sample (three front ends parse and instantiate them) and an install dependency; what
// coltrain needs is this one class.

#include <coltrain/core/error.hpp>
#include <coltrain/core/json_string.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace coltrain {

// A parse error (with the byte offset of the refused character) or a value of the wrong kind.
class JsonError : public Error {
 public:
  enum class Reason { kSyntax, kTooDeep, kDuplicateKey, kWrongKind, kMissingKey };

  JsonError(Reason reason, std::string description,
            std::optional<std::size_t> offset = std::nullopt, std::string key = {},
            std::string object_pointer = {})
      : Error((reason == Reason::kWrongKind || reason == Reason::kMissingKey ? ""
                                                                             : "invalid JSON: ") +
              description + (offset ? " at byte " + std::to_string(*offset) : "")),
        reason_(reason),
        description_(std::move(description)),
        offset_(offset),
        key_(std::move(key)),
        object_pointer_(std::move(object_pointer)) {}

  Reason reason() const noexcept { return reason_; }
  // What was wrong, without "invalid JSON" and the offset, for callers that name the file and
  // offset themselves.
  const std::string& description() const noexcept { return description_; }
  // Where in the parsed text (parse errors only).
  std::optional<std::size_t> offset() const noexcept { return offset_; }
  // kDuplicateKey: the key, and the JSON pointer of the object that holds it twice ("" = the top).
  const std::string& key() const noexcept { return key_; }
  const std::string& object_pointer() const noexcept { return object_pointer_; }

 private:
  Reason reason_;
  std::string description_;
  std::optional<std::size_t> offset_;
  std::string key_;
  std::string object_pointer_;
};

struct JsonParseOptions {
  // Arrays and objects nested deeper than this are refused while parsing (copies, comparisons and
  // dumps recurse, so an unbounded depth could overflow the stack).
  int max_depth = 128;
};

namespace detail {
class JsonParser;
}

class Json {
 public:
  enum class Kind { kNull, kBoolean, kInteger, kUnsigned, kFloat, kString, kArray, kObject };
  // An object's member: its key (first) and value (second), in insertion order.
  using Member = std::pair<std::string, Json>;

  Json() = default;
  Json(const Json&) = default;
  Json(Json&&) noexcept = default;
  // By value, then swapped: in `node = node[0]` the child is copied (or moved) out before the
  // members that hold it are replaced.
  Json& operator=(Json other) noexcept {
    std::swap(kind_, other.kind_);
    std::swap(scalar_, other.scalar_);
    string_.swap(other.string_);
    array_.swap(other.array_);
    object_.swap(other.object_);
    return *this;
  }
  Json(std::nullptr_t) {}
  Json(bool value) : kind_(Kind::kBoolean) { scalar_.boolean = value; }
  // Signed integers are kInteger, unsigned ones kUnsigned; parsing makes non-negative integers
  // kUnsigned. Both are integers to is_number_integer().
  template <std::integral I>
  requires(!std::same_as<I, bool>) Json(I value) {
    if constexpr (std::is_signed_v<I>) {
      kind_ = Kind::kInteger;
      scalar_.integer = value;
    } else {
      kind_ = Kind::kUnsigned;
      scalar_.unsigned_integer = value;
    }
  }
  Json(double value) : kind_(Kind::kFloat) { scalar_.floating = value; }
  Json(float value) : Json(static_cast<double>(value)) {}
  Json(std::string value) : kind_(Kind::kString), string_(std::move(value)) {}
  Json(std::string_view value) : Json(std::string(value)) {}
  Json(const char* value) : Json(std::string(value)) {}
  // An empty optional is null; a full one, its value.
  template <class T>
  requires std::constructible_from<Json, const T&> Json(const std::optional<T>& value)
      : Json(value ? Json(*value) : Json()) {}
  // std::vector<double>, std::vector<std::vector<std::int64_t>>...: an array.
  template <class T, class Allocator>
  requires std::constructible_from<Json, const T&> Json(const std::vector<T, Allocator>& values)
      : kind_(Kind::kArray) {
    array_.reserve(values.size());
    for (const T& value : values) array_.emplace_back(value);
  }

  static Json array(std::initializer_list<Json> elements = {}) {
    Json out;
    out.kind_ = Kind::kArray;
    out.array_.assign(elements.begin(), elements.end());
    return out;
  }
  // Json::object({{"loss", 0.5}, {"epoch", 3}}): members in this order.
  static Json object(std::initializer_list<std::pair<std::string_view, Json>> members = {});

  // Strict RFC 8259. Throws JsonError naming the byte offset of the first character it refuses.
  static Json parse(std::string_view text, const JsonParseOptions& options = {});

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_boolean() const { return kind_ == Kind::kBoolean; }
  bool is_number() const { return is_number_integer() || kind_ == Kind::kFloat; }
  bool is_number_integer() const { return kind_ == Kind::kInteger || kind_ == Kind::kUnsigned; }
  bool is_number_unsigned() const { return kind_ == Kind::kUnsigned; }
  bool is_number_float() const { return kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }

  // bool, a number type (converted as static_cast converts), or std::string. Throws JsonError
  // when the value is of another kind, or is a float outside the range of the integer type asked
  // for.
  template <class T>
  T get() const {
    if constexpr (std::same_as<T, bool>) {
      expect(Kind::kBoolean, "a boolean");
      return scalar_.boolean;
    } else if constexpr (std::is_arithmetic_v<T>) {
      if (kind_ == Kind::kInteger) return static_cast<T>(scalar_.integer);
      if (kind_ == Kind::kUnsigned) return static_cast<T>(scalar_.unsigned_integer);
      expect(Kind::kFloat, "a number");
      if constexpr (std::is_integral_v<T>) {
        // A double outside T's range has no defined conversion.
        const double value = scalar_.floating;
        if (!(value >= static_cast<double>(std::numeric_limits<T>::min()) &&
              value < std::ldexp(1.0, std::numeric_limits<T>::digits)))
          throw JsonError(
              JsonError::Reason::kWrongKind,
              "JSON number " + dump() + " is out of the range of the integer asked for");
      }
      return static_cast<T>(scalar_.floating);
    } else {
      static_assert(std::same_as<T, std::string>, "Json::get: bool, a number type or std::string");
      return as_string();
    }
  }
  const std::string& as_string() const {
    expect(Kind::kString, "a string");
    return string_;
  }

  // Arrays and objects: their element count; null: 0; any other value: 1.
  std::size_t size() const;
  bool empty() const { return size() == 0; }

  // Objects. The mutable operator[] makes a null value an empty object and adds missing keys (as
  // null); the const one throws JsonError for a missing key.
  Json& operator[](std::string_view key);
  const Json& operator[](std::string_view key) const;
  const Json* find(std::string_view key) const;  // null also when this is not an object
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  // The member `key`, or `fallback` when there is none.
  Json value(std::string_view key, Json fallback) const;
  const std::vector<Member>& items() const;
  bool erase(std::string_view key);

  // Arrays. push_back makes a null value an empty array.
  Json& operator[](std::size_t index);
  const Json& operator[](std::size_t index) const;
  void push_back(Json element);
  const std::vector<Json>& elements() const;
  std::vector<Json>::const_iterator begin() const { return elements().begin(); }
  std::vector<Json>::const_iterator end() const { return elements().end(); }

  // RFC 6901: "/files/model/name", "/shape/0"; "" is this value. Null when nothing is there.
  const Json* at_pointer(std::string_view pointer) const;

  // Compact without `indent` (or with a negative one), else one member or element per line.
  // Non-finite floats are written as null (JSON has no NaN). Throws JsonError for a string that is
  // not valid UTF-8.
  std::string dump(std::optional<int> indent = std::nullopt) const;

  // Numbers compare by value across kinds (1 == 1u == 1.0); objects compare as sets of members.
  // A hidden friend: found only for Json operands, never by conversion of other types.
  friend bool operator==(const Json& a, const Json& b) { return equal(a, b); }

 private:
  void expect(Kind kind, const char* what) const {
    if (kind_ != kind) throw wrong_kind(what);
  }
  JsonError wrong_kind(const char* what) const;
  static bool equal(const Json& a, const Json& b);
  void dump_to(std::string& out, std::optional<int> indent, int level) const;

  friend class detail::JsonParser;

  Kind kind_ = Kind::kNull;
  union {
    bool boolean;
    std::int64_t integer;
    std::uint64_t unsigned_integer;
    double floating;
  } scalar_{};
  std::string string_;
  std::vector<Json> array_;
  std::vector<Member> object_;
};

namespace detail {

inline const char* json_kind_name(Json::Kind kind) {
  switch (kind) {
    case Json::Kind::kNull:
      return "null";
    case Json::Kind::kBoolean:
      return "a boolean";
    case Json::Kind::kInteger:
    case Json::Kind::kUnsigned:
      return "an integer";
    case Json::Kind::kFloat:
      return "a number";
    case Json::Kind::kString:
      return "a string";
    case Json::Kind::kArray:
      return "an array";
    case Json::Kind::kObject:
      return "an object";
  }
  return "?";
}

// The length of the valid UTF-8 sequence at text[at], or 0 (overlong forms, surrogates and code
// points above U+10FFFF are invalid, as RFC 3629 says).
inline std::size_t utf8_sequence_length(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return 1;
  std::size_t length;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (at + length > text.size()) return 0;
  if (byte(at + 1) < low || byte(at + 1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (byte(at + i) < 0x80 || byte(at + i) > 0xBF) return 0;
  }
  return length;
}

// The offset of the first byte that is not part of valid UTF-8, if any.
inline std::optional<std::size_t> find_invalid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_sequence_length(text, i);
    if (length == 0) return i;
    i += length;
  }
  return std::nullopt;
}

inline void append_utf8(std::string& out, std::uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// A JSON pointer's reference token read back: "~1" is "/", "~0" is "~".
inline std::string json_pointer_key(std::string_view token) {
  std::string key;
  for (std::size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
      key += token[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      key += token[i];
    }
  }
  return key;
}

// "~" and "/" escaped as a JSON pointer's reference token needs.
inline std::string json_pointer_token(std::string_view key) {
  std::string out;
  for (const char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

// Recursive descent over the text, one value per call; the depth limit bounds the recursion.
class JsonParser {
 public:
  JsonParser(std::string_view text, const JsonParseOptions& options)
      : text_(text), options_(options) {}

  Json parse_document() {
    skip_whitespace();
    Json value = parse_value(0);
    skip_whitespace();
    if (at_ < text_.size()) fail("unexpected text after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const { fail_at(message, at_); }
  [[noreturn]] void fail_at(const std::string& message, std::size_t offset) const {
    throw JsonError(JsonError::Reason::kSyntax, message, offset);
  }

  void skip_whitespace() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
      ++at_;
  }

  bool consume(char c) {
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }

  std::string describe_next() const {
    if (at_ >= text_.size()) return "the end of the text";
    const char c = text_[at_];
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(c));
      return std::string("byte ") + hex;
    }
    return std::string("'") + c + "'";
  }

  Json parse_value(int depth) {
    if (at_ >= text_.size()) fail("expected a value, found the end of the text");
    switch (text_[at_]) {
      case '{':
        return parse_object(depth + 1);
      case '[':
        return parse_array(depth + 1);
      case '"':
        return Json(parse_string());
      case 't':
        expect_word("true");
        return Json(true);
      case 'f':
        expect_word("false");
        return Json(false);
      case 'n':
        expect_word("null");
        return Json();
      default:
        if (text_[at_] == '-' || (text_[at_] >= '0' && text_[at_] <= '9')) return parse_number();
        fail("expected a value, found " + describe_next());
    }
  }

  void check_depth(int depth) const {
    if (depth > options_.max_depth) {
      throw JsonError(
          JsonError::Reason::kTooDeep,
          "arrays or objects nested deeper than " + std::to_string(options_.max_depth) + " levels",
          at_);
    }
  }

  // The JSON pointer of the value being parsed, for errors only.
  std::string current_pointer() const {
    std::string pointer;
    for (const PathStep& step : path_) {
      pointer += '/';
      pointer += step.key ? json_pointer_token(*step.key) : std::to_string(step.index);
    }
    return pointer;
  }

  [[noreturn]] void fail_duplicate(const std::string& key, std::size_t offset) const {
    const std::string pointer = current_pointer();
    throw JsonError(JsonError::Reason::kDuplicateKey,
                    "duplicate key '" + key + "' in the object at '" + pointer + "'", offset, key,
                    pointer);
  }

  // Small objects are checked key by key; large ones once, sorted, so that a header of a million
  // keys costs n log n, not n^2.
  static constexpr std::size_t kLinearDuplicateCheck = 32;

  void check_sorted_duplicates(const std::vector<Json::Member>& members,
                               const std::vector<std::size_t>& key_offsets) const {
    std::vector<std::size_t> order(members.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return members[a].first != members[b].first ? members[a].first < members[b].first : a < b;
    });
    std::optional<std::size_t> first_repeat;  // the earliest second occurrence, in text order
    for (std::size_t i = 1; i < order.size(); ++i) {
      if (members[order[i]].first == members[order[i - 1]].first &&
          (!first_repeat || order[i] < *first_repeat))
        first_repeat = order[i];
    }
    if (first_repeat) fail_duplicate(members[*first_repeat].first, key_offsets[*first_repeat]);
  }

  Json parse_object(int depth) {
    check_depth(depth);
    ++at_;  // '{'
    Json object = Json::object();
    std::vector<Json::Member>& members = object.object_;
    std::vector<std::size_t> key_offsets;
    skip_whitespace();
    if (consume('}')) return object;
    for (;;) {
      skip_whitespace();
      if (at_ >= text_.size() || text_[at_] != '"')
        fail("expected a string key, found " + describe_next());
      key_offsets.push_back(at_);
      std::string key = parse_string();
      if (members.size() < kLinearDuplicateCheck) {
        for (const Json::Member& member : members) {
          if (member.first == key) fail_duplicate(key, key_offsets.back());
        }
      }
      skip_whitespace();
      if (!consume(':')) fail("expected ':' after an object key, found " + describe_next());
      skip_whitespace();
      path_.push_back({&key, 0});
      Json value = parse_value(depth);
      path_.pop_back();
      members.push_back({std::move(key), std::move(value)});
      skip_whitespace();
      if (consume('}')) break;
      if (!consume(',')) fail("expected ',' or '}' in an object, found " + describe_next());
    }
    if (members.size() > kLinearDuplicateCheck) check_sorted_duplicates(members, key_offsets);
    return object;
  }

  Json parse_array(int depth) {
    check_depth(depth);
    ++at_;  // '['
    Json array = Json::array();
    skip_whitespace();
    if (consume(']')) return array;
    for (;;) {
      skip_whitespace();
      path_.push_back({nullptr, array.array_.size()});
      array.array_.push_back(parse_value(depth));
      path_.pop_back();
      skip_whitespace();
      if (consume(']')) return array;
      if (!consume(',')) fail("expected ',' or ']' in an array, found " + describe_next());
    }
  }

  void expect_word(std::string_view word) {
    for (const char c : word) {
      if (at_ >= text_.size() || text_[at_] != c)
        fail("expected '" + std::string(word) + "', found " + describe_next());
      ++at_;
    }
  }

  std::uint32_t parse_hex4() {
    if (at_ + 4 > text_.size()) fail("a \\u escape needs four hex digits");
    std::uint32_t value = 0;
    const auto [end, error] =
        std::from_chars(text_.data() + at_, text_.data() + at_ + 4, value, 16);
    if (error != std::errc() || end != text_.data() + at_ + 4)
      fail("a \\u escape needs four hex digits");
    at_ += 4;
    return value;
  }

  std::string parse_string() {
    ++at_;  // '"'
    std::string out;
    for (;;) {
      if (at_ >= text_.size()) fail("a string is not closed");
      const char c = text_[at_];
      if (c == '"') {
        ++at_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20)
        fail("a control character must be escaped inside a string");
      if (c != '\\') {
        const std::size_t length = detail::utf8_sequence_length(text_, at_);
        if (length == 0) fail("a string is not valid UTF-8");
        out.append(text_.substr(at_, length));
        at_ += length;
        continue;
      }
      const std::size_t escape_at = at_;
      ++at_;
      if (at_ >= text_.size()) fail("a string is not closed");
      const char escaped = text_[at_++];
      switch (escaped) {
        case '"':
        case '\\':
        case '/':
          out += escaped;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t code_point = parse_hex4();
          if (code_point >= 0xDC00 && code_point <= 0xDFFF)
            fail_at("a \\u escape is a lone low surrogate", escape_at);
          if (code_point >= 0xD800 && code_point <= 0xDBFF) {
            if (text_.substr(at_, 2) != "\\u")
              fail_at("a high surrogate is not followed by a low one", escape_at);
            at_ += 2;
            const std::uint32_t low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF)
              fail_at("a high surrogate is not followed by a low one", escape_at);
            code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
          }
          detail::append_utf8(out, code_point);
          break;
        }
        default:
          fail_at("unknown escape in a string", escape_at);
      }
    }
  }

  Json parse_number() {
    const std::size_t start = at_;
    const auto digits = [&] {
      const std::size_t from = at_;
      while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
      return at_ - from;
    };
    consume('-');
    if (at_ >= text_.size() || text_[at_] < '0' || text_[at_] > '9')
      fail("expected a digit in a number, found " + describe_next());
    if (text_[at_] == '0') {
      ++at_;
      if (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9')
        fail("a number has a leading zero");
    } else {
      digits();
    }
    bool integral = true;
    if (consume('.')) {
      integral = false;
      if (digits() == 0) fail("expected a digit after the decimal point");
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      integral = false;
      ++at_;
      if (!consume('+')) consume('-');
      if (digits() == 0) fail("expected a digit in the exponent");
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + at_;
    if (integral) {
      // Integers that fit 64 bits stay exact; larger ones become doubles, as other parsers do.
      if (*first == '-') {
        std::int64_t value;
        if (std::from_chars(first, last, value).ec == std::errc()) return Json(value);
      } else {
        std::uint64_t value;
        if (std::from_chars(first, last, value).ec == std::errc()) return Json(value);
      }
    }
    double value;
    const auto [end, error] = std::from_chars(first, last, value);
    if (error != std::errc() || end != last)
      fail_at("the number " + std::string(first, last) + " is out of the range of a double", start);
    return Json(value);
  }

  struct PathStep {
    const std::string* key;  // null inside an array
    std::size_t index;
  };

  std::string_view text_;
  JsonParseOptions options_;
  std::size_t at_ = 0;
  std::vector<PathStep> path_;
};

}  // namespace detail

inline Json Json::parse(std::string_view text, const JsonParseOptions& options) {
  return detail::JsonParser(text, options).parse_document();
}

inline Json Json::object(std::initializer_list<std::pair<std::string_view, Json>> members) {
  Json out;
  out.kind_ = Kind::kObject;
  for (const auto& [key, value] : members) out[key] = value;
  return out;
}

inline JsonError Json::wrong_kind(const char* what) const {
  return JsonError(JsonError::Reason::kWrongKind,
                   std::string("JSON value is ") + detail::json_kind_name(kind_) + ", not " + what);
}

inline std::size_t Json::size() const {
  switch (kind_) {
    case Kind::kNull:
      return 0;
    case Kind::kArray:
      return array_.size();
    case Kind::kObject:
      return object_.size();
    default:
      return 1;
  }
}

inline Json& Json::operator[](std::string_view key) {
  if (kind_ == Kind::kNull) kind_ = Kind::kObject;
  expect(Kind::kObject, "an object");
  for (Member& member : object_) {
    if (member.first == key) return member.second;
  }
  object_.push_back({std::string(key), Json()});
  return object_.back().second;
}

inline const Json& Json::operator[](std::string_view key) const {
  if (const Json* found = find(key)) return *found;
  throw JsonError(JsonError::Reason::kMissingKey,
                  "JSON object has no member '" + std::string(key) + "'");
}

// Null for a value that is not an object, as contains() is false there.
inline const Json* Json::find(std::string_view key) const {
  if (kind_ != Kind::kObject) return nullptr;
  for (const Member& member : object_) {
    if (member.first == key) return &member.second;
  }
  return nullptr;
}

inline Json Json::value(std::string_view key, Json fallback) const {
  const Json* found = find(key);
  return found ? *found : fallback;
}

inline const std::vector<Json::Member>& Json::items() const {
  expect(Kind::kObject, "an object");
  return object_;
}

inline bool Json::erase(std::string_view key) {
  expect(Kind::kObject, "an object");
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (it->first == key) {
      object_.erase(it);
      return true;
    }
  }
  return false;
}

inline Json& Json::operator[](std::size_t index) {
  expect(Kind::kArray, "an array");
  if (index >= array_.size())
    throw JsonError(JsonError::Reason::kMissingKey,
                    "JSON array index " + std::to_string(index) + " is past its " +
                        std::to_string(array_.size()) + " elements");
  return array_[index];
}

inline const Json& Json::operator[](std::size_t index) const {
  return const_cast<Json&>(*this)[index];
}

inline void Json::push_back(Json element) {
  if (kind_ == Kind::kNull) kind_ = Kind::kArray;
  expect(Kind::kArray, "an array");
  array_.push_back(std::move(element));
}

inline const std::vector<Json>& Json::elements() const {
  expect(Kind::kArray, "an array");
  return array_;
}

inline const Json* Json::at_pointer(std::string_view pointer) const {
  const Json* at = this;
  while (!pointer.empty()) {
    if (pointer.front() != '/') return nullptr;
    pointer.remove_prefix(1);
    const std::size_t slash = pointer.find('/');
    const std::string token = detail::json_pointer_key(pointer.substr(0, slash));
    pointer = slash == std::string_view::npos ? std::string_view() : pointer.substr(slash);
    if (at->is_object()) {
      at = at->find(token);
    } else if (at->is_array()) {
      std::size_t index;
      const auto [end, error] = std::from_chars(token.data(), token.data() + token.size(), index);
      if (token.empty() || error != std::errc() || end != token.data() + token.size() ||
          (token.size() > 1 && token[0] == '0') || index >= at->array_.size())
        return nullptr;
      at = &at->array_[index];
    } else {
      return nullptr;
    }
    if (at == nullptr) return nullptr;
  }
  return at;
}

inline std::string Json::dump(std::optional<int> indent) const {
  if (indent && *indent < 0) indent.reset();  // as compact, like other JSON libraries
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

inline void Json::dump_to(std::string& out, std::optional<int> indent, int level) const {
  const auto write_string = [&](const std::string& text) {
    if (const std::optional<std::size_t> bad = detail::find_invalid_utf8(text)) {
      throw JsonError(JsonError::Reason::kWrongKind, "string is not valid UTF-8 (byte " +
                                                         std::to_string(*bad) +
                                                         "), so it cannot be written as JSON");
    }
    detail::append_json_string(out, text);
  };
  const auto new_line = [&](int at_level) {
    if (!indent) return;
    out += '\n';
    out.append(static_cast<std::size_t>(*indent) * static_cast<std::size_t>(at_level), ' ');
  };
  switch (kind_) {
    case Kind::kNull:
      out += "null";
      return;
    case Kind::kBoolean:
      out += scalar_.boolean ? "true" : "false";
      return;
    case Kind::kInteger:
      out += std::to_string(scalar_.integer);
      return;
    case Kind::kUnsigned:
      out += std::to_string(scalar_.unsigned_integer);
      return;
    case Kind::kFloat: {
      const double value = scalar_.floating;
      if (value != value || value - value != 0) {  // NaN or infinite
        out += "null";
        return;
      }
      char digits[32];
      const auto end = std::to_chars(digits, digits + sizeof digits, value).ptr;
      const std::string_view text(digits, static_cast<std::size_t>(end - digits));
      out += text;
      // Shortest round trip, and still a float when read back: 1.0, not 1.
      if (text.find_first_of(".e") == std::string_view::npos) out += ".0";
      return;
    }
    case Kind::kString:
      write_string(string_);
      return;
    case Kind::kArray:
      out += '[';
      for (std::size_t i = 0; i < array_.size(); ++i) {
        if (i > 0) out += ',';
        new_line(level + 1);
        array_[i].dump_to(out, indent, level + 1);
      }
      if (!array_.empty()) new_line(level);
      out += ']';
      return;
    case Kind::kObject:
      out += '{';
      for (std::size_t i = 0; i < object_.size(); ++i) {
        if (i > 0) out += ',';
        new_line(level + 1);
        write_string(object_[i].first);
        out += indent ? ": " : ":";
        object_[i].second.dump_to(out, indent, level + 1);
      }
      if (!object_.empty()) new_line(level);
      out += '}';
      return;
  }
}

inline bool Json::equal(const Json& a, const Json& b) {
  using Kind = Json::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind_ == Kind::kFloat && b.kind_ == Kind::kFloat)
      return a.scalar_.floating == b.scalar_.floating;
    if (a.kind_ == Kind::kFloat || b.kind_ == Kind::kFloat) {
      // Exactly: the double must hold an integer inside the integer's range, which then converts
      // without loss (2^53 + 1 is not 2^53.0, though converting it to a double rounds it so).
      const double d = (a.kind_ == Kind::kFloat ? a : b).scalar_.floating;
      const Json& integer = a.kind_ == Kind::kFloat ? b : a;
      if (!(d >= -0x1p63 && d < 0x1p64) || d != std::trunc(d)) return false;
      if (integer.kind_ == Kind::kInteger)
        return d < 0x1p63 && static_cast<std::int64_t>(d) == integer.scalar_.integer;
      return d >= 0 && static_cast<std::uint64_t>(d) == integer.scalar_.unsigned_integer;
    }
    if (a.kind_ == b.kind_) return a.get<std::uint64_t>() == b.get<std::uint64_t>();
    const Json& signed_one = a.kind_ == Kind::kInteger ? a : b;
    const Json& unsigned_one = a.kind_ == Kind::kInteger ? b : a;
    return signed_one.scalar_.integer >= 0 &&
           static_cast<std::uint64_t>(signed_one.scalar_.integer) ==
               unsigned_one.scalar_.unsigned_integer;
  }
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case Kind::kNull:
      return true;
    case Kind::kBoolean:
      return a.scalar_.boolean == b.scalar_.boolean;
    case Kind::kString:
      return a.string_ == b.string_;
    case Kind::kArray:
      return a.array_ == b.array_;
    case Kind::kObject: {
      // Keys are unique. Members in the same order (as a round trip leaves them) compare pair by
      // pair; from the first that differs on, both sides are sorted by key, so that a large object
      // costs n log n, not the n^2 of a find() per member.
      const std::size_t n = a.object_.size();
      if (n != b.object_.size()) return false;
      std::size_t same = 0;
      for (; same < n && a.object_[same].first == b.object_[same].first; ++same) {
        if (!(a.object_[same].second == b.object_[same].second)) return false;
      }
      if (same == n) return true;
      std::vector<const Member*> left, right;
      for (std::size_t i = same; i < n; ++i) {
        left.push_back(&a.object_[i]);
        right.push_back(&b.object_[i]);
      }
      const auto by_key = [](const Member* x, const Member* y) { return x->first < y->first; };
      std::sort(left.begin(), left.end(), by_key);
      std::sort(right.begin(), right.end(), by_key);
      for (std::size_t i = 0; i < left.size(); ++i) {
        if (left[i]->first != right[i]->first || !(left[i]->second == right[i]->second))
          return false;
      }
      return true;
    }
    default:
      return false;
  }
}

}  // namespace coltrain
