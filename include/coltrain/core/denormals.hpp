#pragma once
// Flush-to-zero for the training kernels. Products of small gradients reach subnormal floats, which
// x86 cores handle in microcode, at up to a hundred times the cost of a normal operation; flushing
// them (as TensorFlow does by default) changes results only below 1e-38. The scope restores the
// caller's floating-point mode on exit, so code outside coltrain's kernels is unaffected.

#include <coltrain/core/config.hpp>

namespace coltrain {

class FlushDenormalsScope {
 public:
#if defined(__SSE__) && (defined(__GNUC__) || defined(__clang__))
  FlushDenormalsScope() : saved_(__builtin_ia32_stmxcsr()) {
    __builtin_ia32_ldmxcsr(saved_ | kFlushToZero | kDenormalsAreZero);
  }
  ~FlushDenormalsScope() { __builtin_ia32_ldmxcsr(saved_); }
#else
  FlushDenormalsScope() = default;
#endif
  FlushDenormalsScope(const FlushDenormalsScope&) = delete;
  FlushDenormalsScope& operator=(const FlushDenormalsScope&) = delete;

 private:
#if defined(__SSE__) && (defined(__GNUC__) || defined(__clang__))
  static constexpr unsigned kFlushToZero = 0x8000;      // MXCSR.FTZ: subnormal results become 0
  static constexpr unsigned kDenormalsAreZero = 0x0040;  // MXCSR.DAZ: subnormal inputs read as 0
  unsigned saved_;
#endif
};

}  // namespace coltrain
