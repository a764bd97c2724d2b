// The sample trainers' command-line parser (samples/common/command_line.hpp).
#include "command_line.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Parsed {
  std::optional<int> status;
  std::string out, err;
};

// Parses `args` (without the program name) with `line`.
Parsed parse(sample::CommandLine& line, std::vector<const char*> args) {
  args.insert(args.begin(), "prog");
  std::ostringstream out, err;
  Parsed parsed;
  parsed.status = line.parse(static_cast<int>(args.size()), args.data(), out, err);
  parsed.out = out.str();
  parsed.err = err.str();
  return parsed;
}

struct Values {
  std::string backend = "auto";
  int epochs = 10;
  std::int64_t batch = 64;
  double lr = 0.05;
  std::uint64_t seed = 1;
  int zero = 0;
  std::optional<int> warmup;
  std::optional<double> clip;
  bool nesterov = false;
  std::optional<bool> progress;
  bool resume = false;
  std::string resume_from;
};

sample::CommandLine make_line(Values& v) {
  sample::CommandLine line("a test program", "prog");
  line.option("--backend", v.backend, "backend").choices({"auto", "mpi", "tcp"}).show_default();
  line.option("--epochs", v.epochs, "epochs").positive().show_default();
  line.option("--batch-size", v.batch, "batch").positive();
  line.option("--lr", v.lr, "rate").show_default();
  line.option("--seed", v.seed, "seed");
  line.option("--zero", v.zero, "stage").choices({0, 1});
  line.option("--warmup-epochs", v.warmup, "warm-up").non_negative();
  line.option("--clip", v.clip, "clip").positive();
  line.flag("--nesterov", v.nesterov, "nesterov");
  line.flag(
      "--no-progress", [&v] { v.progress = false; }, "no bar");
  line.optional_value(
      "--resume", "DIR",
      [&v](const std::string& dir) {
        v.resume = true;
        v.resume_from = dir;
      },
      "resume");
  return line;
}

}  // namespace

TEST_CASE("values in both spellings, flags and optionals reach their variables") {
  Values v;
  sample::CommandLine line = make_line(v);
  const Parsed p =
      parse(line, {"--backend", "tcp", "--epochs=3", "--batch-size", "+128", "--lr", "1e-3",
                   "--seed", "18446744073709551615", "--zero", "1", "--warmup-epochs", "0",
                   "--clip=0.5", "--nesterov", "--no-progress"});
  CHECK_FALSE(p.status);
  CHECK(p.err.empty());
  CHECK(v.backend == "tcp");
  CHECK(v.epochs == 3);
  CHECK(v.batch == 128);
  CHECK(v.lr == 1e-3);
  CHECK(v.seed == 18446744073709551615u);
  CHECK(v.zero == 1);
  CHECK(v.warmup == 0);
  CHECK(v.clip == 0.5);
  CHECK(v.nesterov);
  CHECK(v.progress == false);
  CHECK_FALSE(v.resume);
}

TEST_CASE("the last of a repeated option wins, and nothing given leaves the defaults") {
  Values v;
  sample::CommandLine line = make_line(v);
  CHECK_FALSE(parse(line, {}).status);
  CHECK(v.epochs == 10);
  CHECK_FALSE(v.warmup);
  CHECK_FALSE(parse(line, {"--epochs", "4", "--epochs", "5"}).status);
  CHECK(v.epochs == 5);
}

TEST_CASE("an optional value is taken unless the next argument is an option") {
  Values v;
  sample::CommandLine line = make_line(v);
  CHECK_FALSE(parse(line, {"--resume", "--epochs", "2"}).status);
  CHECK(v.resume);
  CHECK(v.resume_from.empty());
  CHECK(v.epochs == 2);
  CHECK_FALSE(parse(line, {"--resume", "runs/a"}).status);
  CHECK(v.resume_from == "runs/a");
  CHECK_FALSE(parse(line, {"--resume=runs/b", "--nesterov"}).status);
  CHECK(v.resume_from == "runs/b");
  CHECK(v.nesterov);
}

TEST_CASE("each refusal is exit status 1 and a message naming the option and the value") {
  struct Case {
    std::vector<const char*> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--epochs", "0"}, "--epochs: 0 is not positive"},
      {{"--epochs", "-2"}, "--epochs: -2 is not positive"},
      {{"--epochs", "3x"}, "--epochs: '3x' is not an integer"},
      {{"--epochs", "99999999999"}, "--epochs: '99999999999' is not an integer in range"},
      {{"--epochs"}, "--epochs needs a value"},
      {{"--lr", "fast"}, "--lr: 'fast' is not a number"},
      {{"--seed", "-1"}, "--seed: '-1' is not a non-negative integer"},
      {{"--backend", "gloo"}, "--backend: 'gloo' is not one of auto, mpi, tcp"},
      {{"--zero", "2"}, "--zero: '2' is not one of 0, 1"},
      {{"--warmup-epochs", "-1"}, "--warmup-epochs: -1 is not non-negative"},
      {{"--clip", "0"}, "--clip: 0 is not positive"},
      {{"--nesterov=yes"}, "--nesterov takes no value"},
      {{"--bogus"}, "unknown option --bogus"},
      {{"-x"}, "'-x': not an option"},
      {{"train"}, "'train': not an option"},
  };
  for (const Case& c : cases) {
    Values v;
    sample::CommandLine line = make_line(v);
    const Parsed p = parse(line, c.args);
    INFO(c.args.front());
    CHECK(p.status == 1);
    CHECK(p.err.starts_with("prog: " + c.message));
    CHECK(p.err.find("prog --help lists the options") != std::string::npos);
  }
}

TEST_CASE("an option spelled with leading zeros is checked by its value") {
  Values v;
  sample::CommandLine line = make_line(v);
  CHECK_FALSE(parse(line, {"--zero", "01"}).status);
  CHECK(v.zero == 1);
}

TEST_CASE("--help lists every option with its choices and defaults, and ends the run") {
  Values v;
  sample::CommandLine line = make_line(v);
  const Parsed p = parse(line, {"--epochs", "7", "--help", "--bogus"});
  CHECK(p.status == 0);
  CHECK(p.err.empty());
  CHECK(p.out.starts_with("a test program\nUsage: prog [OPTIONS]\n"));
  CHECK(p.out.find("--backend auto|mpi|tcp  (default: auto)\n      backend\n") !=
        std::string::npos);
  // The default shown is the value when the option was declared, not one parsed since.
  CHECK(p.out.find("--epochs INT  (default: 10)") != std::string::npos);
  CHECK(p.out.find("--lr NUMBER  (default: 0.05)") != std::string::npos);
  CHECK(p.out.find("--zero 0|1\n") != std::string::npos);
  CHECK(p.out.find("--resume [DIR]\n") != std::string::npos);
  CHECK(p.out.find("--nesterov\n      nesterov\n") != std::string::npos);
  CHECK(parse(line, {"-h"}).status == 0);
}

TEST_CASE("declaring an option twice or without -- is a programming error") {
  sample::CommandLine line("d", "prog");
  int value = 0;
  line.option("--n", value, "n");
  CHECK_THROWS_WITH(line.option("--n", value, "again"), Catch::Contains("option --n added twice"));
  CHECK_THROWS_WITH(line.option("n", value, "bare"), Catch::Contains("option name n"));
}
