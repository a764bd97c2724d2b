// Must-not-compile test: asking for the DataType of a type coltrain cannot store has to stop the
// build with the library's static_assert message, not an error about an incomplete class. The build
// compiles this file twice: as is, which must succeed (so the failure is not a typo or a missing
// include), and with COLTRAIN_SHOULD_FAIL, which must fail with this message:
// expected-error: coltrain: unsupported element type

#include <coltrain/core/dtype.hpp>

#include <string>

int main() {
#ifdef COLTRAIN_SHOULD_FAIL
  constexpr coltrain::DataType type = coltrain::data_type_v<std::string>;
#else
  constexpr coltrain::DataType type = coltrain::data_type_v<float>;
#endif
  return type == coltrain::DataType::kFloat32 ? 0 : 1;
}
