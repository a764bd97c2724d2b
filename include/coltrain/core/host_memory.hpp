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
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
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

namespace detail {

// The blocks advised as huge pages in this process, by address: the transport asks where a payload
// lies (single copy between the ranks of a host pays only on huge pages; CommOptions). Never
// destroyed, so that blocks freed during static destruction still find it.
struct HugePageBlocks {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> blocks;  // start -> bytes
};
inline HugePageBlocks& huge_page_blocks() {
  static auto* blocks = new HugePageBlocks;
  return *blocks;
}

// Whether the kernel backs all anonymous memory with huge pages where it can (THP "always").
inline bool transparent_huge_pages_always() {
  static const bool always = [] {
    std::ifstream policy("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string text;
    std::getline(policy, text);
    return text.find("[always]") != std::string::npos;
  }();
  return always;
}

}  // namespace detail

// Records that [memory, memory + bytes) was advised as huge pages (allocate_host_memory does it for
// its own blocks; other allocators that advise theirs may too), until forget_huge_page_memory.
inline void note_huge_page_memory(const void* memory, std::size_t bytes) {
  detail::HugePageBlocks& registry = detail::huge_page_blocks();
  const std::lock_guard lock(registry.mutex);
  registry.blocks[reinterpret_cast<std::uintptr_t>(memory)] = bytes;
}
inline void forget_huge_page_memory(const void* memory) noexcept {
  detail::HugePageBlocks& registry = detail::huge_page_blocks();
  const std::lock_guard lock(registry.mutex);
  registry.blocks.erase(reinterpret_cast<std::uintptr_t>(memory));
}
// Whether [memory, memory + bytes) lies on huge pages, as far as this process knows: inside one
// noted block, or anywhere where the kernel's THP policy is "always".
inline bool on_huge_pages(const void* memory, std::size_t bytes) {
  if (detail::transparent_huge_pages_always()) return true;
  const auto begin = reinterpret_cast<std::uintptr_t>(memory);
  detail::HugePageBlocks& registry = detail::huge_page_blocks();
  const std::lock_guard lock(registry.mutex);
  auto after = registry.blocks.upper_bound(begin);
  if (after == registry.blocks.begin()) return false;
  const auto& [start, size] = *std::prev(after);
  return begin - start <= size && bytes <= size - (begin - start);
}

// `bytes` (> 0) bytes as they come, to be released with free_host_memory: from 2 MiB, where
// `huge_pages`, 2 MiB-aligned, advised as huge pages and noted as such; else 64-byte aligned.
// Throws std::bad_alloc. (The torch backend's CPU allocator is this, with huge pages always.)
inline void* allocate_uninitialized_host_memory(std::size_t bytes,
                                                bool huge_pages = huge_pages_wanted()) {
  const bool huge = bytes >= kHugePageBytes && huge_pages;
  const std::size_t alignment = huge ? kHugePageBytes : kCacheLineAlignment;
  if (bytes > SIZE_MAX - alignment) throw std::bad_alloc();
  // aligned_alloc takes a multiple of the alignment.
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* memory = std::aligned_alloc(alignment, rounded);
  if (memory == nullptr) throw std::bad_alloc();
  if (!huge) return memory;
  // Before the first touch, so that the pages are huge when they fault in. Only advice: a kernel
  // without THP refuses it, and the memory works as it is.
  ::madvise(memory, rounded, MADV_HUGEPAGE);
  try {
    note_huge_page_memory(memory, rounded);
  } catch (...) {
    std::free(memory);
    throw;
  }
  return memory;
}

// `bytes` (> 0) zeroed bytes, to be released with free_host_memory. Throws std::bad_alloc.
inline void* allocate_host_memory(std::size_t bytes) {
  void* memory = allocate_uninitialized_host_memory(bytes);
  std::memset(memory, 0, bytes);
  return memory;
}

inline void free_host_memory(void* memory) noexcept {
  // Only blocks on huge pages are noted, and they start on a 2 MiB boundary: other frees skip the
  // registry's lock.
  if (memory != nullptr && reinterpret_cast<std::uintptr_t>(memory) % kHugePageBytes == 0)
    forget_huge_page_memory(memory);
  std::free(memory);
}

}  // namespace coltrain
