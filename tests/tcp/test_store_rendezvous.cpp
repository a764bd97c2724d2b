// tcp_over_store(): ranks that find each other through a key-value store (what PyTorch's c10d
// Store gives the coltrain_torch backend). The ranks are threads sharing an in-memory store.
#include <catch2/catch.hpp>

#include "../support/thread_ranks.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/rendezvous/store_rendezvous.hpp>
#include <coltrain/core/error.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using Catch::Matchers::Contains;
using coltrain::comm::Communicator;
using coltrain::comm::RendezvousStore;
using coltrain::testing::expect;
using namespace std::chrono_literals;

namespace {

// A store in this process's memory; get() waits for the key up to `timeout`, as c10d's does.
class MemoryStore final : public RendezvousStore {
 public:
  explicit MemoryStore(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  void set(const std::string& key, std::span<const std::byte> value) override {
    {
      const std::lock_guard lock(mutex_);
      values_[key].assign(value.begin(), value.end());
    }
    changed_.notify_all();
  }
  std::vector<std::byte> get(const std::string& key) override {
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, timeout_, [&] { return values_.count(key) != 0; })) {
      throw std::runtime_error("store: no key \"" + key + "\" within the timeout");
    }
    return values_[key];
  }
  std::vector<std::string> keys() {
    const std::lock_guard lock(mutex_);
    std::vector<std::string> names;
    for (const auto& entry : values_) names.push_back(entry.first);
    return names;
  }

 private:
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<std::byte>> values_;
};

coltrain::comm::CommOptions test_options() {
  coltrain::comm::CommOptions options;
  options.timeout = 20s;
  return options;
}

// Runs `body` on `size` thread ranks that meet through `store`; returns each rank's failure.
std::vector<std::string> run_through_store(RendezvousStore& store, int size,
                                           const std::function<void(Communicator&)>& body) {
  std::vector<std::string> failures(static_cast<std::size_t>(size));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        Communicator communicator =
            coltrain::comm::tcp_over_store(store, rank, size, test_options());
        body(communicator);
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  }
  for (std::thread& rank : ranks) rank.join();
  return failures;
}

}  // namespace

TEST_CASE("ranks that meet through a store form a communicator whose collectives are exact",
          "[tcp][store]") {
  const int size = GENERATE(1, 2, 4);
  MemoryStore store(20s);
  const auto failures = run_through_store(store, size, [size](Communicator& comm) {
    expect(comm.size() == size, "size " + std::to_string(comm.size()));
    // Distinct per rank and element, so a lost, doubled or misplaced block changes the sum.
    std::vector<std::int64_t> data(1000);
    for (std::size_t i = 0; i < data.size(); ++i) {
      data[i] = static_cast<std::int64_t>(i) * 1000 + comm.rank() + 1;
    }
    comm.allreduce(std::span<std::int64_t>(data));
    for (std::size_t i = 0; i < data.size(); ++i) {
      const std::int64_t want = static_cast<std::int64_t>(i) * 1000 * size + size * (size + 1) / 2;
      expect(data[i] == want, "element " + std::to_string(i) + " is " + std::to_string(data[i]) +
                                  ", not " + std::to_string(want));
    }
    std::vector<std::int32_t> gathered(static_cast<std::size_t>(size));
    const std::int32_t mine = 7 * comm.rank();
    comm.allgather(std::span<const std::int32_t>(&mine, 1), std::span<std::int32_t>(gathered));
    for (int r = 0; r < size; ++r) {
      expect(gathered[static_cast<std::size_t>(r)] == 7 * r,
             "allgather block " + std::to_string(r));
    }
    // Ranks of one host talk through shared memory here as after the launcher's rendezvous.
    expect(comm.host_layout().hosts() == 1, "one host");
  });
  for (const std::string& failure : failures) CHECK(failure.empty());
  // One address per rank and the nonce; a world of one needs no store.
  std::vector<std::string> want;
  if (size > 1) {
    for (int rank = 0; rank < size; ++rank)
      want.push_back("coltrain/address/" + std::to_string(rank));
    want.push_back("coltrain/nonce");
  }
  CHECK(store.keys() == want);
}

TEST_CASE("a store key that holds something else is named, with the fix", "[tcp][store]") {
  MemoryStore store(20s);
  const std::uint32_t foreign = 42;  // 4 bytes where coltrain writes an 8-byte nonce
  store.set("coltrain/nonce", std::as_bytes(std::span<const std::uint32_t>(&foreign, 1)));
  // Rank 1 alone: it reads rank 0's nonce without rank 0 (which would write its own).
  try {
    (void)coltrain::comm::tcp_over_store(store, 1, 2, test_options());
    FAIL("a foreign nonce was taken");
  } catch (const coltrain::ConfigError& e) {
    CHECK_THAT(e.what(), Contains("\"coltrain/nonce\" holds 4 bytes") &&
                             Contains("store prefix of its own") && Contains("rank 1"));
  }
}

TEST_CASE("a rank outside the world is refused before the store is touched", "[tcp][store]") {
  MemoryStore store(1s);
  CHECK_THROWS_WITH(coltrain::comm::tcp_over_store(store, 3, 2, test_options()),
                    Contains("rank 3 is outside a world of 2 ranks"));
  CHECK(store.keys().empty());
}
