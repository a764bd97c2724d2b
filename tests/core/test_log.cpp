#include <catch2/catch.hpp>
#include <coltrain/core/log.hpp>

#include <cstdlib>
#include <sstream>

using Catch::Matchers::Contains;

TEST_CASE("log lines carry the rank prefix and the level", "[log]") {
  std::ostringstream log, print;
  const coltrain::Logger logger(2, 4, coltrain::LogLevel::kInfo, log, print);
  logger.info("connected to ", 3, " peers");
  CHECK(log.str() == "[coltrain rank 2/4] info: connected to 3 peers\n");
  CHECK(print.str().empty());
}

TEST_CASE("messages above the logger's level are dropped", "[log]") {
  std::ostringstream log, print;
  const coltrain::Logger logger(0, 1, coltrain::LogLevel::kWarn, log, print);
  logger.debug("hidden");
  logger.info("hidden");
  logger.warn("shown");
  logger.error("shown too");
  CHECK(log.str() == "[coltrain rank 0/1] warn: shown\n[coltrain rank 0/1] error: shown too\n");
}

TEST_CASE("print_root prints on rank 0 only and ignores the level", "[log]") {
  std::ostringstream log, print0, print1;
  coltrain::Logger(0, 2, coltrain::LogLevel::kError, log, print0).print_root("epoch ", 1);
  coltrain::Logger(1, 2, coltrain::LogLevel::kDebug, log, print1).print_root("epoch ", 1);
  CHECK(print0.str() == "epoch 1\n");
  CHECK(print1.str().empty());
  CHECK(log.str().empty());
}

TEST_CASE("log level names parse, and unknown names are rejected", "[log]") {
  for (auto level : {coltrain::LogLevel::kError, coltrain::LogLevel::kWarn,
                     coltrain::LogLevel::kInfo, coltrain::LogLevel::kDebug}) {
    CHECK(coltrain::parse_log_level(coltrain::name_of(level)) == level);
  }
  CHECK_THROWS_WITH(coltrain::parse_log_level("verbose"), Contains("'verbose'"));
}

TEST_CASE("COLTRAIN_LOG_LEVEL chooses the level, a bad value names the variable", "[log]") {
  ::setenv("COLTRAIN_LOG_LEVEL", "debug", 1);
  CHECK(coltrain::log_level_from_env() == coltrain::LogLevel::kDebug);
  ::setenv("COLTRAIN_LOG_LEVEL", "loud", 1);
  CHECK_THROWS_AS(coltrain::log_level_from_env(), coltrain::ConfigError);
  CHECK_THROWS_WITH(coltrain::log_level_from_env(), Contains("COLTRAIN_LOG_LEVEL=loud"));
  ::unsetenv("COLTRAIN_LOG_LEVEL");
  CHECK(coltrain::log_level_from_env(coltrain::LogLevel::kInfo) == coltrain::LogLevel::kInfo);
}
