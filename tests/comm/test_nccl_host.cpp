// The parts of the NCCL backend that need NCCL's headers but no GPU: the dtype and op maps, the
// unique id's trip over the host bootstrap (real TCP ranks), and the rank checks. Its schedules
// need neither and are tested in every build (test_nccl_schedules.cpp).
#include <catch2/catch.hpp>

#include "../support/tcp_launch.hpp"

#include <coltrain/comm/communicator.hpp>
#include <coltrain/comm/device/nccl/nccl_backend.hpp>
#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>

#include <nccl.h>

#include <cstdint>
#include <cstring>

using Catch::Matchers::Contains;
using coltrain::DataType;
using coltrain::comm::ReduceOp;
namespace detail = coltrain::comm::detail;

namespace {

// A recognisable id: rank 0's bytes differ from every other rank's zeroes in every byte.
ncclUniqueId patterned_id() {
  ncclUniqueId id;
  for (std::size_t i = 0; i < sizeof(id.internal); ++i) {
    id.internal[i] = static_cast<char>((i * 37 + 11) & 0xff);
  }
  return id;
}

}  // namespace

TEST_CASE("every DataType maps to the NCCL type of the same width and kind", "[nccl]") {
  CHECK(detail::nccl_data_type(DataType::kFloat32) == ncclFloat32);
  CHECK(detail::nccl_data_type(DataType::kFloat64) == ncclFloat64);
  CHECK(detail::nccl_data_type(DataType::kFloat16) == ncclFloat16);
  CHECK(detail::nccl_data_type(DataType::kBFloat16) == ncclBfloat16);
  CHECK(detail::nccl_data_type(DataType::kInt32) == ncclInt32);
  CHECK(detail::nccl_data_type(DataType::kInt64) == ncclInt64);
  CHECK(detail::nccl_data_type(DataType::kUInt8) == ncclUint8);
  CHECK_THROWS_MATCHES(detail::nccl_data_type(static_cast<DataType>(42)), coltrain::InvalidArgument,
                       Catch::Matchers::Message(
                           "coltrain: dtype value 42 is not a coltrain DataType; NCCL takes f32, "
                           "f64, f16, bf16, i32, i64 and u8"));
}

TEST_CASE("every ReduceOp maps to its NCCL op, avg is NCCL's own", "[nccl]") {
  CHECK(detail::nccl_reduce_op(ReduceOp::kSum) == ncclSum);
  CHECK(detail::nccl_reduce_op(ReduceOp::kProd) == ncclProd);
  CHECK(detail::nccl_reduce_op(ReduceOp::kMin) == ncclMin);
  CHECK(detail::nccl_reduce_op(ReduceOp::kMax) == ncclMax);
  CHECK(detail::nccl_reduce_op(ReduceOp::kAvg) == ncclAvg);
  CHECK_THROWS_WITH(detail::nccl_reduce_op(static_cast<ReduceOp>(9)),
                    Contains("reduction op value 9 is not a coltrain ReduceOp"));
}

TEST_CASE("a unique id survives its conversion to the words the host collectives carry", "[nccl]") {
  const ncclUniqueId id = patterned_id();
  const ncclUniqueId back = detail::unique_id_from_words(detail::unique_id_words(id));
  CHECK(std::memcmp(&id, &back, sizeof(id)) == 0);
}

TEST_CASE("rank 0's unique id reaches every rank over the TCP bootstrap", "[nccl][tcp]") {
  const int world_size = GENERATE(1, 2, 3);
  CAPTURE(world_size);
  const auto outcomes = coltrain::testing::launch_ranks(world_size, [](int rank) {
    auto bootstrap = coltrain::comm::Communicator::tcp(coltrain::detect_launch_env());
    const ncclUniqueId mine = rank == 0 ? patterned_id() : ncclUniqueId{};
    const ncclUniqueId got = detail::broadcast_unique_id(bootstrap, mine);
    const ncclUniqueId expected = patterned_id();
    coltrain::testing::expect(std::memcmp(&got, &expected, sizeof(got)) == 0,
                              "rank " + std::to_string(rank) + " holds rank 0's id");
  });
  INFO(coltrain::testing::describe(outcomes));
  for (const auto& outcome : outcomes) CHECK(outcome.passed());
}

TEST_CASE("the NCCL backend refuses a rank outside its world before it touches a GPU", "[nccl]") {
  CHECK_THROWS_WITH(coltrain::comm::NcclBackend(2, 2, ncclUniqueId{}, 0),
                    Contains("rank 2 is outside a world of 2 ranks"));
  CHECK_THROWS_WITH(coltrain::comm::NcclBackend(0, 0, ncclUniqueId{}, 0),
                    Contains("outside a world of 0 ranks"));
}
