#pragma once
// A count read from one of coltrain's environment variables (COLTRAIN_TRACE_RECORDS,
// COLTRAIN_TRACE_EVENTS): unset or empty gives the default; anything but a whole number in range
// is a ConfigError naming the variable and the range.

#include <coltrain/core/error.hpp>

#include <cstddef>
#include <cstdlib>
#include <string>

namespace coltrain::detail {

// `what` names the unit in the error ("records", "events").
inline std::size_t count_from_env(const char* name, std::size_t fallback, long long most,
                                  const char* what) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*end != '\0' || value < 1 || value > most) {
    throw ConfigError(std::string(name) + "=" + text + ": expected a number of " + what +
                      " from 1 to " + std::to_string(most));
  }
  return static_cast<std::size_t>(value);
}

}  // namespace coltrain::detail
