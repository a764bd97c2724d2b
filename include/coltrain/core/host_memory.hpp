#pragma once
// Host memory for tensors and buffers: zeroed and 64-byte aligned (a cache line and an AVX-512
// vector); from 2 MiB up also aligned to 2 MiB and advised as transparent huge pages
// (madvise MADV_HUGEPAGE), as PyTorch's CPU allocator does under THP_MEM_ALLOC_ENABLE=1.
//
// Why: where the kernel's THP policy is "madvise" (Debian's default), large arrays otherwise sit on
// 4 KiB pages. A 64 MB allreduce between ranks on one host then spends much of its time pinning
// pages for the peer's copy and missing the TLB, and so do convolutions over large activations
// (docs/benchmarks.md, "Huge pages"). Where the policy is "always" (RHEL's default) this changes
// only the alignment; where it is "never", nothing. The cost: an array of n >= 2 MiB bytes may
// occupy up to n rounded up to 2 MiB. COLTRAIN_HUGE_PAGES=0 leaves the advice out.

#include <coltrain/core/error.hpp>

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

namespace coltrain {

inline constexpr std::size_t kCacheLineAlignment = 64;
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// A value of COLTRAIN_HUGE_PAGES: unset or empty, or 1 (the default), or 0. Throws ConfigError for
// anything else.
inline bool parse_huge_pages(const char* value) {
  if (value == nullptr || *value == '\0') return true;
  const std::string text = value;
  if (text != "0" && text != "1")
    throw ConfigError("COLTRAIN_HUGE_PAGES=" + text + ": expected 1 (the default) or 0");
  return text == "1";
}

// COLTRAIN_HUGE_PAGES, read once.
inline bool huge_pages_wanted() {
  static const bool wanted = parse_huge_pages(std::getenv("COLTRAIN_HUGE_PAGES"));
  return wanted;
}

// `bytes` (> 0) zeroed bytes, to be released with free_host_memory. Throws std::bad_alloc.
inline void* allocate_host_memory(std::size_t bytes) {
  const bool huge = bytes >= kHugePageBytes && huge_pages_wanted();
  const std::size_t alignment = huge ? kHugePageBytes : kCacheLineAlignment;
  if (bytes > SIZE_MAX - alignment) throw std::bad_alloc();
  // aligned_alloc takes a multiple of the alignment.
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* memory = std::aligned_alloc(alignment, rounded);
  if (memory == nullptr) throw std::bad_alloc();
  // Before the first touch, so that the zeroing below already faults in huge pages. Only advice:
  // a kernel without THP refuses it, and the memory works as it is.
  if (huge) ::madvise(memory, rounded, MADV_HUGEPAGE);
  std::memset(memory, 0, rounded);
  return memory;
}

inline void free_host_memory(void* memory) noexcept { std::free(memory); }

}  // namespace coltrain
