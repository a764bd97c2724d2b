// The two allreduce variants beside ring, tree and halving-doubling, each header alone over an
// in-process transport (tests/support/in_process_transport.hpp), one thread per rank, with no
// Communicator: hierarchical allreduce (hierarchical.hpp) on host layouts of equal and unequal
// hosts, adjacent and interleaved, and compressed allreduce (compressed_allreduce.hpp) with bf16
// and f16 on the wire. Counts leave empty and uneven segments and cut into several chunks (small
// chunks in the tuning); inputs and expected values are exact by construction.
#include <catch2/catch.hpp>

#include <coltrain/comm/algorithms/compressed_allreduce.hpp>
#include <coltrain/comm/algorithms/hierarchical.hpp>
#include <coltrain/comm/algorithms/reduce_kernels.hpp>
#include <coltrain/comm/host_layout.hpp>
#include <coltrain/comm/protocol/message_header.hpp>

#include "../support/in_process_transport.hpp"
#include "algorithms_alone.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

using namespace coltrain;
using namespace coltrain::comm;
using coltrain::testing::ending;
using coltrain::testing::InProcessOutcome;
using coltrain::testing::InProcessTransport;
using coltrain::testing::run_in_process;
using coltrain::testing::run_ranks;
using coltrain::testing::small_chunks;

namespace {

MessageHeader allreduce_call(Algorithm algorithm, DataType dtype, std::size_t count, ReduceOp op,
                             WireCompression compression = WireCompression::kNone) {
  MessageHeader call;
  call.collective = Collective::kAllreduce;
  call.algorithm = algorithm;
  call.dtype = dtype;
  call.op = op;
  call.compression = compression;
  call.sequence = 11;
  call.count = count;
  return call;
}

const std::vector<std::size_t> kCounts = {0, 1, 2, 5, 13, 1000, 4099};

// ---- hierarchical

// Rank r's element i: distinct per rank and element, signed, and far enough apart that an element
// from the wrong rank or position shows; int64 sums are exact in any order.
std::int64_t input_value(int rank, std::size_t i) {
  return (std::int64_t{rank} + 1) * 1000003 - static_cast<std::int64_t>(i) * 7919 +
         (static_cast<std::int64_t>(i % 5) - 2) * 65537;
}

// The reduction over p ranks; kAvg truncates toward zero, as divide_by_ranks does for integers.
std::int64_t reduced(int p, std::size_t i, ReduceOp op) {
  std::int64_t result = input_value(0, i);
  for (int r = 1; r < p; ++r) {
    const std::int64_t v = input_value(r, i);
    result = op == ReduceOp::kMax ? std::max(result, v) : result + v;
  }
  return op == ReduceOp::kAvg ? result / p : result;
}

// Which host each rank is on, hosts numbered in the order of their lowest rank.
const std::vector<std::vector<int>> kHostLayouts = {
    {0},                       // one rank
    {0, 1},                    // two hosts of one rank: the ring across hosts alone
    {0, 0, 0},                 // one host of three: the rings inside it alone
    {0, 0, 1, 1},              // two hosts of two, each host's ranks adjacent
    {0, 1, 0, 1},              // the same hosts, ranks placed cyclically
    {0, 0, 0, 1, 1, 1},        // two hosts of three
    {0, 1, 2, 0, 1, 2},        // three hosts of two, cyclic
    {0, 1, 2, 3, 0, 1, 2, 3},  // four hosts of two
    // Hosts of unequal sizes: reduce to each host's first rank, ring across them, broadcast.
    {0, 0, 1},              // 2 + 1
    {0, 1, 1, 1},           // 1 + 3
    {0, 0, 0, 1, 1},        // 3 + 2
    {0, 1, 0, 2, 1, 1, 2},  // 2 + 3 + 2, interleaved
    {0, 0, 0, 0, 1, 2, 2},  // 4 + 1 + 2
};

std::string describe(const std::vector<int>& host_of) {
  std::string text = "hosts of ranks {";
  for (std::size_t r = 0; r < host_of.size(); ++r)
    text += (r == 0 ? "" : ", ") + std::to_string(host_of[r]);
  return text + "}";
}

// ---- compressed

// The 16-bit wire formats as round-to-nearest-even to a number of significant bits, written here
// independently of core/dtype.hpp: bf16 keeps 8 bits; f16 keeps 11, and below its smallest normal
// (2^-14) counts units of 2^-24. Values stay inside f16's range here (below 65504).
float round_to_wire(float x, WireCompression wire) {
  if (x == 0.0f) return x;
  const int bits = wire == WireCompression::kFloat16 ? 11 : 8;
  if (wire == WireCompression::kFloat16 && std::fabs(x) < 0x1p-14f)
    return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(double{x}, 24)), -24));
  int exponent = 0;
  std::frexp(x, &exponent);  // x = m 2^exponent, 0.5 <= |m| < 1
  const double scaled = std::ldexp(double{x}, bits - exponent);
  return static_cast<float>(std::ldexp(std::nearbyint(scaled), exponent - bits));
}

// Element i of rank r for the exact cases: +-(a + r) 2^e with a = 1 + i % 23, e = i % 17 - 8.
// Every input, every partial sum over up to 9 ranks (at most 9 * 23 + 36 = 243 units of 2^e),
// every maximum and every average is held exactly by bf16 (8 significant bits) and by f16 (11;
// from 2^-8, a normal f16, up to 243 * 2^8 = 62208 < 65504), so the result is exact whatever the
// order of summation.
float exact_value(int rank, std::size_t i) {
  const int sign = i % 3 == 0 ? -1 : 1;
  const auto units = static_cast<double>(1 + static_cast<int>(i % 23) + rank);
  return static_cast<float>(std::ldexp(sign * units, static_cast<int>(i % 17) - 8));
}

float exact_result(int p, std::size_t i, ReduceOp op) {
  double result = exact_value(0, i);
  for (int r = 1; r < p; ++r) {
    const double v = exact_value(r, i);
    result = op == ReduceOp::kMax   ? std::max(result, v)
             : op == ReduceOp::kMin ? std::min(result, v)
                                    : result + v;
  }
  return static_cast<float>(op == ReduceOp::kAvg ? result / p : result);
}

// Element i of rank r for the rounding cases: +-(1 + h / 2^23) 2^e, a full 24-bit significand that
// neither wire format holds, e from -2 to 2.
float unrepresentable_value(int rank, std::size_t i) {
  const std::uint32_t h =
      static_cast<std::uint32_t>((static_cast<std::uint64_t>(rank) * 7919 + i * 104729 + 1) *
                                 2654435761u) &
      0x7fffffu;
  const int sign = (static_cast<std::size_t>(rank) + i) % 3 == 0 ? -1 : 1;
  const double significand = 1.0 + std::ldexp(static_cast<double>(h), -23);
  return static_cast<float>(std::ldexp(
      sign * significand, static_cast<int>((static_cast<std::size_t>(rank) + i) % 5) - 2));
}

// What an output holds before the call: held by neither wire format, so never a result.
constexpr float kUnwritten = 0.1f;

std::vector<float> values_of(int rank, std::size_t count, float (*value)(int, std::size_t)) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = value(rank, i);
  return values;
}

}  // namespace

TEST_CASE(
    "Algorithms alone: hierarchical allreduce gives the exact reduction on hosts of equal "
    "and unequal sizes",
    "[algorithms][alone]") {
  // Every layout, op and count, out of place and in place (the Communicator's in-place allreduce
  // passes one buffer as both).
  const AlgorithmTuning tuning = small_chunks();
  int uniform_layouts = 0;
  int uneven_layouts = 0;
  for (const std::vector<int>& host_of : kHostLayouts) {
    const HostLayout hosts(host_of);
    (hosts.uniform() ? uniform_layouts : uneven_layouts) += 1;
    const int p = hosts.ranks();
    const auto n = static_cast<std::size_t>(p);
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
      for (const std::size_t count : kCounts) {
        for (const bool in_place : {false, true}) {
          INFO(describe(host_of) << ", " << name_of(op) << ", count " << count
                                 << (in_place ? ", in place" : ""));
          std::vector<std::vector<std::int64_t>> outputs(n);
          run_ranks(p, [&](InProcessTransport& t) {
            std::vector<std::int64_t>& out = outputs[static_cast<std::size_t>(t.rank())];
            std::vector<std::int64_t> in(count);
            for (std::size_t i = 0; i < count; ++i) in[i] = input_value(t.rank(), i);
            if (in_place)
              out = in;
            else
              out.assign(count, -1);
            AlgorithmScratch scratch;
            hierarchical_allreduce(
                t, hosts, reinterpret_cast<const std::byte*>(in_place ? out.data() : in.data()),
                reinterpret_cast<std::byte*>(out.data()), count,
                element_reduction<std::int64_t>(op),
                allreduce_call(Algorithm::kHierarchical, DataType::kInt64, count, op), tuning,
                scratch);
          });
          std::vector<std::int64_t> expected(count);
          for (std::size_t i = 0; i < count; ++i) expected[i] = reduced(p, i, op);
          for (std::size_t r = 0; r < n; ++r) {
            INFO("rank " << r);
            REQUIRE(outputs[r] == expected);
          }
        }
      }
    }
  }
  // Both of the header's paths ran.
  CHECK(uniform_layouts > 0);
  CHECK(uneven_layouts > 0);
}

TEST_CASE(
    "Algorithms alone: compressed allreduce is exact where the wire format holds the inputs "
    "and the results",
    "[algorithms][alone]") {
  // Inputs, sums, maxima, minima and averages all held by bf16 and f16 (exact_value): nothing is
  // rounded, so any element out of place, any padding that leaks in (count not a multiple of p)
  // or any block lost shows as a wrong value. In place too, which the header allows.
  const AlgorithmTuning tuning = small_chunks();
  for (const WireCompression wire : {WireCompression::kBFloat16, WireCompression::kFloat16}) {
    for (const int p : {1, 2, 3, 4, 5, 6, 7, 8, 9}) {
      const auto n = static_cast<std::size_t>(p);
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        for (const std::size_t count : kCounts) {
          for (const bool in_place : {false, true}) {
            INFO(name_of(wire) << ", p = " << p << ", " << name_of(op) << ", count " << count
                               << (in_place ? ", in place" : ""));
            std::vector<std::vector<float>> outputs(n);
            run_ranks(p, [&](InProcessTransport& t) {
              std::vector<float>& out = outputs[static_cast<std::size_t>(t.rank())];
              const std::vector<float> in = values_of(t.rank(), count, exact_value);
              if (in_place)
                out = in;
              else
                out.assign(count, kUnwritten);
              std::vector<std::byte> scratch;
              compressed_allreduce(
                  t, in_place ? out.data() : in.data(), out.data(), count, op,
                  allreduce_call(Algorithm::kRing, DataType::kFloat32, count, op, wire), tuning,
                  scratch);
            });
            std::vector<float> expected(count);
            for (std::size_t i = 0; i < count; ++i) expected[i] = exact_result(p, i, op);
            for (std::size_t r = 0; r < n; ++r) {
              INFO("rank " << r);
              REQUIRE(outputs[r] == expected);
            }
          }
        }
      }
    }
  }
}

TEST_CASE(
    "Algorithms alone: compressed allreduce rounds each input once and the f32 reduction once",
    "[algorithms][alone]") {
  // Inputs with full 24-bit significands. The header promises round(((w0 + w1) + w2) + ...) with
  // w_r = round(x_r), the sums in f32 (kAvg: then divided by p in f32), rounded once more; the
  // reference rounds with round_to_wire, not with the library's types. The inputs are checked to
  // tell that from two wrong readings: not rounding the inputs, and rounding after every addition.
  const AlgorithmTuning tuning = small_chunks();
  std::size_t unlike_unrounded_inputs = 0;
  std::size_t unlike_rounding_each_sum = 0;
  for (const WireCompression wire : {WireCompression::kBFloat16, WireCompression::kFloat16}) {
    for (const int p : {1, 2, 3, 4, 5, 7, 9}) {
      const auto n = static_cast<std::size_t>(p);
      for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        for (const std::size_t count : {std::size_t{1}, std::size_t{5}, std::size_t{1000}}) {
          INFO(name_of(wire) << ", p = " << p << ", " << name_of(op) << ", count " << count);
          std::vector<std::vector<float>> outputs(n);
          run_ranks(p, [&](InProcessTransport& t) {
            std::vector<float>& out = outputs[static_cast<std::size_t>(t.rank())];
            const std::vector<float> in = values_of(t.rank(), count, unrepresentable_value);
            out.assign(count, kUnwritten);
            std::vector<std::byte> scratch;
            compressed_allreduce(
                t, in.data(), out.data(), count, op,
                allreduce_call(Algorithm::kRing, DataType::kFloat32, count, op, wire), tuning,
                scratch);
          });
          std::vector<float> expected(count);
          for (std::size_t i = 0; i < count; ++i) {
            float sum = round_to_wire(unrepresentable_value(0, i), wire);
            float unrounded = unrepresentable_value(0, i);
            float rounded_each = sum;
            for (int r = 1; r < p; ++r) {
              const float x = unrepresentable_value(r, i);
              sum = sum + round_to_wire(x, wire);
              unrounded = unrounded + x;
              rounded_each = round_to_wire(rounded_each + round_to_wire(x, wire), wire);
            }
            if (op == ReduceOp::kAvg) {
              sum = sum / static_cast<float>(p);
              unrounded = unrounded / static_cast<float>(p);
              rounded_each = rounded_each / static_cast<float>(p);
            }
            expected[i] = round_to_wire(sum, wire);
            unlike_unrounded_inputs += expected[i] != round_to_wire(unrounded, wire) ? 1 : 0;
            unlike_rounding_each_sum += expected[i] != round_to_wire(rounded_each, wire) ? 1 : 0;
          }
          for (std::size_t r = 0; r < n; ++r) {
            INFO("rank " << r);
            REQUIRE(outputs[r] == expected);
          }
        }
      }
    }
  }
  CHECK(unlike_unrounded_inputs > 100);
  CHECK(unlike_rounding_each_sum > 100);
}

TEST_CASE(
    "Algorithms alone: compressed allreduce adds the ranks' values in rank order, which decides "
    "a rounding tie",
    "[algorithms][alone]") {
  // Four ranks add big, h, t and t (element 0) or t, t, h and big (element 1), all held by the
  // wire format: h is half big's ulp in that format, and t is so small beside big that big + h + t
  // is a tie in f32, which rounds back to big + h. Summed in rank order, element 0 ends at
  // big + h, a tie in the wire format that rounds to even, big; element 1 at big + h + 2t, above
  // the tie, which rounds up to big + 2h. Summed in the other order, each gives the other's result.
  struct Case {
    WireCompression wire;
    float big, h, t;
  };
  for (const Case& c : {Case{WireCompression::kBFloat16, 0x1p24f, 0x1p16f, 1.0f},
                        Case{WireCompression::kFloat16, 1024.0f, 0.5f, 0x1p-14f}}) {
    INFO(name_of(c.wire));
    const std::vector<std::vector<float>> inputs = {
        {c.big, c.t}, {c.h, c.t}, {c.t, c.h}, {c.t, c.big}};
    std::vector<std::vector<float>> outputs(4);
    run_ranks(4, [&](InProcessTransport& t) {
      const auto r = static_cast<std::size_t>(t.rank());
      outputs[r].assign(2, kUnwritten);
      std::vector<std::byte> scratch;
      compressed_allreduce(
          t, inputs[r].data(), outputs[r].data(), 2, ReduceOp::kSum,
          allreduce_call(Algorithm::kRing, DataType::kFloat32, 2, ReduceOp::kSum, c.wire),
          small_chunks(), scratch);
    });
    for (std::size_t r = 0; r < 4; ++r) {
      INFO("rank " << r);
      REQUIRE(outputs[r] == std::vector<float>{c.big, c.big + 2 * c.h});
    }
  }
}

TEST_CASE(
    "Algorithms alone: compressed and hierarchical allreduce ranks that disagree on the call "
    "fail with a MismatchError",
    "[algorithms][alone]") {
  // Two ranks, so that each receives the other's first message and names the difference.
  const AlgorithmTuning tuning = small_chunks();
  const std::size_t count = 40;
  SECTION("compressed: rank 1 sends f16 where rank 0 sends bf16") {
    const InProcessOutcome outcome = run_in_process(
        2,
        [&](InProcessTransport& t) {
          const std::vector<float> in = values_of(t.rank(), count, exact_value);
          std::vector<float> out(count);
          const WireCompression wire =
              t.rank() == 1 ? WireCompression::kFloat16 : WireCompression::kBFloat16;
          std::vector<std::byte> scratch;
          compressed_allreduce(
              t, in.data(), out.data(), count, ReduceOp::kSum,
              allreduce_call(Algorithm::kRing, DataType::kFloat32, count, ReduceOp::kSum, wire),
              tuning, scratch);
        },
        std::chrono::seconds(5));
    for (std::size_t r = 0; r < 2; ++r) {
      const std::string error = ending(outcome.errors[r]);
      INFO("rank " << r << ": " << error);
      CHECK(error.find("wire compression differs between ranks") != std::string::npos);
    }
  }
  SECTION("hierarchical, two hosts of one rank: rank 1 takes the maximum, rank 0 the sum") {
    const HostLayout hosts(std::vector<int>{0, 1});
    const InProcessOutcome outcome = run_in_process(
        2,
        [&](InProcessTransport& t) {
          std::vector<std::int64_t> in(count, input_value(t.rank(), 0));
          std::vector<std::int64_t> out(count);
          const ReduceOp op = t.rank() == 1 ? ReduceOp::kMax : ReduceOp::kSum;
          AlgorithmScratch scratch;
          hierarchical_allreduce(
              t, hosts, reinterpret_cast<const std::byte*>(in.data()),
              reinterpret_cast<std::byte*>(out.data()), count, element_reduction<std::int64_t>(op),
              allreduce_call(Algorithm::kHierarchical, DataType::kInt64, count, op), tuning,
              scratch);
        },
        std::chrono::seconds(5));
    for (std::size_t r = 0; r < 2; ++r) {
      const std::string error = ending(outcome.errors[r]);
      INFO("rank " << r << ": " << error);
      CHECK(error.find("reduction op differs between ranks") != std::string::npos);
    }
  }
}
