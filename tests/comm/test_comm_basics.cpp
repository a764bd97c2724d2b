// Single-process pieces of the collectives: names and parsing, the backend from_env chooses, header
// checks, reduction kernels, the block partition and the cost model.
#include <catch2/catch.hpp>

#include <coltrain/comm/algorithms/common.hpp>
#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/host_layout.hpp>
#include <coltrain/comm/options.hpp>
#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/comm/transport/shm/shm_channel.hpp>
#include <coltrain/comm/tuning/backend_choice.hpp>
#include <coltrain/comm/tuning/cost_model.hpp>
#include <coltrain/comm/types.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using Catch::Contains;

TEST_CASE("every enum name parses back to its value", "[comm][types]") {
  for (auto c : {Collective::kAllreduce, Collective::kBroadcast, Collective::kAllgather,
                 Collective::kReduceScatter, Collective::kReduce, Collective::kBarrier}) {
    CHECK(parse_collective(name_of(c)) == c);
  }
  for (auto op :
       {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
    CHECK(parse_reduce_op(name_of(op)) == op);
  }
  for (auto a : {Algorithm::kNative, Algorithm::kRing, Algorithm::kTree,
                 Algorithm::kHalvingDoubling, Algorithm::kAutomatic}) {
    CHECK(parse_algorithm(name_of(a)) == a);
  }
  for (auto b : {Backend::kMpi, Backend::kTcp, Backend::kNccl}) {
    CHECK(parse_backend(name_of(b)) == b);
  }
  CHECK(parse_backend("nccl") == Backend::kNccl);
  CHECK(name_of(Backend::kNccl) == "nccl");
  for (auto m : {Memory::kHost, Memory::kDevice}) CHECK(parse_memory(name_of(m)) == m);
  CHECK_THROWS_WITH(parse_backend("gloo"),
                    Contains("unknown backend 'gloo'") && Contains("mpi, tcp, nccl"));
  CHECK_THROWS_WITH(parse_algorithm("butterfly"),
                    Contains("unknown algorithm 'butterfly'") && Contains("halving_doubling"));
}

TEST_CASE("check_header names the differing field, both ranks and both values", "[comm][header]") {
  MessageHeader mine;
  mine.sequence = 7;
  mine.count = 10;
  MessageHeader theirs = mine;
  check_header(mine, theirs, 0, 1);  // identical: no throw

  theirs.count = 12;
  CHECK_THROWS_WITH(check_header(mine, theirs, 0, 1),
                    Contains("count differs between ranks: rank 0 has 10, rank 1 has 12") &&
                        Contains("allreduce #7"));
  theirs = mine;
  theirs.dtype = DataType::kBFloat16;
  CHECK_THROWS_WITH(check_header(mine, theirs, 2, 3),
                    Contains("dtype differs") && Contains("rank 2 has f32, rank 3 has bf16"));
  theirs = mine;
  theirs.magic = 0x12345678;
  CHECK_THROWS_AS(check_header(mine, theirs, 0, 1), MismatchError);
  CHECK_THROWS_WITH(check_header(mine, theirs, 0, 1), Contains("magic"));
}

TEMPLATE_TEST_CASE("reduce_into computes every op elementwise, in place too", "[comm][reduce]",
                   float, double, std::int32_t, std::int64_t) {
  const std::vector<TestType> a{1, 5, -3, 7, 2, 0, 9};
  const std::vector<TestType> b{4, 2, -8, 7, -1, 3, 1};
  std::vector<TestType> out(a.size());
  auto check = [&](ReduceOp op, auto expected) {
    reduce_into(out.data(), a.data(), b.data(), a.size(), op);
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(out[i] == expected(a[i], b[i]));
    std::vector<TestType> in_place = a;
    reduce_into(in_place.data(), in_place.data(), b.data(), a.size(), op);
    CHECK(in_place == out);
  };
  check(ReduceOp::kSum, [](TestType x, TestType y) { return static_cast<TestType>(x + y); });
  check(ReduceOp::kAvg, [](TestType x, TestType y) { return static_cast<TestType>(x + y); });
  check(ReduceOp::kProd, [](TestType x, TestType y) { return static_cast<TestType>(x * y); });
  check(ReduceOp::kMin, [](TestType x, TestType y) { return std::min(x, y); });
  check(ReduceOp::kMax, [](TestType x, TestType y) { return std::max(x, y); });
}

TEST_CASE("integer reductions wrap around instead of overflowing", "[comm][reduce]") {
  const std::int32_t big = std::numeric_limits<std::int32_t>::max();
  std::int32_t out = 0;
  const std::int32_t one = 1;
  reduce_into(&out, &big, &one, 1, ReduceOp::kSum);
  CHECK(out == std::numeric_limits<std::int32_t>::min());
}

TEST_CASE("divide_by_ranks divides exactly and truncates integers", "[comm][reduce]") {
  std::vector<float> f{6, 9, 1};
  divide_by_ranks(f.data(), f.size(), 3);
  CHECK(f == std::vector<float>{2, 3, 1.0f / 3});
  std::vector<std::int64_t> i{7, -7};
  divide_by_ranks(i.data(), i.size(), 2);
  CHECK(i == std::vector<std::int64_t>{3, -3});
}

TEMPLATE_TEST_CASE("element_reduction runs the typed kernels on bytes, dividing only for avg",
                   "[comm][reduce]", float, double, std::int32_t, std::int64_t) {
  const std::vector<TestType> a{6, 5, -3, 8};
  const std::vector<TestType> b{2, 1, -1, 4};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd, ReduceOp::kMax}) {
    const ElementReduction reduction = element_reduction<TestType>(op);
    CHECK(reduction.dtype == data_type_v<TestType>);
    CHECK(reduction.element_bytes() == sizeof(TestType));
    std::vector<TestType> expected(a.size());
    reduce_into(expected.data(), a.data(), b.data(), a.size(), op);
    std::vector<TestType> out(a.size());
    auto* out_bytes = reinterpret_cast<std::byte*>(out.data());
    reduction.reduce(out_bytes, reinterpret_cast<const std::byte*>(a.data()),
                     reinterpret_cast<const std::byte*>(b.data()), a.size() * sizeof(TestType));
    CHECK(out == expected);
    reduction.finish(out_bytes, out.size() * sizeof(TestType), 2);
    if (op == ReduceOp::kAvg) divide_by_ranks(expected.data(), expected.size(), 2);
    CHECK(out == expected);
  }
}

TEST_CASE("blocks cover the array contiguously with sizes differing by at most one", "[comm]") {
  for (std::size_t count : {0, 1, 4, 7, 1000}) {
    for (std::size_t parts : {1, 2, 3, 5}) {
      const coltrain::comm::detail::Blocks blocks(count, parts);
      std::size_t next = 0;
      for (std::size_t i = 0; i < parts; ++i) {
        CHECK(blocks.begin(i) == next);
        CHECK(blocks.size(i) <= blocks.size(0));
        CHECK(blocks.size(0) - blocks.size(i) <= 1);
        next += blocks.size(i);
      }
      CHECK(next == count);
      CHECK(blocks.begin(parts) == count);
    }
  }
}

TEST_CASE("the cost model prefers latency-light algorithms small and bandwidth-optimal ones large",
          "[comm][cost]") {
  const CostModel tcp = default_cost_model(Backend::kTcp);
  const std::size_t large = std::size_t{256} << 20;
  CHECK(choose_algorithm(tcp, Collective::kAllreduce, 8, 8, false) != Algorithm::kRing);
  const Algorithm on_eight = choose_algorithm(tcp, Collective::kAllreduce, 8, large, false);
  CHECK((on_eight == Algorithm::kRing || on_eight == Algorithm::kHalvingDoubling));
  // Off powers of two halving-doubling's fold moves the whole vector twice more: the ring.
  CHECK(choose_algorithm(tcp, Collective::kAllreduce, 6, large, false) == Algorithm::kRing);
  // Never native where the backend has none.
  for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 30}) {
    CHECK(choose_algorithm(tcp, Collective::kBroadcast, 4, bytes, false) != Algorithm::kNative);
  }
  CHECK(predict_us(tcp, Collective::kAllgather, Algorithm::kTree, 4, 1024) ==
        std::numeric_limits<double>::infinity());
  CHECK(predict_us(tcp, Collective::kAllreduce, Algorithm::kRing, 1, 1024) == 0);
}

TEST_CASE("on two ranks a tie between ring and halving-doubling goes to halving-doubling",
          "[comm][cost]") {
  for (Backend backend : {Backend::kTcp, Backend::kMpi}) {
    const CostModel model = default_cost_model(backend);
    // Up to two chunks of 256 KiB the two predict the same time on two ranks (below 16 KiB rank
    // order's one round is cheaper than both).
    for (std::size_t bytes :
         {std::size_t{32} << 10, std::size_t{64} << 10, std::size_t{512} << 10}) {
      CHECK(
          predict_us(model, Collective::kAllreduce, Algorithm::kRing, 2, bytes) ==
          Approx(predict_us(model, Collective::kAllreduce, Algorithm::kHalvingDoubling, 2, bytes)));
      CHECK(choose_algorithm(model, Collective::kAllreduce, 2, bytes, false) ==
            Algorithm::kHalvingDoubling);
    }
    // Beyond, both pipeline their reductions, and halving-doubling sends the same bytes in half
    // the ring's messages (one halving step against the ring's two phases): no tie.
    const std::size_t large = std::size_t{64} << 20;
    CHECK(predict_us(model, Collective::kAllreduce, Algorithm::kHalvingDoubling, 2, large) <
          predict_us(model, Collective::kAllreduce, Algorithm::kRing, 2, large));
    CHECK(choose_algorithm(model, Collective::kAllreduce, 2, large, false) ==
          Algorithm::kHalvingDoubling);
  }
}

TEST_CASE(
    "halving-doubling is priced as a pipeline: a message per chunk, each step's last "
    "chunk's reduction",
    "[comm][cost]") {
  // Four ranks, 64 MiB: two halving steps of 32 and 16 MiB in 256 KiB chunks, the ring's six
  // steps of 16 MiB. Messages alone: halving-doubling's 128 + 64 + 2 against the ring's 6 x 64.
  const std::size_t large = std::size_t{64} << 20;
  CostModel messages_only;
  messages_only.point_to_point = {1.0, 0, 0};
  CHECK(predict_us(messages_only, Collective::kAllreduce, Algorithm::kHalvingDoubling, 4, large) ==
        Approx(128 + 64 + 2));
  CHECK(predict_us(messages_only, Collective::kAllreduce, Algorithm::kRing, 4, large) ==
        Approx(6 * 64));
  // Reductions alone: one chunk's a halving step against the ring's one chunk in all.
  CostModel reductions_only;
  reductions_only.point_to_point = {0, 0, 1.0};
  const double chunk = static_cast<double>(reductions_only.chunk_bytes);
  CHECK(predict_us(reductions_only, Collective::kAllreduce, Algorithm::kHalvingDoubling, 4,
                   large) == Approx(2 * chunk));
  CHECK(predict_us(reductions_only, Collective::kAllreduce, Algorithm::kRing, 4, large) ==
        Approx(chunk));
  // The tree: each of its two trees carries half in chunks, 128 each, plus the depth up and down.
  CHECK(predict_us(messages_only, Collective::kAllreduce, Algorithm::kTree, 4, large) ==
        Approx(2 * (2 + 128)));
  // Three ranks: the fold of the whole vector (pipelined) and the result sent back come first.
  CHECK(predict_us(messages_only, Collective::kAllreduce, Algorithm::kHalvingDoubling, 3, large) ==
        Approx((256 + 1) + (128 + 1)));
}

TEST_CASE("small allreduces on few ranks go to rank order's one-round exchange", "[comm][cost]") {
  for (Backend backend : {Backend::kTcp, Backend::kMpi}) {
    INFO(name_of(backend));
    const CostModel model = default_cost_model(backend);
    // One round of p - 1 messages against halving-doubling's 2 lg p rounds.
    for (int p : {2, 3, 4}) {
      INFO(p << " ranks");
      CHECK(choose_algorithm(model, Collective::kAllreduce, p, 8, false) == Algorithm::kRankOrder);
      CHECK(predict_us(model, Collective::kAllreduce, Algorithm::kRankOrder, p, 8) <
            predict_us(model, Collective::kAllreduce, Algorithm::kHalvingDoubling, p, 8));
    }
    // More ranks: more messages than halving-doubling's rounds.
    CHECK(choose_algorithm(model, Collective::kAllreduce, 16, 8, false) != Algorithm::kRankOrder);
    // Beyond the one-round size its chunked schedule is never chosen, nor for other collectives.
    for (std::size_t bytes : {kRankOrderDirectBytes + 4, std::size_t{64} << 20}) {
      CHECK(choose_algorithm(model, Collective::kAllreduce, 2, bytes, false) !=
            Algorithm::kRankOrder);
      CHECK(choose_algorithm(model, Collective::kReduceScatter, 2, bytes, false) !=
            Algorithm::kRankOrder);
    }
    CHECK(choose_algorithm(model, Collective::kReduce, 2, 8, false) != Algorithm::kRankOrder);
  }
}

TEST_CASE("a host layout groups ranks by identity, hosts numbered by their lowest rank",
          "[comm][hosts]") {
  using coltrain::comm::detail::host_identity;
  const std::vector identities{host_identity("b"), host_identity("a"), host_identity("b"),
                               host_identity("c"), host_identity("a")};
  const HostLayout hosts(identities);
  CHECK(hosts.ranks() == 5);
  CHECK(hosts.hosts() == 3);
  CHECK(hosts.host_of(0) == 0);
  CHECK(hosts.host_of(1) == 1);
  CHECK(hosts.host_of(3) == 2);
  CHECK(hosts.ranks_on(0) == std::vector{0, 2});
  CHECK(hosts.ranks_on(1) == std::vector{1, 4});
  CHECK(hosts.local_index(4) == 1);
  CHECK(hosts.largest_host() == 2);
  CHECK_FALSE(hosts.uniform());
  CHECK(HostLayout(std::vector{0, 1, 0, 1}).uniform());
  CHECK(HostLayout().hosts() == 1);
}

TEST_CASE("over several hosts the cost model counts the ring's links between hosts",
          "[comm][cost][hosts]") {
  const CostModel tcp = default_cost_model(Backend::kTcp);
  const HostLayout blocks(std::vector{0, 0, 0, 0, 1, 1, 1, 1});
  const HostLayout cyclic(std::vector{0, 1, 0, 1, 0, 1, 0, 1});
  CHECK(blocks.ring_links_leaving_a_host() == 1);
  CHECK(cyclic.ring_links_leaving_a_host() == 4);
  CHECK(HostLayout(std::vector{0, 0}).ring_links_leaving_a_host() == 1);
  // Halving-doubling's first halving and last doubling (n/2 each way) cross for every rank of a
  // block; with alternating hosts only its smallest steps do, which counts as 1 like a rank a host.
  CHECK(blocks.halving_doubling_load_leaving_a_host() == Approx(16.0 / 7));
  CHECK(cyclic.halving_doubling_load_leaving_a_host() == 1);
  CHECK(HostLayout(std::vector{0, 1, 2, 3}).halving_doubling_load_leaving_a_host() == 1);
  // Twelve ranks in two hosts of six: the eight that run it after the fold are ranks 1, 3, 5, 7
  // and 8 to 11. At the largest step (bit 4) three ranks of each host cross (12/7), at bit 2 and
  // bit 1 one each (2/7 and 1/7).
  CHECK(HostLayout(std::vector{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1})
            .halving_doubling_load_leaving_a_host() == Approx(15.0 / 7));
  const std::size_t large = std::size_t{64} << 20;
  // Cyclic placement: a flat ring sends everything between hosts four times over, where
  // hierarchical, and halving-doubling whose large steps stay inside the hosts, send it once.
  CHECK(choose_algorithm(tcp, Collective::kAllreduce, cyclic, large, false) != Algorithm::kRing);
  CHECK(choose_algorithm(tcp, Collective::kAllreduce, blocks, large, false) ==
        Algorithm::kHierarchical);
  // One host, or one rank per host: never.
  CHECK(choose_algorithm(tcp, Collective::kAllreduce, HostLayout(std::vector{0, 0, 0, 0}), large,
                         false) != Algorithm::kHierarchical);
  CHECK(choose_algorithm(tcp, Collective::kAllreduce, HostLayout(std::vector{0, 1, 2, 3}), large,
                         false) != Algorithm::kHierarchical);
  // Fewer steps over the network: a hierarchical 8-byte allreduce over two hosts of four
  // crosses the network twice, a flat one at least four times.
  CHECK(predict_hierarchical_us(tcp, blocks, 8) <
        predict_us(tcp, Collective::kAllreduce, Algorithm::kHalvingDoubling, 8, 8));
  // Unequal hosts are predicted too.
  CHECK(predict_hierarchical_us(tcp, HostLayout(std::vector{0, 0, 0, 1, 1}), large) > 0);
}

TEST_CASE("on one host the cost model prices every message at the same-host costs",
          "[comm][cost][hosts]") {
  // Messages that cost a millisecond inside a host and nothing between hosts: the fewest messages
  // win on one host (the ring sends the most), the fewest bytes (the ring) where each rank has its
  // own.
  CostModel model = default_cost_model(Backend::kTcp);
  model.point_to_point = {0.001, 1.0 / 3500.0, 1.0 / 6000.0};
  model.same_host = {1000.0, 1.0 / 13000.0, 1.0 / 6000.0};
  const std::size_t large = std::size_t{64} << 20;
  CostModel inside = model;
  inside.point_to_point = model.same_host;
  const Algorithm on_one_host =
      choose_algorithm(model, Collective::kAllreduce, HostLayout(std::vector(8, 0)), large, false);
  CHECK(on_one_host == choose_algorithm(inside, Collective::kAllreduce, 8, large, false));
  CHECK(on_one_host != Algorithm::kRing);
  CHECK(choose_algorithm(model, Collective::kAllreduce,
                         HostLayout(std::vector{0, 1, 2, 3, 4, 5, 6, 7}), large,
                         false) == Algorithm::kRing);
}

TEST_CASE("from_env's backend: requested, else COLTRAIN_BACKEND, else by memory, build, launcher",
          "[comm][backend]") {
  const auto env = [](bool mpi, bool nccl, bool mpi_launch) {
    BackendEnvironment environment;
    environment.with_mpi = mpi;
    environment.with_nccl = nccl;
    environment.mpi_launch = mpi_launch;
    return environment;
  };
  const auto is = [](BackendChoice choice, Backend backend, Backend host) {
    return choice.backend == backend && choice.host == host;
  };
  using enum Backend;
  // Nothing asked: host memory never picks NCCL; device memory does when the build has it.
  CHECK(is(choose_backend({}, "", Memory::kHost, env(true, true, true)), kMpi, kMpi));
  CHECK(is(choose_backend({}, "", Memory::kHost, env(true, true, false)), kTcp, kTcp));
  CHECK(is(choose_backend({}, "", Memory::kHost, env(false, true, true)), kTcp, kTcp));
  CHECK(is(choose_backend({}, "", Memory::kDevice, env(true, true, true)), kNccl, kMpi));
  CHECK(is(choose_backend({}, "", Memory::kDevice, env(true, true, false)), kNccl, kTcp));
  CHECK(is(choose_backend({}, "", Memory::kDevice, env(false, true, true)), kNccl, kTcp));
  CHECK(is(choose_backend({}, "", Memory::kDevice, env(true, false, true)), kMpi, kMpi));
  CHECK(is(choose_backend({}, "", Memory::kDevice, env(false, false, true)), kTcp, kTcp));
  // COLTRAIN_BACKEND beats the defaults; the argument beats COLTRAIN_BACKEND.
  CHECK(is(choose_backend({}, "nccl", Memory::kHost, env(true, true, true)), kNccl, kMpi));
  CHECK(is(choose_backend({}, "tcp", Memory::kDevice, env(true, true, true)), kTcp, kTcp));
  CHECK(is(choose_backend(kTcp, "nccl", Memory::kDevice, env(true, true, true)), kTcp, kTcp));
  CHECK(is(choose_backend(kNccl, "mpi", Memory::kHost, env(false, true, false)), kNccl, kTcp));
  // A backend the build lacks, or a name that is none, says where it came from.
  CHECK_THROWS_AS(choose_backend({}, "nccl", Memory::kHost, env(true, false, true)), ConfigError);
  CHECK_THROWS_WITH(choose_backend({}, "nccl", Memory::kDevice, env(true, false, true)),
                    Contains("COLTRAIN_BACKEND=nccl") && Contains("built without NCCL"));
  CHECK_THROWS_WITH(choose_backend(kNccl, "", Memory::kDevice, env(true, false, true)),
                    Contains("the requested backend") && Contains("built without NCCL"));
  CHECK_THROWS_WITH(choose_backend({}, "mpi", Memory::kHost, env(false, true, false)),
                    Contains("COLTRAIN_BACKEND=mpi") && Contains("built without MPI"));
  CHECK_THROWS_WITH(choose_backend({}, "infiniband", Memory::kHost, env(true, true, true)),
                    Contains("COLTRAIN_BACKEND=infiniband") && Contains("unknown backend"));
}

TEST_CASE("on NCCL device buffers automatic weighs NCCL's own allreduce against ring and tree",
          "[comm][cost]") {
  const CostModel nccl = default_cost_model(Backend::kNccl);
  CHECK(nccl.native_shape == NativeShape::kNccl);
  // The defaults: NCCL's own collectives start sooner at the same bandwidth, so they win.
  for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 20, std::size_t{1} << 30}) {
    CHECK(choose_nccl_algorithm(nccl, Collective::kAllreduce, 8, bytes, true) ==
          Algorithm::kNative);
  }
  // Where the native collective is slow on the wire (a topology NCCL tunes badly), the ring wins
  // large arrays and the tree, with its lg p latency, mid-sized ones on many ranks.
  CostModel slow_native = nccl;
  slow_native.native.beta_us_per_byte = 4 * nccl.point_to_point.beta_us_per_byte;
  CHECK(choose_nccl_algorithm(slow_native, Collective::kAllreduce, 2, std::size_t{1} << 30, true) ==
        Algorithm::kRing);
  CHECK(choose_nccl_algorithm(slow_native, Collective::kAllreduce, 64, std::size_t{4} << 20,
                              true) == Algorithm::kTree);
  CHECK(choose_nccl_algorithm(slow_native, Collective::kAllreduce, 8, 8, true) ==
        Algorithm::kNative);
  // Without the reduction kernel, and for the other collectives, NCCL's own is all there is.
  CHECK(choose_nccl_algorithm(slow_native, Collective::kAllreduce, 8, std::size_t{1} << 30,
                              false) == Algorithm::kNative);
  CHECK(choose_nccl_algorithm(slow_native, Collective::kBroadcast, 8, std::size_t{1} << 30, true) ==
        Algorithm::kNative);
  CHECK(nccl_algorithms_for(Collective::kAllreduce, true).size() == 3);
  CHECK(nccl_algorithms_for(Collective::kAllgather, true).size() == 1);
  // NCCL's native allreduce is the cheaper of its ring and tree, with no MPICH doubling term: on 8
  // ranks and 1 GiB its ring, 2(p-1) alpha + 2(p-1)/p n beta.
  const double n = static_cast<double>(std::size_t{1} << 30);
  CHECK(predict_us(nccl, Collective::kAllreduce, Algorithm::kNative, 8, std::size_t{1} << 30) ==
        Approx(2 * 7 * nccl.native.alpha_us + 2.0 * 7 / 8 * n * nccl.native.beta_us_per_byte));
}

TEST_CASE("COLTRAIN_TIMEOUT sets the timeout, bad values name the variable", "[comm][options]") {
  ::setenv("COLTRAIN_TIMEOUT", "2.5", 1);
  CHECK(comm_options_from_env().timeout == std::chrono::milliseconds(2500));
  ::setenv("COLTRAIN_TIMEOUT", "soon", 1);
  CHECK_THROWS_WITH(comm_options_from_env(), Contains("COLTRAIN_TIMEOUT=soon"));
  ::setenv("COLTRAIN_TIMEOUT", "-1", 1);
  CHECK_THROWS_AS(comm_options_from_env(), ConfigError);
  ::unsetenv("COLTRAIN_TIMEOUT");
  CHECK(comm_options_from_env().timeout == std::chrono::seconds(300));
}

TEST_CASE("COLTRAIN_DETERMINISTIC=1 turns deterministic mode on, other values name the variable",
          "[comm][options]") {
  ::unsetenv("COLTRAIN_DETERMINISTIC");
  CHECK_FALSE(comm_options_from_env().deterministic);
  ::setenv("COLTRAIN_DETERMINISTIC", "1", 1);
  CHECK(comm_options_from_env().deterministic);
  ::setenv("COLTRAIN_DETERMINISTIC", "0", 1);
  CHECK_FALSE(comm_options_from_env().deterministic);
  ::setenv("COLTRAIN_DETERMINISTIC", "yes", 1);
  CHECK_THROWS_WITH(comm_options_from_env(), Contains("COLTRAIN_DETERMINISTIC=yes"));
  ::unsetenv("COLTRAIN_DETERMINISTIC");
}

TEST_CASE("COLTRAIN_SHM turns shared memory off with 0, other values name the variable",
          "[comm][options]") {
  ::unsetenv("COLTRAIN_SHM");
  CHECK(comm_options_from_env().shared_memory);
  ::setenv("COLTRAIN_SHM", "0", 1);
  CHECK_FALSE(comm_options_from_env().shared_memory);
  ::setenv("COLTRAIN_SHM", "1", 1);
  CHECK(comm_options_from_env().shared_memory);
  ::setenv("COLTRAIN_SHM", "off", 1);
  CHECK_THROWS_WITH(comm_options_from_env(), Contains("COLTRAIN_SHM=off"));
  ::unsetenv("COLTRAIN_SHM");
}

TEST_CASE(
    "COLTRAIN_SHM_SINGLE_COPY takes 0, 1, always or a piece size, and other values name the "
    "variable",
    "[comm][options]") {
  ::unsetenv("COLTRAIN_SHM_SINGLE_COPY");
  const CommOptions defaults = comm_options_from_env();
  CHECK(defaults.shared_memory_single_copy);
  CHECK(defaults.single_copy_where_it_pays);
  ::setenv("COLTRAIN_SHM_SINGLE_COPY", "0", 1);
  CHECK_FALSE(comm_options_from_env().shared_memory_single_copy);
  ::setenv("COLTRAIN_SHM_SINGLE_COPY", "1", 1);
  CHECK(comm_options_from_env().shared_memory_single_copy);
  CHECK(comm_options_from_env().single_copy_where_it_pays);
  CHECK(comm_options_from_env().single_copy_bytes == defaults.single_copy_bytes);
  ::setenv("COLTRAIN_SHM_SINGLE_COPY", "always", 1);
  CHECK(comm_options_from_env().shared_memory_single_copy);
  CHECK_FALSE(comm_options_from_env().single_copy_where_it_pays);
  CHECK(comm_options_from_env().single_copy_bytes == defaults.single_copy_bytes);
  ::setenv("COLTRAIN_SHM_SINGLE_COPY", "1048576", 1);
  CHECK(comm_options_from_env().shared_memory_single_copy);
  CHECK(comm_options_from_env().single_copy_where_it_pays);
  CHECK(comm_options_from_env().single_copy_bytes == 1048576);
  for (const char* bad : {"100", "-65536", "64K", "yes"}) {
    ::setenv("COLTRAIN_SHM_SINGLE_COPY", bad, 1);
    CHECK_THROWS_WITH(comm_options_from_env(),
                      Contains(std::string("COLTRAIN_SHM_SINGLE_COPY=") + bad));
  }
  ::unsetenv("COLTRAIN_SHM_SINGLE_COPY");
}

TEST_CASE(
    "COLTRAIN_SPIN_US sets the polling before a wait sleeps, and bad values name the variable",
    "[comm][options]") {
  ::unsetenv("COLTRAIN_SPIN_US");
  CHECK_FALSE(comm_options_from_env().spin_before_sleep.has_value());
  ::setenv("COLTRAIN_SPIN_US", "0", 1);
  CHECK(comm_options_from_env().spin_before_sleep == std::chrono::microseconds(0));
  ::setenv("COLTRAIN_SPIN_US", "250", 1);
  CHECK(comm_options_from_env().spin_before_sleep == std::chrono::microseconds(250));
  for (const char* bad : {"-5", "50us", "10000001", "soon"}) {
    ::setenv("COLTRAIN_SPIN_US", bad, 1);
    CHECK_THROWS_WITH(comm_options_from_env(), Contains(std::string("COLTRAIN_SPIN_US=") + bad));
  }
  ::unsetenv("COLTRAIN_SPIN_US");
}

TEST_CASE("COLTRAIN_HOST_ID replaces the host identity, and a long one is refused",
          "[comm][options]") {
  using coltrain::comm::detail::host_identity;
  ::unsetenv("COLTRAIN_HOST_ID");
  CHECK(comm_options_from_env().host_id.empty());
  CHECK(host_identity() == host_identity());  // this process, asked twice
  ::setenv("COLTRAIN_HOST_ID", "node7", 1);
  CHECK(comm_options_from_env().host_id == "node7");
  CHECK(host_identity("node7") == host_identity("node7"));
  CHECK_FALSE(host_identity("node7") == host_identity("node8"));
  CHECK_FALSE(host_identity("node7") == host_identity());
  ::setenv("COLTRAIN_HOST_ID", std::string(61, 'x').c_str(), 1);
  CHECK_THROWS_WITH(comm_options_from_env(), Contains("COLTRAIN_HOST_ID has 61 characters"));
  ::unsetenv("COLTRAIN_HOST_ID");
}

TEST_CASE("the shared-memory ring size shrinks with the ranks on a host, within bounds",
          "[comm][shm]") {
  using coltrain::comm::detail::shm_ring_bytes;
  CHECK(shm_ring_bytes(1) == std::size_t{4} << 20);
  CHECK(shm_ring_bytes(3) == std::size_t{4} << 20);
  CHECK(shm_ring_bytes(7) == std::size_t{2} << 20);
  CHECK(shm_ring_bytes(15) == std::size_t{1} << 20);
  CHECK(shm_ring_bytes(127) == std::size_t{128} << 10);
  CHECK(shm_ring_bytes(1000) == std::size_t{64} << 10);
  // Up to 256 ranks on a host a rank's rings stay within 32 MiB; beyond, the 64 KiB floor holds.
  for (int peers : {1, 2, 5, 7, 15, 31, 63, 64, 127, 128, 255})
    CHECK(2 * static_cast<std::size_t>(peers) * shm_ring_bytes(peers) <= (std::size_t{32} << 20));
}

TEST_CASE("the shared-memory rings of a host fit in half of its /dev/shm, or are not made",
          "[comm][shm]") {
  using coltrain::comm::detail::shm_ring_bytes;
  constexpr std::uint64_t k64MiB = std::uint64_t{64} << 20;  // a container's default
  CHECK(shm_ring_bytes(1, k64MiB) == std::size_t{4} << 20);
  CHECK(shm_ring_bytes(3, k64MiB) == std::size_t{2} << 20);  // 6 segments: 24 MiB, not 48
  CHECK(shm_ring_bytes(15, k64MiB) == std::size_t{128} << 10);
  CHECK(shm_ring_bytes(31, k64MiB) == 0);  // 496 segments of 64 KiB rings: 64 MiB
  CHECK(shm_ring_bytes(127, k64MiB) == 0);
  CHECK(shm_ring_bytes(127, std::uint64_t{12} << 30) == std::size_t{128} << 10);
  for (int peers : {1, 3, 7, 15})
    for (std::uint64_t capacity : {k64MiB, 4 * k64MiB}) {
      const std::uint64_t ranks = static_cast<std::uint64_t>(peers) + 1;
      CHECK(ranks * (ranks - 1) / 2 * 2 * shm_ring_bytes(peers, capacity) <= capacity / 2);
    }
}
