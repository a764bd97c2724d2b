// JSON text (core/json.hpp's Json::parse, with the default depth limit): any input either parses
// or is refused with a JsonError. What parses must come back from its dump() equal, and dump() is
// canonical: the value read back dumps to the same bytes. json.dict gives the fuzzer the grammar's
// tokens.

#include <coltrain/core/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"

namespace {

// Parsing what dump() wrote must not fail; a JsonError here is a broken promise, not a refusal.
coltrain::Json reparse(const std::string& text, const char* what) {
  try {
    return coltrain::Json::parse(text);
  } catch (const coltrain::JsonError&) {
    coltrain::fuzz::fuzz_check(false, what);
    throw;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using coltrain::fuzz::fuzz_check;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  coltrain::Json value;
  try {
    value = coltrain::Json::parse(text);
  } catch (const coltrain::JsonError&) {
    return 0;
  }
  // A parsed value holds valid UTF-8 and finite numbers only, so dump() must not throw either.
  std::string compact;
  std::string indented;
  try {
    compact = value.dump();
    indented = value.dump(2);
  } catch (const coltrain::JsonError&) {
    fuzz_check(false, "json: dump() of a parsed value throws");
  }
  const coltrain::Json again = reparse(compact, "json: dump() re-parses");
  fuzz_check(again == value, "json: parse(dump(v)) == v");
  fuzz_check(again.dump() == compact, "json: dump() is canonical");
  fuzz_check(reparse(indented, "json: dump(2) re-parses") == value, "json: parse(dump(2)) == v");
  return 0;
}
