// Host memory (core/host_memory.hpp): zeroed, aligned, and advised as huge pages from 2 MiB up.

#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/host_memory.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

namespace {

using coltrain::kHugePageBytes;

// The VmFlags of the mapping that holds `address`, from /proc/self/smaps ("" if none is found).
std::string mapping_flags(const void* address) {
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    const std::size_t dash = line.find('-');
    const std::size_t space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      const std::uintptr_t first = std::stoull(line.substr(0, dash), nullptr, 16);
      const std::uintptr_t end = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      inside = first <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return "";
}

bool all_zero(const void* memory, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(memory);
  return std::all_of(p, p + bytes, [](unsigned char c) { return c == 0; });
}

}  // namespace

TEST_CASE("host memory is zeroed and aligned to a cache line", "[core][host_memory]") {
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{100}, std::size_t{4096 + 3}}) {
    void* memory = coltrain::allocate_host_memory(bytes);
    CHECK(reinterpret_cast<std::uintptr_t>(memory) % coltrain::kCacheLineAlignment == 0);
    CHECK(all_zero(memory, bytes));
    coltrain::free_host_memory(memory);
  }
}

TEST_CASE("host memory from 2 MiB up is aligned to 2 MiB and advised as huge pages",
          "[core][host_memory]") {
  REQUIRE(coltrain::huge_pages_wanted());  // the tests run without COLTRAIN_HUGE_PAGES=0
  const std::size_t bytes = 3 * kHugePageBytes + 12;
  void* memory = coltrain::allocate_host_memory(bytes);
  CHECK(reinterpret_cast<std::uintptr_t>(memory) % kHugePageBytes == 0);
  CHECK(all_zero(memory, bytes));
  // "hg": the mapping carries MADV_HUGEPAGE. Whether the kernel found free huge pages for it is
  // up to the kernel; the advice is ours.
  if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    const std::string flags = mapping_flags(memory);
    INFO("VmFlags:" << flags);
    CHECK(flags.find(" hg ") != std::string::npos);
  } else {
    WARN("skipped part: no transparent huge pages in this kernel; only the alignment is checked");
  }
  coltrain::free_host_memory(memory);

  void* small = coltrain::allocate_host_memory(kHugePageBytes - 64);
  CHECK(mapping_flags(small).find(" hg ") == std::string::npos);
  coltrain::free_host_memory(small);
}

TEST_CASE("huge-page blocks are known by address until freed, and no other memory is",
          "[core][host_memory]") {
  // Where the kernel backs all memory with huge pages, every address is on them.
  if (coltrain::detail::transparent_huge_pages_always()) {
    const int anywhere = 0;
    CHECK(coltrain::on_huge_pages(&anywhere, sizeof anywhere));
    return;
  }
  constexpr std::size_t kBytes = 3 * kHugePageBytes;
  auto* block = static_cast<std::byte*>(coltrain::allocate_host_memory(kBytes));
  auto* small = static_cast<std::byte*>(coltrain::allocate_host_memory(kHugePageBytes - 64));
  CHECK(coltrain::on_huge_pages(block, kBytes));
  CHECK(coltrain::on_huge_pages(block + kHugePageBytes + 3, kHugePageBytes));
  CHECK(coltrain::on_huge_pages(block + kBytes - 1, 1));
  CHECK_FALSE(coltrain::on_huge_pages(block + 1, kBytes));  // runs past the block's end
  CHECK_FALSE(coltrain::on_huge_pages(block - 1, 2));       // starts before it
  CHECK_FALSE(coltrain::on_huge_pages(small, 64));          // below 2 MiB: 4 KiB pages
  std::string ordinary(1 << 20, 'x');
  CHECK_FALSE(coltrain::on_huge_pages(ordinary.data(), ordinary.size()));
  // Another allocator that advises its blocks may note them too.
  coltrain::note_huge_page_memory(ordinary.data(), ordinary.size());
  CHECK(coltrain::on_huge_pages(ordinary.data() + 10, 100));
  coltrain::forget_huge_page_memory(ordinary.data());
  CHECK_FALSE(coltrain::on_huge_pages(ordinary.data() + 10, 100));
  // Freed, the block's address is no longer on the list. Asked through a volatile copy of the
  // address, which g++'s use-after-free warning does not follow (the pointer itself is dead).
  const volatile std::uintptr_t block_address = reinterpret_cast<std::uintptr_t>(block);
  coltrain::free_host_memory(small);
  coltrain::free_host_memory(block);
  const std::uintptr_t freed = block_address;
  CHECK_FALSE(coltrain::on_huge_pages(reinterpret_cast<const void*>(freed), 1));
}

TEST_CASE("COLTRAIN_HUGE_PAGES takes 1 or 0", "[core][host_memory]") {
  CHECK(coltrain::parse_huge_pages(nullptr));
  CHECK(coltrain::parse_huge_pages(""));
  CHECK(coltrain::parse_huge_pages("1"));
  CHECK_FALSE(coltrain::parse_huge_pages("0"));
  CHECK_THROWS_AS(coltrain::parse_huge_pages("yes"), coltrain::ConfigError);
}
