#pragma once
// The widest vector the target's registers hold (-march decides: AVX-512, AVX, else 16 bytes),
// which the CPU products' code is written for, and the inline namespace that puts it in their
// symbols.
//
// Under COLTRAIN_SEPARATE_COMPILATION the float kernels and the Eigen products are compiled once,
// in the file that includes <coltrain/src.hpp>. A program whose files disagree on the width
// (src.hpp compiled without the -march=native of the others) would then run the narrower code,
// slowly and silently; with the width in the symbols it fails to link instead, naming it
// (vector_bytes_64...).

#if defined(__AVX512F__)
#define COLTRAIN_CPU_VECTOR_BYTES 64
#elif defined(__AVX__)
#define COLTRAIN_CPU_VECTOR_BYTES 32
#else
#define COLTRAIN_CPU_VECTOR_BYTES 16
#endif

#define COLTRAIN_DETAIL_VECTOR_ABI_NAME(bytes) vector_bytes_##bytes
#define COLTRAIN_DETAIL_VECTOR_ABI(bytes) COLTRAIN_DETAIL_VECTOR_ABI_NAME(bytes)
// `inline namespace COLTRAIN_CPU_VECTOR_ABI { ... }` around a declaration that depends on the
// width.
#define COLTRAIN_CPU_VECTOR_ABI COLTRAIN_DETAIL_VECTOR_ABI(COLTRAIN_CPU_VECTOR_BYTES)
