// The error formatting of core/error.hpp. Header-only builds include this file at the end of
// core/error.hpp; with COLTRAIN_SEPARATE_COMPILATION only <coltrain/src.hpp> includes it, so the
// string building is compiled once instead of in every file that can throw.
#pragma once

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>

#include <string>
#include <utility>

namespace coltrain::detail {

COLTRAIN_DECL std::string describe(const ErrorContext& c) {
  // Plain appends rather than a stream: every header that reports errors includes this one, and
  // <sstream> alone costs a quarter of a second in each translation unit.
  std::string out;
  const auto field = [&out](const std::string& text) {
    if (!out.empty()) out += ", ";
    out += text;
  };
  if (c.rank) field("rank " + std::to_string(*c.rank));
  if (c.peer) field("peer " + std::to_string(*c.peer));
  if (!c.operation.empty()) field("operation " + c.operation);
  if (c.sequence) field("sequence #" + std::to_string(*c.sequence));
  if (!c.file.empty()) field(c.line ? c.file + ':' + std::to_string(*c.line) : "file " + c.file);
  if (c.offset) field("offset " + std::to_string(*c.offset));
  return out;
}

COLTRAIN_DECL std::string format_error(const std::string& message, const ErrorContext& c) {
  std::string where = describe(c);
  return where.empty() ? "coltrain: " + message : "coltrain: " + message + " [" + where + "]";
}

[[noreturn]] COLTRAIN_DECL void throw_backend_error(const char* library, long code,
                                                    const std::string& reason, const char* call,
                                                    const char* file, int line) {
  ErrorContext context;
  context.operation = call;
  context.file = file;
  context.line = line;
  throw BackendError(library, code, reason, std::move(context));
}

}  // namespace coltrain::detail
