// The memory limits a rank reads before it connects and sizes its shared-memory rings
// (comm/rendezvous/memory_limit.hpp), on cgroup trees written to a temporary folder. The real
// kernel's side, a job in a memory cgroup, is tests/shm/memory_cgroup.sh.
#include <catch2/catch.hpp>
#include <coltrain/comm/rendezvous/memory_limit.hpp>
#include <coltrain/comm/transport/shm/shm_channel.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

using namespace coltrain::comm::detail;
namespace fs = std::filesystem;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// A folder of fake kernel files, removed at the end of the test.
struct FakeTree {
  fs::path root =
      fs::temp_directory_path() / ("coltrain-memory-limit-" + std::to_string(::getpid()) + "-" +
                                   std::to_string(reinterpret_cast<std::uintptr_t>(this)));
  FakeTree() { fs::create_directories(root); }
  ~FakeTree() { fs::remove_all(root); }
  void write(const std::string& relative, const std::string& text) const {
    const fs::path path = root / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
};

std::string bytes(std::uint64_t value) { return std::to_string(value) + "\n"; }

}  // namespace

TEST_CASE("parse_proc_cgroup finds the v2 path and v1's memory path", "[memory_limit]") {
  // A hybrid host, as Debian's VMs with systemd's legacy layout.
  const CgroupPaths hybrid = parse_proc_cgroup(
      "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/7a91\n3:cpuset:/\n0::/\n");
  REQUIRE(hybrid.memory_v1);
  CHECK(*hybrid.memory_v1 == "/process_api/7a91");
  REQUIRE(hybrid.unified);
  CHECK(*hybrid.unified == "/");
  // v2 only.
  const CgroupPaths v2 = parse_proc_cgroup("0::/user.slice/job_7/step_0\n");
  CHECK(!v2.memory_v1);
  REQUIRE(v2.unified);
  CHECK(*v2.unified == "/user.slice/job_7/step_0");
  // The memory controller mounted with others, and a name that only contains "memory".
  const CgroupPaths joined = parse_proc_cgroup("5:name=memoryless:/x\n4:cpu,memory:/slurm/job_3");
  REQUIRE(joined.memory_v1);
  CHECK(*joined.memory_v1 == "/slurm/job_3");
  CHECK(!parse_proc_cgroup("garbage\n\n").memory_v1);
}

TEST_CASE("keyed_value reads memory.stat and /proc/self/status lines", "[memory_limit]") {
  const std::string stat = "cache 100\ntotal_inactive_file 42\ninactive_file 7\nrss 3";
  CHECK(keyed_value(stat, "inactive_file") == 7u);
  CHECK(keyed_value(stat, "total_inactive_file") == 42u);
  CHECK(keyed_value(stat, "rss") == 3u);
  CHECK(!keyed_value(stat, "active_file"));  // a suffix of another key is not the key
  CHECK(!keyed_value(stat, "cach"));
  CHECK(keyed_value("Name:\tx\nVmSize:\t  123456 kB\n", "VmSize:") == 123456u);
  CHECK(!keyed_value("VmSize:\tlots kB\n", "VmSize:"));
}

TEST_CASE("cgroup v2: the tightest level binds, less what file cache can give back",
          "[memory_limit]") {
  FakeTree tree;
  // /job: limit 700 MiB, 650 in use, none of it file cache; /job/step: limit 1 GiB, 600 MiB of
  // usage of which 200 MiB file cache. The parent's 50 MiB bind.
  tree.write("job/memory.max", bytes(700 * kMiB));
  tree.write("job/memory.current", bytes(650 * kMiB));
  tree.write("job/memory.stat", "anon 681574400\n");
  tree.write("job/step/memory.max", bytes(1024 * kMiB));
  tree.write("job/step/memory.current", bytes(600 * kMiB));
  tree.write("job/step/memory.stat", "anon 1\nactive_file " + std::to_string(100 * kMiB) +
                                         "\ninactive_file " + std::to_string(100 * kMiB) + "\n");
  const MemoryHeadroom both = cgroup_headroom(tree.root.string(), "/job/step", kCgroupV2Files);
  CHECK(both.bytes == 50 * kMiB);
  CHECK(both.limit == "the memory cgroup /job (memory.max 700 MiB, 650 MiB in use)");
  CHECK(both.fix.find("--mem") != std::string::npos);

  // Without the parent's limit ("max"), the step's own: 1024 - (600 - 200).
  tree.write("job/memory.max", "max\n");
  const MemoryHeadroom step = cgroup_headroom(tree.root.string(), "/job/step", kCgroupV2Files);
  CHECK(step.bytes == 624 * kMiB);
  CHECK(step.limit == "the memory cgroup /job/step (memory.max 1024 MiB, 400 MiB in use)");

  // Usage over the limit leaves nothing, not a wrapped-around number.
  tree.write("job/step/memory.current", bytes(2048 * kMiB));
  tree.write("job/step/memory.stat", "anon 1\n");
  CHECK(cgroup_headroom(tree.root.string(), "/job/step", kCgroupV2Files).bytes == 0);

  // No limit anywhere: unlimited, with nothing to name.
  const MemoryHeadroom none = cgroup_headroom(tree.root.string(), "/elsewhere", kCgroupV2Files);
  CHECK(none.bytes == kUnlimitedMemory);
  CHECK(none.limit.empty());
}

TEST_CASE("cgroup v1 through memory_headroom: the hierarchy's limit, not its page-counter maximum",
          "[memory_limit]") {
  FakeTree tree;
  tree.write("proc_cgroup", "4:memory:/docker/abc\n1:cpu:/\n");
  // The root of the hierarchy reports v1's "no limit".
  tree.write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  tree.write("cgroup/memory/memory.usage_in_bytes", bytes(4096 * kMiB));
  tree.write("cgroup/memory/docker/abc/memory.limit_in_bytes", bytes(64 * kMiB));
  tree.write("cgroup/memory/docker/abc/memory.usage_in_bytes", bytes(40 * kMiB));
  tree.write("cgroup/memory/docker/abc/memory.stat", "inactive_file 1\ntotal_inactive_file " +
                                                         std::to_string(8 * kMiB) +
                                                         "\ntotal_active_file 0\n");
  const MemoryHeadroom headroom =
      memory_headroom((tree.root / "proc_cgroup").string(), (tree.root / "cgroup").string());
  // Unless the test itself runs under a tighter RLIMIT_AS, the cgroup's 64 - (40 - 8) MiB.
  rlimit limit{};
  REQUIRE(::getrlimit(RLIMIT_AS, &limit) == 0);
  if (limit.rlim_cur == RLIM_INFINITY) {
    CHECK(headroom.bytes == 32 * kMiB);
    CHECK(headroom.limit ==
          "the memory cgroup /docker/abc (memory.limit_in_bytes 64 MiB, 32 MiB in use)");
  }
  CHECK(headroom.bytes <= 32 * kMiB);
}

TEST_CASE("RLIMIT_AS: the limit less what is mapped", "[memory_limit]") {
  CHECK(address_space_headroom(RLIM_INFINITY, 5 * kMiB).bytes == kUnlimitedMemory);
  const MemoryHeadroom room = address_space_headroom(1024 * kMiB, 256 * kMiB);
  CHECK(room.bytes == 768 * kMiB);
  CHECK(room.limit == "RLIMIT_AS (1024 MiB, 256 MiB of address space mapped)");
  CHECK(room.fix.find("ulimit -v") != std::string::npos);
  CHECK(address_space_headroom(1024 * kMiB, 1536 * kMiB).bytes == 0);
}

TEST_CASE("memory_limit_error: a rank that cannot hold its connections is told what and how",
          "[memory_limit]") {
  CHECK(memory_limit_error(MemoryHeadroom{}, 4095).empty());  // no limit
  const std::uint64_t need_for_7 = kMemoryFloorBytes + 7 * kMemoryPerPeerBytes;
  MemoryHeadroom headroom{need_for_7, "the memory cgroup /job (memory.max 64 MiB, 60 MiB in use)",
                          "give the job more memory"};
  CHECK(memory_limit_error(headroom, 7).empty());  // exactly enough
  headroom.bytes = need_for_7 - 1;
  const std::string error = memory_limit_error(headroom, 7);
  CHECK(error == "a rank of a job of 8 ranks needs about " + std::to_string(need_for_7 >> 10) +
                     " KiB more memory to connect to its peers, but the memory cgroup /job "
                     "(memory.max 64 MiB, 60 MiB in use) leaves " +
                     std::to_string((need_for_7 - 1) >> 10) + " KiB; give the job more memory");
  // Each peer counts: enough for 7 is not enough for 8.
  headroom.bytes = need_for_7;
  CHECK(!memory_limit_error(headroom, 8).empty());
}

TEST_CASE("shared-memory rings fit in a quarter of the host's smallest memory headroom",
          "[memory_limit][shm]") {
  const std::uint64_t unlimited = kUnlimitedMemory;
  // 8 ranks: 2 MiB rings without a limit; 69 MiB of headroom leaves a quarter, 17 MiB, for 28
  // segments of two rings: 256 KiB rings. 9 MiB cannot hold the smallest: TCP.
  CHECK(shm_ring_bytes_within(7, unlimited, unlimited) == std::size_t{2} << 20);
  CHECK(shm_ring_bytes_within(7, unlimited, 69 * kMiB) == std::size_t{256} << 10);
  CHECK(shm_ring_bytes_within(7, unlimited, 9 * kMiB) == 0);
  // The tighter of /dev/shm and memory decides.
  CHECK(shm_ring_bytes_within(7, 8 * kMiB, 69 * kMiB) == std::size_t{64} << 10);
  CHECK(shm_ring_bytes_within(7, 4 * kMiB, 69 * kMiB) == 0);
  for (int peers : {1, 3, 7, 15, 31})
    for (std::uint64_t headroom : {16 * kMiB, 100 * kMiB, 1000 * kMiB, 64000 * kMiB}) {
      const auto ranks = static_cast<std::uint64_t>(peers) + 1;
      const std::size_t ring = shm_ring_bytes_within(peers, unlimited, headroom);
      CHECK(ranks * (ranks - 1) / 2 * 2 * ring <= headroom / 4);
    }
}
