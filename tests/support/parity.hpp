#pragma once
// Helpers for parity tests against PyTorch (coltrain_add_parity_test): the references a Python
// script wrote as safetensors, and a closeness check that reports the worst element, not just
// "false".

#include <catch2/catch.hpp>
#include <coltrain/core/dtype.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/tensor/safetensors.hpp>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <ranges>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

namespace coltrain::testing {

// $COLTRAIN_PARITY_DIR/<file_name>, which CTest's "<suite>.references" test wrote.
inline tensor::SafetensorsReader parity_reference(std::string_view file_name) {
  const char* dir = std::getenv("COLTRAIN_PARITY_DIR");
  if (dir == nullptr || *dir == '\0') {
    ErrorContext context;
    context.operation = "parity_reference";
    context.file = std::string(file_name);
    throw ConfigError(
        "COLTRAIN_PARITY_DIR is not set, so there are no PyTorch references to read; run parity "
        "tests through CTest, which runs the reference script first and sets it",
        context);
  }
  return tensor::SafetensorsReader(std::filesystem::path(dir) / file_name);
}

namespace detail {

template <class T>
double parity_value(T value) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return static_cast<double>(static_cast<float>(value));
  } else {
    return static_cast<double>(value);
  }
}

// |a - e| / max(|e|, floor). Matching NaNs and equal infinities count as exact; any other NaN or
// infinity is an infinite error, so it always fails.
inline double parity_relative_error(double actual, double expected, double floor) {
  if (std::isnan(actual) || std::isnan(expected)) {
    return std::isnan(actual) && std::isnan(expected) ? 0.0
                                                      : std::numeric_limits<double>::infinity();
  }
  if (actual == expected) return 0.0;
  const double difference = std::abs(actual - expected);
  const double scale = std::max(std::abs(expected), floor);
  if (!std::isfinite(difference) || scale == 0.0) return std::numeric_limits<double>::infinity();
  return difference / scale;
}

}  // namespace detail

// Requires every element's relative error, |a - e| / max(|e|, abs), to be at most rel: `abs` is the
// magnitude below which errors are measured against abs instead of |e|, so values near zero are
// held to an absolute tolerance of rel * abs. On failure reports the worst element (flat index,
// both values, its error) and how many elements are out of tolerance.
template <class T>
void require_close(std::span<const T> actual, std::span<const T> expected, double rel, double abs,
                   std::string_view what) {
  INFO(what << ": comparing " << actual.size() << " elements with " << expected.size()
            << " expected");
  REQUIRE(actual.size() == expected.size());
  std::size_t worst = 0;
  double worst_error = 0.0;
  std::size_t failing = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double error = detail::parity_relative_error(detail::parity_value(actual[i]),
                                                       detail::parity_value(expected[i]), abs);
    if (error > rel) ++failing;
    if (error > worst_error) {
      worst_error = error;
      worst = i;
    }
  }
  std::ostringstream report;
  report << std::setprecision(9) << what << ": worst element [" << worst << "]";
  if (!actual.empty()) {
    report << " actual " << detail::parity_value(actual[worst]) << ", expected "
           << detail::parity_value(expected[worst]);
  }
  report << ", relative error " << worst_error << " (tolerance rel " << rel << ", floor " << abs
         << "); " << failing << " of " << actual.size() << " elements out of tolerance";
  INFO(report.str());
  REQUIRE(worst_error <= rel);
}

// The same for any contiguous containers (std::vector...), so callers need not build spans.
template <std::ranges::contiguous_range Actual, std::ranges::contiguous_range Expected>
requires std::is_same_v<std::ranges::range_value_t<Actual>, std::ranges::range_value_t<Expected>>
void require_close(const Actual& actual, const Expected& expected, double rel, double abs,
                   std::string_view what) {
  using T = std::ranges::range_value_t<Actual>;
  require_close<T>(std::span<const T>(std::ranges::data(actual), std::ranges::size(actual)),
                   std::span<const T>(std::ranges::data(expected), std::ranges::size(expected)),
                   rel, abs, what);
}

}  // namespace coltrain::testing
