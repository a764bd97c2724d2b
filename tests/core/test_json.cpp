#include <catch2/catch.hpp>
#include <coltrain/core/json.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../support/temp_dir.hpp"

using Catch::Matchers::Contains;
using coltrain::Json;
using coltrain::JsonError;
using coltrain::JsonParseOptions;
using Kind = coltrain::Json::Kind;
using Reason = coltrain::JsonError::Reason;

namespace {

// The JsonError that parsing `text` throws; the test fails if it parses.
JsonError parse_error(std::string_view text, const JsonParseOptions& options = {}) {
  try {
    Json::parse(text, options);
  } catch (const JsonError& e) {
    return e;
  }
  FAIL("parsed, but should have been refused: " << text);
  throw std::logic_error("unreachable");  // FAIL throws; this keeps the compiler content
}

// Where an error says it was refused, or SIZE_MAX when it names no offset.
std::size_t offset_of(const JsonError& e) {
  return e.offset().value_or(std::numeric_limits<std::size_t>::max());
}

// The offset a syntax error names, or SIZE_MAX if the error is of another kind.
std::size_t syntax_error_offset(std::string_view text) {
  const JsonError e = parse_error(text);
  return e.reason() == Reason::kSyntax ? offset_of(e) : std::numeric_limits<std::size_t>::max();
}

// An object text of the given keys (values are their indexes), and where each key's quote is.
std::pair<std::string, std::vector<std::size_t>> object_text(const std::vector<std::string>& keys) {
  std::string text = "{";
  std::vector<std::size_t> offsets;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) text += ',';
    offsets.push_back(text.size());
    text += '"' + keys[i] + "\":" + std::to_string(i);
  }
  text += '}';
  return {text, offsets};
}

std::string numbered_key(std::size_t i) {
  char key[16];
  std::snprintf(key, sizeof key, "k%02zu", i);
  return key;
}

}  // namespace

// Catch would print a Json as a range (it has begin() and end()), which throws for a non-array.
template <>
struct Catch::StringMaker<Json> {
  static std::string convert(const Json& value) {
    try {
      return value.dump();
    } catch (const JsonError&) {
      return "(a Json with invalid UTF-8)";
    }
  }
};

TEST_CASE("parse reads every kind of value", "[json]") {
  CHECK(Json::parse("null").is_null());
  CHECK(Json::parse("true").get<bool>() == true);
  CHECK(Json::parse("false").get<bool>() == false);
  CHECK(Json::parse("42").kind() == Kind::kUnsigned);
  CHECK(Json::parse("-7").kind() == Kind::kInteger);
  CHECK(Json::parse("2.5").get<double>() == 2.5);
  CHECK(Json::parse("\"text\"").as_string() == "text");
  CHECK(Json::parse("[]").is_array());
  CHECK(Json::parse("[]").empty());
  CHECK(Json::parse("{}").is_object());
  CHECK(Json::parse("{}").empty());

  const Json value = Json::parse(" \t\r\n{ \"a\" : [ 1 , {\"b\":null} ] , \"c\":\"d\" } \n");
  REQUIRE(value.is_object());
  CHECK(value.size() == 2);
  CHECK(value["a"].size() == 2);
  CHECK(value["a"][0].get<int>() == 1);
  CHECK(value["a"][1]["b"].is_null());
  CHECK(value["c"].as_string() == "d");
  CHECK(Json::parse("3").size() == 1);
  CHECK(Json::parse("null").size() == 0);
}

TEST_CASE("integers stay exact within 64 bits and become doubles beyond", "[json]") {
  const Json zero = Json::parse("0");
  CHECK(zero.kind() == Kind::kUnsigned);
  CHECK(zero.get<int>() == 0);

  const Json max = Json::parse("18446744073709551615");
  CHECK(max.kind() == Kind::kUnsigned);
  CHECK(max.get<std::uint64_t>() == std::numeric_limits<std::uint64_t>::max());
  CHECK(max.dump() == "18446744073709551615");

  const Json two_to_64 = Json::parse("18446744073709551616");
  CHECK(two_to_64.kind() == Kind::kFloat);
  CHECK(two_to_64.get<double>() == 18446744073709551616.0);
  const Json huge = Json::parse("100000000000000000000000000000");
  CHECK(huge.kind() == Kind::kFloat);
  CHECK(huge.get<double>() == 1e29);

  const Json minus_one = Json::parse("-1");
  CHECK(minus_one.kind() == Kind::kInteger);
  CHECK(minus_one.get<int>() == -1);

  const Json min = Json::parse("-9223372036854775808");
  CHECK(min.kind() == Kind::kInteger);
  CHECK(min.get<std::int64_t>() == std::numeric_limits<std::int64_t>::min());
  CHECK(min.dump() == "-9223372036854775808");

  const Json below_min = Json::parse("-9223372036854775809");
  CHECK(below_min.kind() == Kind::kFloat);
  CHECK(below_min.get<double>() == -9223372036854775808.0);

  CHECK(Json::parse("1.0").kind() == Kind::kFloat);
  CHECK(Json::parse("1e2").kind() == Kind::kFloat);
  CHECK(Json::parse("1E+2").get<double>() == 100.0);
  CHECK(Json::parse("-0").get<double>() == 0.0);
  CHECK(Json::parse("-0").dump() == "0");

  CHECK(Json(std::numeric_limits<std::int64_t>::min()).kind() == Kind::kInteger);
  CHECK(Json(std::uint64_t{7}).kind() == Kind::kUnsigned);
  CHECK(Json(7).kind() == Kind::kInteger);
  CHECK(Json(7).is_number_integer());
  CHECK(Json(7u).is_number_unsigned());
}

TEST_CASE("floats round-trip exactly through dump and parse", "[json]") {
  std::mt19937_64 random(20261129);
  int checked = 0;
  std::string first_failure;
  for (int i = 0; i < 100000; ++i) {
    const double value = std::bit_cast<double>(random());
    if (!std::isfinite(value)) continue;
    ++checked;
    const std::string text = Json(value).dump();
    const Json back = Json::parse(text);
    if (!back.is_number_float() ||
        std::bit_cast<std::uint64_t>(back.get<double>()) != std::bit_cast<std::uint64_t>(value)) {
      if (first_failure.empty()) first_failure = text;
    }
  }
  INFO("first double that did not round-trip: " << first_failure);
  CHECK(first_failure.empty());
  CHECK(checked > 99000);

  CHECK(Json(0.1).dump() == "0.1");
  CHECK(Json(1e-300).dump() == "1e-300");
  CHECK(Json(5e-324).dump() == "5e-324");
  CHECK(Json(-0.0).dump() == "-0.0");
  CHECK(Json(1.0).dump() == "1.0");
  CHECK(Json(100.0).dump() == "100.0");
  CHECK(Json(-2.5).dump() == "-2.5");
  CHECK(Json(1e300).dump() == "1e+300");
  CHECK(Json(0.5f).dump() == "0.5");
  for (const double value : {0.1, 1e-300, 5e-324, std::numeric_limits<double>::max(),
                             std::numeric_limits<double>::min(), 1.0, 100.0, 1e21, 1e22}) {
    CHECK(Json::parse(Json(value).dump()).get<double>() == value);
  }
  const Json negative_zero = Json::parse(Json(-0.0).dump());
  CHECK(negative_zero.is_number_float());
  CHECK(std::signbit(negative_zero.get<double>()));
  CHECK(Json::parse("1.0").dump() == "1.0");
  CHECK(Json::parse("5e-324").get<double>() == 5e-324);
}

TEST_CASE("NaN and infinities dump as null", "[json]") {
  CHECK(Json(std::numeric_limits<double>::quiet_NaN()).dump() == "null");
  CHECK(Json(std::numeric_limits<double>::infinity()).dump() == "null");
  CHECK(Json(-std::numeric_limits<double>::infinity()).dump() == "null");
  CHECK(Json(std::vector<double>{std::nan(""), 1.0}).dump() == "[null,1.0]");
}

TEST_CASE("string escapes decode to their characters", "[json]") {
  CHECK(Json::parse(R"("\" \\ \/ \b \f \n \r \t")").as_string() == "\" \\ / \b \f \n \r \t");
  CHECK(Json::parse(R"("\u00e9\u00E9")").as_string() == "\xC3\xA9\xC3\xA9");
  CHECK(Json::parse(R"("\u0041\u20ac")").as_string() == "A\xE2\x82\xAC");
  CHECK(Json::parse(R"("\ud83d\ude00")").as_string() == "\xF0\x9F\x98\x80");
  CHECK(Json::parse(R"("\uDBFF\uDFFF")").as_string() == "\xF4\x8F\xBF\xBF");
  CHECK(Json::parse(R"("a\u0000b")").as_string() == std::string("a\0b", 3));
  CHECK(Json::parse("\"caf\xC3\xA9 \xF0\x9F\x98\x80\"").as_string() ==
        "caf\xC3\xA9 \xF0\x9F\x98\x80");
  CHECK(Json::parse("\"\x7F\"").as_string() == "\x7F");  // DEL is no control character to JSON

  CHECK(Json("a\"b\\c/d\n\t").dump() == R"("a\"b\\c/d\n\t")");
  CHECK(Json(std::string("\b\f\r\x01\0", 5)).dump() == R"("\u0008\u000c\u000d\u0001\u0000")");
  CHECK(Json("\xC3\xA9").dump() == "\"\xC3\xA9\"");
  std::string every_ascii;
  for (int c = 0; c < 0x80; ++c) every_ascii += static_cast<char>(c);
  CHECK(Json::parse(Json(every_ascii).dump()).as_string() == every_ascii);
}

TEST_CASE("bad escapes and lone surrogates are refused at the escape", "[json]") {
  CHECK(syntax_error_offset(R"("\ud800")") == 1);
  CHECK(syntax_error_offset(R"("ab\udc00")") == 3);
  CHECK(syntax_error_offset(R"("\ud800\u0041")") == 1);
  CHECK(syntax_error_offset(R"("\ud800x")") == 1);
  CHECK(syntax_error_offset(R"("\ud800\ud800")") == 1);
  CHECK(syntax_error_offset(R"("a\x")") == 2);
  CHECK(syntax_error_offset(R"("\U00e9")") == 1);
  CHECK(syntax_error_offset(R"("\u12G4")") == 3);
  CHECK(syntax_error_offset(R"("\u-123")") == 3);
  CHECK(syntax_error_offset(R"("\u+123")") == 3);
  CHECK(syntax_error_offset(R"("\u 123")") == 3);
  CHECK(syntax_error_offset(R"("\u12")") == 3);
}

TEST_CASE("control characters inside strings must be escaped", "[json]") {
  CHECK(syntax_error_offset("\"a\x01\"") == 2);
  CHECK(syntax_error_offset("\"\n\"") == 1);
  CHECK(syntax_error_offset("\"ab\t\"") == 3);
  CHECK(syntax_error_offset(std::string("\"\0\"", 3)) == 1);
  CHECK(syntax_error_offset("\"\x1F\"") == 1);
}

TEST_CASE("invalid UTF-8 is refused by parse at its byte and by dump", "[json]") {
  CHECK(syntax_error_offset("\"ab\xC0\x80\"") == 3);        // overlong NUL
  CHECK(syntax_error_offset("\"\xC1\xBF\"") == 1);          // overlong 2-byte
  CHECK(syntax_error_offset("\"\xE0\x80\xAF\"") == 1);      // overlong 3-byte
  CHECK(syntax_error_offset("\"\xF0\x80\x80\xAF\"") == 1);  // overlong 4-byte
  CHECK(syntax_error_offset("\"x\xED\xA0\x80\"") == 2);     // U+D800, a surrogate
  CHECK(syntax_error_offset("\"\xF4\x90\x80\x80\"") == 1);  // above U+10FFFF
  CHECK(syntax_error_offset("\"\xF5\x80\x80\x80\"") == 1);  // no such lead byte
  CHECK(syntax_error_offset("\"\xFF\"") == 1);
  CHECK(syntax_error_offset("\"\x80\"") == 1);          // a lone continuation byte
  CHECK(syntax_error_offset("\"\xE2\x82\"") == 1);      // cut short by the quote
  CHECK(syntax_error_offset("\"ok\xF0\x9F\x98") == 3);  // cut short by the end
  CHECK(syntax_error_offset("{\"\xC3\":1}") == 2);      // in a key
  CHECK(Json::parse("\"\xF4\x8F\xBF\xBF\xEF\xBF\xBF\"").as_string() ==
        "\xF4\x8F\xBF\xBF\xEF\xBF\xBF");  // U+10FFFF and U+FFFF are valid

  for (const char* bad : {"\xC0\x80", "\xED\xA0\x80", "\xF5\x80\x80\x80", "\xE2\x82", "ok\xF0"}) {
    INFO("bytes: " << bad);
    CHECK_THROWS_AS(Json(bad).dump(), JsonError);
    CHECK_THROWS_AS(Json::array({1, bad}).dump(), JsonError);
    CHECK_THROWS_AS(Json::object({{bad, 1}}).dump(2), JsonError);
  }
  CHECK_THROWS_WITH(Json("a\xFF").dump(), Contains("UTF-8"));
}

TEST_CASE("the grammar is strict and errors name the byte offset", "[json]") {
  const std::pair<std::string_view, std::size_t> cases[] = {
      {"[1,]", 3},        // trailing comma in an array
      {"{\"a\":1,}", 7},  // trailing comma in an object
      {"[1 2]", 3},       // missing comma
      {"01", 1},          // leading zero
      {"-01", 2},
      {"[00]", 2},
      {"1.", 2},  // no digit after the point
      {"1.e5", 2},
      {".5", 0},
      {"+1", 0},
      {"-", 1},
      {"- 1", 1},
      {"1e", 2},
      {"1e+", 3},
      {"[1] // comment", 4},
      {"/* comment */ 1", 0},
      {"'a'", 0},  // single quotes
      {"{'a':1}", 1},
      {"NaN", 0},
      {"Infinity", 0},
      {"-Infinity", 1},
      {"tru", 3},  // the first character that differs from true: the end
      {"True", 0},
      {"nulll", 4},  // trailing text after a value
      {"1 2", 2},
      {"{} {}", 3},
      {"[1]]", 3},
      {"", 0},  // empty input
      {"  \n ", 4},
      {"\"abc", 4},  // unclosed string
      {"\"a\\", 3},
      {"[1,2", 4},  // unclosed array
      {"[", 1},
      {"{\"a\":1", 6},  // unclosed object
      {"{\"a\"", 4},
      {"{\"a\" 1}", 5},
      {"{", 1},
      {"{1:2}", 1},  // a key that is no string
      {"\v1", 0},    // not JSON whitespace
      {"\xC2\xA0"
       "1",
       0},           // nor is U+00A0
      {"1e400", 0},  // out of the range of a double
  };
  for (const auto& [text, offset] : cases) {
    INFO("text: " << text);
    CHECK(syntax_error_offset(text) == offset);
  }
  CHECK_THROWS_WITH(Json::parse("[1,]"), Contains("at byte 3"));
}

TEST_CASE("duplicate keys are refused with the key and the object's pointer", "[json]") {
  const JsonError top = parse_error(R"({"a":1,"b":2,"a":3})");
  CHECK(top.reason() == Reason::kDuplicateKey);
  CHECK(top.key() == "a");
  CHECK(top.object_pointer() == "");
  CHECK(offset_of(top) == 13);

  const std::string nested_text = R"({"x":[{"y":{"k":1,"k":2}}]})";
  const JsonError nested = parse_error(nested_text);
  CHECK(nested.reason() == Reason::kDuplicateKey);
  CHECK(nested.key() == "k");
  CHECK(nested.object_pointer() == "/x/0/y");
  CHECK(offset_of(nested) == nested_text.rfind("\"k\""));

  const JsonError escaped = parse_error(R"({"a/b":{"m~n":[0,{"k":1,"\u006b":2}]}})");
  CHECK(escaped.reason() == Reason::kDuplicateKey);
  CHECK(escaped.key() == "k");
  CHECK(escaped.object_pointer() == "/a~1b/m~0n/1");

  // The same key under different objects is no duplicate.
  CHECK_NOTHROW(Json::parse(R"({"a":{"k":1},"b":{"k":2},"k":[{"k":3}]})"));
}

TEST_CASE("duplicates in large objects name the earliest repeat in text order", "[json]") {
  // More than 32 keys: checked once, sorted, at the end of the object. The first repeat in the
  // text (k39 at index 40) is neither the smallest repeated key (k00) nor its last occurrence.
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < 40; ++i) keys.push_back(numbered_key(i));
  for (const char* repeat : {"k39", "k00", "k39", "k00"}) keys.push_back(repeat);
  const auto [text, offsets] = object_text(keys);
  const JsonError e = parse_error(text);
  CHECK(e.reason() == Reason::kDuplicateKey);
  CHECK(e.key() == "k39");
  CHECK(e.object_pointer() == "");
  CHECK(offset_of(e) == offsets[40]);

  // The 33rd key, the first one the key-by-key check leaves to the sorted one.
  std::vector<std::string> boundary_keys;
  for (std::size_t i = 0; i < 32; ++i) boundary_keys.push_back(numbered_key(i));
  boundary_keys.push_back("k31");
  const auto [boundary_text, boundary_offsets] = object_text(boundary_keys);
  const JsonError boundary = parse_error(boundary_text);
  CHECK(boundary.key() == "k31");
  CHECK(offset_of(boundary) == boundary_offsets[32]);

  // Inside another object: the pointer names the inner one, the offset is in the whole text.
  const std::string outer = "{\"outer\":" + text + "}";
  const JsonError inner = parse_error(outer);
  CHECK(inner.key() == "k39");
  CHECK(inner.object_pointer() == "/outer");
  CHECK(offset_of(inner) == offsets[40] + 9);

  std::vector<std::string> distinct;
  for (std::size_t i = 0; i < 1000; ++i) distinct.push_back(numbered_key(i));
  CHECK(Json::parse(object_text(distinct).first).size() == 1000);
}

TEST_CASE("nesting deeper than max_depth is refused", "[json]") {
  const JsonParseOptions three{3};
  CHECK_NOTHROW(Json::parse("[[[]]]", three));
  CHECK_NOTHROW(Json::parse(R"({"a":{"b":{"c":[]}}})", JsonParseOptions{4}));
  CHECK_NOTHROW(Json::parse(R"([{"a":[1]}])", three));
  const JsonError arrays = parse_error("[[[[]]]]", three);
  CHECK(arrays.reason() == Reason::kTooDeep);
  CHECK(offset_of(arrays) == 3);
  const std::string objects_text = R"({"a":{"b":{"c":{}}}})";
  const JsonError objects = parse_error(objects_text, three);
  CHECK(objects.reason() == Reason::kTooDeep);
  CHECK(offset_of(objects) == objects_text.rfind('{'));
  CHECK(Json::parse("1", JsonParseOptions{0}).get<int>() == 1);
  CHECK(parse_error("[]", JsonParseOptions{0}).reason() == Reason::kTooDeep);

  CHECK_NOTHROW(Json::parse(std::string(128, '[') + std::string(128, ']')));
  const JsonError default_limit = parse_error(std::string(129, '[') + std::string(129, ']'));
  CHECK(default_limit.reason() == Reason::kTooDeep);
  CHECK(offset_of(default_limit) == 128);

  // Refused at depth 129, long before the end: the parser never recurses 100000 deep.
  const JsonError deep_arrays = parse_error(std::string(100000, '['));
  CHECK(deep_arrays.reason() == Reason::kTooDeep);
  CHECK(offset_of(deep_arrays) == 128);
  std::string deep_objects;
  for (int i = 0; i < 100000; ++i) deep_objects += "{\"a\":";
  const JsonError objects_deep = parse_error(deep_objects);
  CHECK(objects_deep.reason() == Reason::kTooDeep);
  CHECK(offset_of(objects_deep) == 128 * 5);
}

TEST_CASE("dump writes compact and indented text exactly", "[json]") {
  const Json value = Json::object({{"a", Json::array({1, 2})}, {"b", Json::object()}});
  CHECK(value.dump() == R"({"a":[1,2],"b":{}})");

  const std::string text = R"({"z":null,"a":[true,false,-1,2.5,"s",[],{}],"m":{"k":0}})";
  CHECK(Json::parse(text).dump() == text);

  const Json nested = Json::object({{"name", "x"},
                                    {"list", Json::array({1, Json::array(), Json::object()})},
                                    {"empty", Json::object()},
                                    {"nested", Json::object({{"k", Json::array({true})}})}});
  CHECK(nested.dump(2) ==
        "{\n"
        "  \"name\": \"x\",\n"
        "  \"list\": [\n"
        "    1,\n"
        "    [],\n"
        "    {}\n"
        "  ],\n"
        "  \"empty\": {},\n"
        "  \"nested\": {\n"
        "    \"k\": [\n"
        "      true\n"
        "    ]\n"
        "  }\n"
        "}");
  CHECK(Json::parse(nested.dump(2)) == nested);
  CHECK(Json::array({1}).dump(4) == "[\n    1\n]");
  CHECK(Json(3).dump(2) == "3");
  CHECK(Json::array().dump(2) == "[]");
  CHECK(Json().dump() == "null");
}

TEST_CASE("objects keep their members in insertion order", "[json]") {
  Json value;
  value["z"] = 1;
  value["a"] = 2;
  value["m"] = 3;
  value["z"] = 4;  // assigning an existing key keeps its place
  REQUIRE(value.items().size() == 3);
  CHECK(value.items()[0].first == "z");
  CHECK(value.items()[1].first == "a");
  CHECK(value.items()[2].first == "m");
  CHECK(value.dump() == R"({"z":4,"a":2,"m":3})");
  CHECK(Json::parse(R"({"b":1,"a":2,"c":3})").dump() == R"({"b":1,"a":2,"c":3})");
  CHECK(Json::object({{"y", 1}, {"x", 2}}).items()[0].first == "y");
}

TEST_CASE("operator[] adds members and refuses what is not there", "[json]") {
  Json value;
  value["a"]["b"] = "c";  // null becomes an object, missing keys become null first
  CHECK(value.dump() == R"({"a":{"b":"c"}})");
  Json& added = value["new"];
  CHECK(added.is_null());
  CHECK(value.size() == 2);

  const Json& constant = value;
  CHECK(constant["a"]["b"].as_string() == "c");
  try {
    (void)constant["missing"];
    FAIL("const operator[] found a missing key");
  } catch (const JsonError& e) {
    CHECK(e.reason() == Reason::kMissingKey);
    CHECK_THAT(e.what(), Contains("missing"));
  }
  CHECK(value.size() == 2);  // and added nothing

  Json array = Json::array({1, 2});
  CHECK(array[1].get<int>() == 2);
  array[1] = "two";
  CHECK(array.dump() == R"([1,"two"])");
  CHECK_THROWS_AS(array[2], JsonError);
  const Json& constant_array = array;
  CHECK_THROWS_AS(constant_array[2], JsonError);
  CHECK_THROWS_AS(Json::array()[0], JsonError);

  try {
    array["key"];
    FAIL("an array took a key");
  } catch (const JsonError& e) {
    CHECK(e.reason() == Reason::kWrongKind);
  }
  Json object = Json::object({{"a", 1}});
  CHECK_THROWS_AS(object[std::size_t{0}], JsonError);

  Json list;
  list.push_back(1);
  list.push_back("x");
  CHECK(list.dump() == R"([1,"x"])");
  CHECK_THROWS_AS(object.push_back(1), JsonError);
}

TEST_CASE("get of the wrong kind throws kWrongKind", "[json]") {
  const auto reason_of = [](auto&& call) {
    try {
      call();
    } catch (const JsonError& e) {
      return e.reason();
    }
    FAIL("did not throw");
    return Reason::kSyntax;
  };
  CHECK(reason_of([] { (void)Json("s").get<int>(); }) == Reason::kWrongKind);
  CHECK(reason_of([] { (void)Json(1).get<std::string>(); }) == Reason::kWrongKind);
  CHECK(reason_of([] { (void)Json(1).get<bool>(); }) == Reason::kWrongKind);
  CHECK(reason_of([] { (void)Json(true).get<double>(); }) == Reason::kWrongKind);
  CHECK(reason_of([] { (void)Json().get<int>(); }) == Reason::kWrongKind);
  CHECK(reason_of([] { (void)Json().as_string(); }) == Reason::kWrongKind);
  CHECK(reason_of([] { (void)Json::array().items(); }) == Reason::kWrongKind);
  CHECK(reason_of([] { (void)Json::object().elements(); }) == Reason::kWrongKind);
  CHECK_THROWS_WITH(Json("s").get<int>(), Contains("a string"));

  CHECK(Json(3).get<double>() == 3.0);
  CHECK(Json(7u).get<int>() == 7);
  CHECK(Json(2.75).get<float>() == 2.75f);
  CHECK(Json("s").get<std::string>() == "s");
}

TEST_CASE("value find contains and erase", "[json]") {
  Json value = Json::object({{"a", 1}, {"b", "x"}, {"c", nullptr}});
  CHECK(value.value("a", 5).get<int>() == 1);
  CHECK(value.value("missing", 5).get<int>() == 5);
  CHECK(value.value("c", 5).is_null());
  CHECK(Json::array({1}).value("a", "fallback").as_string() == "fallback");

  REQUIRE(value.find("b") != nullptr);
  CHECK(value.find("b")->as_string() == "x");
  CHECK(value.find("missing") == nullptr);
  CHECK(value.contains("c"));
  CHECK_FALSE(value.contains("missing"));
  CHECK_FALSE(Json::array({"a"}).contains("a"));
  CHECK_FALSE(Json("a").contains("a"));
  CHECK_FALSE(Json().contains("a"));
  CHECK(Json::array({"a"}).find("a") == nullptr);

  CHECK(value.erase("b"));
  CHECK_FALSE(value.erase("b"));
  CHECK_FALSE(value.contains("b"));
  CHECK(value.dump() == R"({"a":1,"c":null})");
  CHECK_THROWS_AS(Json::array().erase("a"), JsonError);
}

TEST_CASE("at_pointer follows RFC 6901", "[json]") {
  const Json doc =
      Json::parse(R"({"a/b":{"m~n":[10,20,{"x":null}]},"":5,"arr":[[1]],"~1":7,"a":{"b":8}})");
  CHECK(doc.at_pointer("") == &doc);
  REQUIRE(doc.at_pointer("/a~1b/m~0n/1") != nullptr);
  CHECK(doc.at_pointer("/a~1b/m~0n/1")->get<int>() == 20);
  REQUIRE(doc.at_pointer("/a~1b/m~0n/2/x") != nullptr);
  CHECK(doc.at_pointer("/a~1b/m~0n/2/x")->is_null());
  REQUIRE(doc.at_pointer("/") != nullptr);
  CHECK(doc.at_pointer("/")->get<int>() == 5);
  CHECK(doc.at_pointer("/arr/0/0")->get<int>() == 1);
  CHECK(doc.at_pointer("/~01")->get<int>() == 7);  // "~01" is "~1", not "/"
  CHECK(doc.at_pointer("/a/b")->get<int>() == 8);
  CHECK(doc.at_pointer("/a~1b/m~0n/0")->get<int>() == 10);

  CHECK(doc.at_pointer("/a~1b/m~0n/01") == nullptr);  // leading zero
  CHECK(doc.at_pointer("/a~1b/m~0n/00") == nullptr);
  CHECK(doc.at_pointer("/a~1b/m~0n/3") == nullptr);  // past the end
  CHECK(doc.at_pointer("/a~1b/m~0n/-") == nullptr);
  CHECK(doc.at_pointer("/a~1b/m~0n/+1") == nullptr);
  CHECK(doc.at_pointer("/a~1b/m~0n/") == nullptr);
  CHECK(doc.at_pointer("/a~1b/m~0n/1x") == nullptr);
  CHECK(doc.at_pointer("/missing") == nullptr);
  CHECK(doc.at_pointer("/missing/0") == nullptr);
  CHECK(doc.at_pointer("/arr/0/0/deeper") == nullptr);
  CHECK(doc.at_pointer("/m~n") == nullptr);
  CHECK(doc.at_pointer("a") == nullptr);  // no leading slash
}

TEST_CASE("construction from vectors and initializer lists", "[json]") {
  CHECK(Json(std::vector<double>{1.5, 2}).dump() == "[1.5,2.0]");
  CHECK(Json(std::vector<std::vector<std::int64_t>>{{1, -2}, {}}).dump() == "[[1,-2],[]]");
  CHECK(Json(std::vector<std::string>{"a", "b"}).dump() == R"(["a","b"])");
  CHECK(Json(std::vector<int>{}).dump() == "[]");
  CHECK(Json::object({{"loss", 0.5}, {"epoch", 3}}).dump() == R"({"loss":0.5,"epoch":3})");
  CHECK(Json::array({1, "a", nullptr, true, 2.0}).dump() == R"([1,"a",null,true,2.0])");
  CHECK(Json::array().dump() == "[]");
  CHECK(Json::object().dump() == "{}");
  CHECK(Json(nullptr).is_null());
  CHECK(Json(std::string_view("sv")).as_string() == "sv");
  CHECK(Json(0.5f).kind() == Kind::kFloat);
  CHECK(Json(true).kind() == Kind::kBoolean);
  CHECK(Json(std::optional<double>()).is_null());
  CHECK(Json(std::optional<double>(0.25)).dump() == "0.25");
  CHECK(Json(std::optional<std::int64_t>(-3)).kind() == Kind::kInteger);
  CHECK(Json::object({{"top5", std::optional<double>()}}).dump() == R"({"top5":null})");
}

TEST_CASE("equality compares numbers by value and objects as sets", "[json]") {
  CHECK(Json(1) == Json(1u));
  CHECK(Json(1u) == Json(1.0));
  CHECK(Json(1) == Json(1.0));
  CHECK(Json(-1) == Json(-1.0));
  CHECK(Json(0) == Json(-0.0));
  CHECK(Json(-1) != Json(std::numeric_limits<std::uint64_t>::max()));
  CHECK(Json(std::numeric_limits<std::int64_t>::max()) ==
        Json(std::uint64_t{std::numeric_limits<std::int64_t>::max()}));
  CHECK(Json(1) != Json(2u));
  CHECK(Json(1.5) != Json(1));
  CHECK(Json(1) != Json("1"));
  CHECK(Json(true) != Json(1));
  CHECK(Json() == Json(nullptr));
  CHECK(Json() != Json::object());
  CHECK(Json::array() != Json::object());
  CHECK(Json("a") == Json(std::string("a")));

  CHECK(Json::parse("[1,2]") == Json::array({1u, 2.0}));
  CHECK(Json::parse("[1,2]") != Json::parse("[2,1]"));
  CHECK(Json::parse("[1,2]") != Json::parse("[1,2,3]"));
  CHECK(Json::parse(R"({"a":1,"b":[{"c":2,"d":3}]})") ==
        Json::parse(R"({"b":[{"d":3,"c":2}],"a":1.0})"));
  CHECK(Json::parse(R"({"a":1,"b":2})") != Json::parse(R"({"a":1})"));
  CHECK(Json::parse(R"({"a":1})") != Json::parse(R"({"a":1,"b":2})"));
  CHECK(Json::parse(R"({"a":1})") != Json::parse(R"({"b":1})"));
  CHECK(Json::parse(R"({"a":1})") != Json::parse(R"({"a":2})"));
}

// 2^53 + 1 has no double; the double nearest it is 2^53. As values they differ, and equality
// that says otherwise is not transitive (2^53+1 == 2^53.0 == 2^53, yet 2^53+1 != 2^53).
TEST_CASE("equality of integers and doubles is exact beyond 2^53", "[json]") {
  const Json odd(std::uint64_t{9007199254740993});  // 2^53 + 1
  const Json even(std::uint64_t{9007199254740992});
  const Json even_double(9007199254740992.0);
  CHECK(odd != even);
  CHECK(even == even_double);
  CHECK(odd != even_double);
  CHECK(Json(std::int64_t{-9007199254740993}) != Json(-9007199254740992.0));
  CHECK(Json(std::numeric_limits<std::uint64_t>::max()) != Json(18446744073709551616.0));
}

// `node = node[0]` walks down a tree: the child must be copied (or moved) out before the members
// that hold it are replaced.
TEST_CASE("assigning a member to the value that holds it", "[json]") {
  const std::string long_string = "a string too long for the small-string buffer";
  Json array = Json::parse(R"([[")" + long_string + R"(",[1,2,3]],5])");
  array = array[0];
  CHECK(array.dump() == R"([")" + long_string + R"(",[1,2,3]])");

  Json object = Json::parse(R"({"x":1,"a":{"b":[1,{"c":")" + long_string + R"("}]}})");
  object = object["a"];
  CHECK(object.dump() == R"({"b":[1,{"c":")" + long_string + R"("}]})");

  Json moved = Json::parse(R"([[[")" + long_string + R"("]],2])");
  moved = std::move(moved[0]);
  CHECK(moved.dump() == R"([[")" + long_string + R"("]])");
}

TEST_CASE("a large document parses and round-trips", "[json]") {
  std::string text = "{";
  for (int i = 0; i < 20000; ++i) {
    if (i > 0) text += ',';
    const std::string n = std::to_string(i);
    text += "\"key" + n + "\":[" + n + "," + std::to_string(-i - 1) + "," + n + ".5,\"s" + n +
            "\",{\"n\":null}]";
  }
  text += '}';
  const Json value = Json::parse(text);
  REQUIRE(value.size() == 20000);
  CHECK(value.items()[0].first == "key0");
  CHECK(value.items()[19999].first == "key19999");
  CHECK(value["key123"][2].get<double>() == 123.5);
  const std::string dumped = value.dump();
  CHECK(dumped == text);  // the text is already in dump()'s canonical form
  const Json again = Json::parse(dumped);
  CHECK(again == value);
  CHECK(again.dump() == dumped);
  CHECK(Json::parse(value.dump(1)) == value);
}

TEST_CASE("Python's json module reads what dump writes as it reads the original", "[json]") {
  const std::filesystem::path python = "/usr/bin/python3";
  if (!std::filesystem::exists(python)) {
    WARN("skipped part: /usr/bin/python3 is not installed");
    return;
  }
  const std::string original =
      R"({"ints":[0,-1,42,-9223372036854775808,9223372036854775807,18446744073709551615],)"
      R"("floats":[0.1,-2.5,1e-300,5e-324,1.7976931348623157e308,-0.0,1E2,123.456e-7,3.0],)"
      R"("strings":["plain","\" \\ \/ \b \f \n \r \t","\u00e9\u20ac","\ud83d\ude00","\u0000\u001f",)"
      "\"caf\xC3\xA9 \xF0\x9F\x98\x80\"],"
      R"("nested":{"empty_array":[],"empty_object":{},"deep":[[[{"k":[true,false,null]}]]]},)"
      R"("order":{"b":1,"a":2}})";
  const coltrain::testing::TempDir dir("coltrain_json_python");
  const auto write = [&](const char* name, const std::string& content) {
    std::ofstream out(dir / name, std::ios::binary);
    out << content;
    return dir / name;
  };
  const auto python_reads = [&](const std::filesystem::path& file) {
    const std::string command =
        python.string() +
        " -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1],"
        " encoding=\"utf-8\")), sort_keys=True))' " +
        file.string();
    std::string output;
    FILE* pipe = ::popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;)
      output.append(buffer, n);
    CHECK(::pclose(pipe) == 0);
    return output;
  };
  const std::string expected = python_reads(write("original.json", original));
  REQUIRE_FALSE(expected.empty());
  const Json value = Json::parse(original);
  CHECK(python_reads(write("compact.json", value.dump())) == expected);
  CHECK(python_reads(write("indented.json", value.dump(2))) == expected);
}
