// Message headers (comm/protocol/message_header.hpp): the input's first 40 bytes are a header
// received from a peer, checked against a fixed expected one. check_header must refuse every header
// that differs in a field it compares, with a MismatchError, and describe_call any header, however
// garbled.

#include <coltrain/comm/protocol/message_header.hpp>
#include <coltrain/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using coltrain::comm::MessageHeader;
  MessageHeader received{};
  std::memcpy(&received, data, std::min(size, sizeof received));
  const MessageHeader expected{.collective = coltrain::comm::Collective::kReduce,
                               .algorithm = coltrain::comm::Algorithm::kTree,
                               .dtype = coltrain::DataType::kFloat16,
                               .op = coltrain::comm::ReduceOp::kMax,
                               .root = 3,
                               .sequence = 41,
                               .count = 1000,
                               .bytes = 4000};
  static_cast<void>(coltrain::comm::detail::describe_call(received));
  try {
    coltrain::comm::check_header(expected, received, 0, 1);
    coltrain::fuzz::fuzz_check(
        received.magic == expected.magic && received.collective == expected.collective &&
            received.algorithm == expected.algorithm && received.dtype == expected.dtype &&
            received.op == expected.op && received.root == expected.root &&
            received.sequence == expected.sequence && received.count == expected.count &&
            received.bytes == expected.bytes,
        "message header: accepted only when every compared field matches");
  } catch (const coltrain::MismatchError&) {
  }
  return 0;
}
