// Launcher variables (core/env.hpp): the input is text, one NAME=VALUE per line, read as the
// process environment by detect_launch_env; every value is also read as a Slurm host list by
// first_slurm_host. launch_env.dict gives the fuzzer the variables' names. Bad input must be a
// ConfigError; an accepted environment must satisfy the rules at the top of env.hpp.

#include <coltrain/core/env.hpp>
#include <coltrain/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using coltrain::fuzz::fuzz_check;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> variables;
  while (!text.empty()) {
    const std::string_view line = text.substr(0, text.find('\n'));
    text.remove_prefix(std::min(text.size(), line.size() + 1));
    const std::size_t equals = line.find('=');
    if (equals == std::string_view::npos) continue;
    const std::string_view value = line.substr(equals + 1);
    variables.insert_or_assign(std::string(line.substr(0, equals)), std::string(value));
    try {
      const std::string host = coltrain::first_slurm_host(value);
      fuzz_check(!host.empty(), "Slurm host list: a non-empty first host");
      for (const char c : host) {
        fuzz_check(coltrain::detail::is_host_char(c), "Slurm host list: host name characters");
      }
    } catch (const coltrain::ConfigError&) {
    }
  }
  try {
    const coltrain::LaunchEnv env =
        coltrain::detect_launch_env(coltrain::env_lookup_from(std::move(variables)));
    fuzz_check(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size,
               "launch env: 0 <= rank < world size");
    fuzz_check(env.local_rank >= 0 && env.local_rank < env.world_size,
               "launch env: 0 <= local rank < world size");
    if (env.local_world_size) {
      fuzz_check(*env.local_world_size >= 1 && *env.local_world_size <= env.world_size &&
                     env.local_rank < *env.local_world_size,
                 "launch env: local rank < local world size <= world size");
    }
    fuzz_check(env.master_port >= 0 && env.master_port <= 65535,
               "launch env: port in range (0: published in COLTRAIN_PORT_FILE)");
    fuzz_check(!env.master_addr.empty(), "launch env: a master address");
  } catch (const coltrain::ConfigError&) {
  }
  return 0;
}
