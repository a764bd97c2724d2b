#pragma once
// A string as a JSON string literal, for the few JSON files coltrain writes by hand where a JSON
// library would be too heavy to pull into every header (the flight recorder, the timeline).

#include <cstdio>
#include <string>
#include <string_view>

namespace coltrain::detail {

// Appends `text` to `out` between double quotes, with quotes, backslashes and control characters
// escaped as JSON requires.
inline void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace coltrain::detail
