#pragma once
// What the tests of the host algorithms alone share (test_algorithms_alone.cpp,
// test_exchange_algorithms_alone.cpp, test_allreduce_variants_alone.cpp): a tuning with small
// chunks, a run of ranks over the in-process transport that must succeed, and how a rank of a
// mismatched call ended.

#include <catch2/catch.hpp>

#include <coltrain/comm/tuning/algorithm_tuning.hpp>
#include <coltrain/core/error.hpp>

#include "../support/in_process_transport.hpp"

#include <exception>
#include <functional>
#include <string>

namespace coltrain::testing {

// Small chunks, so that a few thousand elements already pipeline through several chunks a block.
inline comm::AlgorithmTuning small_chunks() {
  comm::AlgorithmTuning tuning;
  tuning.chunk_bytes = 1024;
  tuning.min_chunk_bytes = 256;
  tuning.min_chunks_per_block = 2;
  return tuning;
}

// run_in_process() for a collective that must succeed: rethrows the first rank's error, and
// checks that every message sent was received.
inline void run_ranks(int p, const std::function<void(InProcessTransport&)>& body) {
  const InProcessOutcome outcome = run_in_process(p, body);
  for (const std::exception_ptr& error : outcome.errors)
    if (error) std::rethrow_exception(error);
  CHECK(outcome.undelivered == 0);
}

// How a rank of a mismatched call ended: "" if it returned, the message of its MismatchError, or
// "not a MismatchError: ..." for any other error.
inline std::string ending(const std::exception_ptr& error) {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const MismatchError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a MismatchError: ") + e.what();
  }
}

}  // namespace coltrain::testing
