#include <catch2/catch.hpp>
#include <coltrain/core/error.hpp>

#include <string>
#include <type_traits>

using Catch::Matchers::Contains;

TEST_CASE("error message names every context field that is set", "[error]") {
  coltrain::ErrorContext context;
  context.rank = 3;
  context.peer = 1;
  context.operation = "allreduce";
  context.sequence = 42;
  const coltrain::MismatchError error("count differs: 10 vs 12", context);
  const std::string what = error.what();
  CHECK(what ==
        "coltrain: count differs: 10 vs 12 [rank 3, peer 1, operation allreduce, "
        "sequence #42]");
  CHECK(error.message() == "count differs: 10 vs 12");
  REQUIRE(error.context().rank);
  CHECK(*error.context().rank == 3);
}

TEST_CASE("error without context prints only the message", "[error]") {
  const coltrain::InvalidArgument error("bad size");
  CHECK(std::string(error.what()) == "coltrain: bad size");
}

TEST_CASE("I/O errors name the file and the offset", "[error]") {
  coltrain::ErrorContext context;
  context.file = "train-images-idx3-ubyte";
  context.offset = 16;
  const coltrain::IoError error("truncated image data", context);
  CHECK_THAT(error.what(), Contains("file train-images-idx3-ubyte") && Contains("offset 16"));
}

TEST_CASE("exception hierarchy lets callers catch by kind", "[error]") {
  STATIC_REQUIRE(std::is_base_of_v<coltrain::CommError, coltrain::TimeoutError>);
  STATIC_REQUIRE(std::is_base_of_v<coltrain::CommError, coltrain::PeerLostError>);
  STATIC_REQUIRE(std::is_base_of_v<coltrain::CommError, coltrain::MismatchError>);
  STATIC_REQUIRE(std::is_base_of_v<coltrain::Error, coltrain::CommError>);
  STATIC_REQUIRE(std::is_base_of_v<coltrain::Error, coltrain::BackendError>);
  STATIC_REQUIRE(std::is_base_of_v<coltrain::Error, coltrain::ConfigError>);
  STATIC_REQUIRE(std::is_base_of_v<coltrain::Error, coltrain::IoError>);
  STATIC_REQUIRE(std::is_base_of_v<std::runtime_error, coltrain::Error>);
  CHECK_THROWS_AS(throw coltrain::PeerLostError("peer 2 closed the connection"),
                  coltrain::CommError);
}

TEST_CASE("backend error carries library, code, call and source line", "[error]") {
  try {
    coltrain::detail::throw_backend_error("NCCL", 3, "internal error", "ncclAllReduce(...)",
                                          "collectives.hpp", 120);
    FAIL("throw_backend_error returned");
  } catch (const coltrain::BackendError& e) {
    CHECK(e.library() == "NCCL");
    CHECK(e.code() == 3);
    CHECK(std::string(e.what()) ==
          "coltrain: NCCL error 3: internal error [operation ncclAllReduce(...), "
          "collectives.hpp:120]");
  }
}
