#pragma once
// Where this process sits in the job, read from the variables its launcher exported.
//
// Rules, and why:
// - Sources, by precedence: torchrun/Kubeflow (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) >
//   Open MPI (OMPI_COMM_WORLD_*) > MPICH/Hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
//   MPI_LOCALNRANKS) > Slurm (SLURM_PROCID, SLURM_NTASKS or else SLURM_NPROCS, SLURM_LOCALID).
//   Explicit variables win; then the process manager that spawned this process. Slurm is last,
//   and not even read when another source is present, because processes that mpiexec starts
//   inside an allocation inherit the batch step's SLURM_* variables, which are wrong for them.
// - No source at all: one process, rank 0 of 1, so that `./program` runs alone.
// - A source is all or nothing: its rank without its world size, or the reverse, is a ConfigError.
//   Slurm is the exception one way: salloc and sbatch export SLURM_NTASKS to a shell that is no
//   task, so only SLURM_PROCID marks a Slurm task.
// - Values are whole base-10 ints: world size >= 1, 0 <= rank < world size,
//   1 <= local world size <= world size, 0 <= local rank < local world size (or < world size when
//   the local size is unknown), 1 <= MASTER_PORT <= 65535, or MASTER_PORT=0: rank 0 listens on a
//   port the kernel picks and publishes it in COLTRAIN_PORT_FILE (comm/rendezvous/port_file.hpp).
// - The per-process sources (torchrun, Open MPI, MPICH) must agree with the chosen one, C. For
//   each other present one, O: equal world sizes need equal ranks; O larger than C means C is
//   stale (RANK/WORLD_SIZE left in the shell); C larger must be a multiple of O, which is a nested
//   launch (mpiexec starting one torchrun per node).
// - Local rank: the chosen source's; else that of another source counting the same processes
//   (equal world size; an outer launch's local rank describes the outer process); else the rank,
//   assuming one node (local_rank_from_launcher is then false, so that device selection knows the
//   local rank is a guess).
// - MASTER_ADDR and MASTER_PORT default to 127.0.0.1 and 29500. Under Slurm without MASTER_ADDR
//   the address is the first host of SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST: rank 0's node.
// - torchrun's static rendezvous (its default) keeps MASTER_PORT for its agent's own store and says
//   so with TORCHELASTIC_USE_AGENT_STORE=True: the rendezvous then uses MASTER_PORT + 1.
// - An empty variable counts as unset: `export RANK=` is a common way to clear one.
// - PMIX_RANK marks a process a PMIx server started (srun --mpi=pmix, Open MPI 5's mpirun): it
//   exports no world size, so the ranks come from the other sources (Slurm's), and it only tells
//   that MPI_Init can reach the others (LaunchEnv::started_by_mpi).

#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/launch_env.hpp>

#include <array>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace coltrain {

// Returns a variable's value, or nothing when it is unset. Tests substitute a map for the process
// environment.
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;

// The process environment (std::getenv).
inline EnvLookup process_env_lookup() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

// A fixed set of variables, for tests and for replaying a job's environment.
inline EnvLookup env_lookup_from(std::map<std::string, std::string> variables) {
  return [variables = std::move(variables)](std::string_view name) -> std::optional<std::string> {
    auto it = variables.find(std::string(name));
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

namespace detail {

inline constexpr const char* kDetectOperation = "detect launch environment";

[[noreturn]] inline void throw_env_error(const std::string& message) {
  ErrorContext context;
  context.operation = kDetectOperation;
  throw ConfigError(message, std::move(context));
}

// The first host of a Slurm host list, or why the list is malformed (then `error` is non-empty).
struct FirstHost {
  std::string host;
  std::string error;
};

inline bool is_host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

inline bool is_digits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Checks a bracket body such as "01-04,07" and returns its first number with its zero padding, or
// nothing when the body is malformed.
inline std::optional<std::string_view> first_of_ranges(std::string_view body) {
  std::optional<std::string_view> first;
  while (true) {
    const std::size_t comma = body.find(',');
    const std::string_view range = body.substr(0, comma);
    const std::size_t dash = range.find('-');
    const std::string_view low = range.substr(0, dash);
    if (!is_digits(low)) return std::nullopt;
    if (dash != std::string_view::npos) {
      const std::string_view high = range.substr(dash + 1);
      if (!is_digits(high)) return std::nullopt;
      unsigned long long lo = 0;
      unsigned long long hi = 0;
      const bool parsed =
          std::from_chars(low.data(), low.data() + low.size(), lo).ec == std::errc{} &&
          std::from_chars(high.data(), high.data() + high.size(), hi).ec == std::errc{};
      if (!parsed || lo > hi) return std::nullopt;
    }
    if (!first) first = low;
    if (comma == std::string_view::npos) return first;
    body.remove_prefix(comma + 1);
  }
}

// Reads Slurm's compressed host lists ("node[01-04,07]", "gpu[3-5],cpu1", "rack[1-2]-n[1-4]"). The
// whole list is checked, but only the first host is built: expanding a large range would be wasted.
inline FirstHost parse_first_slurm_host(std::string_view list) {
  if (list.empty()) return {{}, "empty host list"};
  FirstHost result;
  bool in_first = true;
  bool host_empty = true;
  std::size_t i = 0;
  while (i < list.size()) {
    const char c = list[i];
    if (c == ',') {
      if (host_empty) return {{}, "empty host name"};
      in_first = false;
      host_empty = true;
      ++i;
    } else if (c == '[') {
      const std::size_t close = list.find(']', i);
      if (close == std::string_view::npos) return {{}, "unmatched '['"};
      const auto first = first_of_ranges(list.substr(i + 1, close - i - 1));
      if (!first) return {{}, "bad range in brackets"};
      if (in_first) result.host += *first;
      host_empty = false;
      i = close + 1;
    } else if (c == ']') {
      return {{}, "unmatched ']'"};
    } else if (is_host_char(c)) {
      if (in_first) result.host += c;
      host_empty = false;
      ++i;
    } else {
      return {{}, std::string("unexpected character '") + c + "'"};
    }
  }
  if (host_empty) return {{}, "empty host name"};
  return result;
}

// One launcher's variables. An empty name means the launcher has no such variable.
struct SourceSpec {
  Launcher launcher;
  std::string_view rank;
  std::string_view size;
  std::string_view size_fallback;
  std::string_view local_rank;
  std::string_view local_size;
};

inline constexpr std::array<SourceSpec, 4> kSources{{
    {Launcher::kTorchrun, "RANK", "WORLD_SIZE", "", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {Launcher::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::kMpich, "PMI_RANK", "PMI_SIZE", "", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {Launcher::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", ""},
}};

// A variable as set, and its text, kept for messages.
struct RawVar {
  std::string_view name;
  std::string text;

  std::string show() const { return std::string(name) + "=" + text; }
};

struct IntVar {
  RawVar raw;
  int value = 0;

  std::string show() const { return raw.show(); }
};

inline std::optional<RawVar> read_var(const EnvLookup& lookup, std::string_view name) {
  if (name.empty()) return std::nullopt;
  std::optional<std::string> text = lookup(name);
  if (!text || text->empty()) return std::nullopt;
  return RawVar{name, std::move(*text)};
}

inline IntVar parse_int(RawVar raw) {
  int value = 0;
  const char* begin = raw.text.data();
  const char* end = begin + raw.text.size();
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec == std::errc::result_out_of_range) throw_env_error("value out of range: " + raw.show());
  if (ec != std::errc{} || ptr != end) throw_env_error("not a base-10 integer: " + raw.show());
  return IntVar{std::move(raw), value};
}

inline std::optional<IntVar> read_int(const EnvLookup& lookup, std::string_view name) {
  std::optional<RawVar> raw = read_var(lookup, name);
  if (!raw) return std::nullopt;
  return parse_int(std::move(*raw));
}

// One launcher's view of this process, validated on its own.
struct Source {
  Launcher launcher;
  IntVar rank;
  IntVar size;
  std::optional<IntVar> local_rank;
  std::optional<IntVar> local_size;
};

inline std::optional<Source> read_source(const SourceSpec& spec, const EnvLookup& lookup) {
  std::optional<RawVar> rank = read_var(lookup, spec.rank);
  std::optional<RawVar> size = read_var(lookup, spec.size);
  if (!size) size = read_var(lookup, spec.size_fallback);
  // SLURM_NTASKS alone is an allocation's shell, not a task (see the rules at the top).
  const bool slurm = spec.launcher == Launcher::kSlurm;
  if (!rank && (!size || slurm)) return std::nullopt;
  const std::string who(name_of(spec.launcher));
  if (!rank) {
    throw_env_error("incomplete " + who + " environment: " + size->show() + " is set but " +
                    std::string(spec.rank) + " is not");
  }
  if (!size) {
    std::string missing(spec.size);
    if (!spec.size_fallback.empty()) missing += " (or " + std::string(spec.size_fallback) + ")";
    throw_env_error("incomplete " + who + " environment: " + rank->show() + " is set but " +
                    missing + " is not");
  }

  Source source{spec.launcher, parse_int(std::move(*rank)), parse_int(std::move(*size)), {}, {}};
  if (source.size.value < 1) {
    throw_env_error("world size must be at least 1: " + source.size.show());
  }
  if (source.rank.value < 0 || source.rank.value >= source.size.value) {
    throw_env_error("rank must be in [0, world size): " + source.rank.show() + ", " +
                    source.size.show());
  }

  source.local_rank = read_int(lookup, spec.local_rank);
  if (!source.local_rank) return source;  // a local size alone says nothing about this process
  source.local_size = read_int(lookup, spec.local_size);
  const IntVar& local_rank = *source.local_rank;
  if (source.local_size) {
    const IntVar& local_size = *source.local_size;
    if (local_size.value < 1 || local_size.value > source.size.value) {
      throw_env_error("local world size must be in [1, world size]: " + local_size.show() + ", " +
                      source.size.show());
    }
    if (local_rank.value < 0 || local_rank.value >= local_size.value) {
      throw_env_error("local rank must be in [0, local world size): " + local_rank.show() + ", " +
                      local_size.show());
    }
  } else if (local_rank.value < 0 || local_rank.value >= source.size.value) {
    throw_env_error("local rank must be in [0, world size): " + local_rank.show() + ", " +
                    source.size.show());
  }
  return source;
}

// Throws unless `other` is consistent with the chosen source (see the rules at the top).
inline void check_agreement(const Source& chosen, const Source& other) {
  const std::string c(name_of(chosen.launcher));
  const std::string o(name_of(other.launcher));
  if (other.size.value == chosen.size.value) {
    if (other.rank.value != chosen.rank.value) {
      throw_env_error(c + " and " + o + " disagree on the rank: " + chosen.rank.show() + " but " +
                      other.rank.show() + " (both with world size " +
                      std::to_string(chosen.size.value) + ")");
    }
  } else if (other.size.value > chosen.size.value) {
    throw_env_error(c + " variables claim fewer processes than " + o +
                    " started: " + chosen.size.show() + " but " + other.size.show() + "; " +
                    std::string(chosen.rank.raw.name) + " and " +
                    std::string(chosen.size.raw.name) +
                    " are probably stale values left in the shell, unset them");
  } else if (chosen.size.value % other.size.value != 0) {
    throw_env_error(c + " world size is not a multiple of " + o + "'s: " + chosen.size.show() +
                    ", " + other.size.show() +
                    " (a nested launch starts the same number of processes from each outer one)");
  }
}

// The first host of the step's node list, else the job's, where Slurm places rank 0.
inline std::optional<std::string> slurm_master_addr(const EnvLookup& lookup) {
  std::optional<RawVar> list = read_var(lookup, "SLURM_STEP_NODELIST");
  if (!list) list = read_var(lookup, "SLURM_JOB_NODELIST");
  if (!list) return std::nullopt;
  FirstHost first = parse_first_slurm_host(list->text);
  if (!first.error.empty()) {
    throw_env_error("malformed Slurm host list (" + first.error + "): " + list->show());
  }
  return std::move(first.host);
}

}  // namespace detail

// The first host of a Slurm host list such as "node[01-04,07]" ("node01"), zero padding kept.
// Throws ConfigError when the list is malformed.
inline std::string first_slurm_host(std::string_view nodelist) {
  detail::FirstHost first = detail::parse_first_slurm_host(nodelist);
  if (!first.error.empty()) {
    detail::throw_env_error("malformed Slurm host list (" + first.error + "): \"" +
                            std::string(nodelist) + "\"");
  }
  return std::move(first.host);
}

// Reads the launch environment through `lookup`, applying the rules at the top of this header.
inline LaunchEnv detect_launch_env(const EnvLookup& lookup) {
  std::vector<detail::Source> present;
  for (const detail::SourceSpec& spec : detail::kSources) {
    // Slurm's variables may be inherited by processes another launcher started; see the rules.
    if (spec.launcher == Launcher::kSlurm && !present.empty()) break;
    if (auto source = detail::read_source(spec, lookup)) present.push_back(std::move(*source));
  }

  LaunchEnv env;
  if (!present.empty()) {
    const detail::Source& chosen = present.front();
    for (std::size_t i = 1; i < present.size(); ++i) detail::check_agreement(chosen, present[i]);
    env.launcher = chosen.launcher;
    env.rank = chosen.rank.value;
    env.world_size = chosen.size.value;

    const detail::Source* local = chosen.local_rank ? &chosen : nullptr;
    for (std::size_t i = 1; local == nullptr && i < present.size(); ++i) {
      const detail::Source& other = present[i];
      if (other.local_rank && other.size.value == chosen.size.value) local = &other;
    }
    if (local != nullptr) {
      env.local_rank = local->local_rank->value;
      env.local_rank_from_launcher = true;
      env.local_world_size.reset();
      if (local->local_size) env.local_world_size = local->local_size->value;
    } else {
      env.local_rank = env.rank;
      env.local_world_size = env.world_size;
    }
  }

  env.pmix_server = detail::read_var(lookup, "PMIX_RANK").has_value();
  if (std::optional<detail::RawVar> addr = detail::read_var(lookup, "MASTER_ADDR")) {
    env.master_addr = std::move(addr->text);
  } else if (env.launcher == Launcher::kSlurm) {
    if (std::optional<std::string> host = detail::slurm_master_addr(lookup)) {
      env.master_addr = std::move(*host);
    }
  }
  if (std::optional<detail::IntVar> port = detail::read_int(lookup, "MASTER_PORT")) {
    if (port->value < 0 || port->value > 65535) {
      detail::throw_env_error("master port must be in [1, 65535], or 0 with COLTRAIN_PORT_FILE: " +
                              port->show());
    }
    env.master_port = port->value;
  }
  if (std::optional<detail::RawVar> agent_store =
          detail::read_var(lookup, "TORCHELASTIC_USE_AGENT_STORE");
      agent_store && agent_store->text == "True" && env.master_port != 0) {
    if (env.master_port == 65535) {
      detail::throw_env_error(
          "torchrun's agent holds MASTER_PORT=65535 and the rendezvous needs "
          "the port above it; choose another --master_port");
    }
    ++env.master_port;
  }
  return env;
}

// Reads the launch environment of this process.
inline LaunchEnv detect_launch_env() { return detect_launch_env(process_env_lookup()); }

}  // namespace coltrain
