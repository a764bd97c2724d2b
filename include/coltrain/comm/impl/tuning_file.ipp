// The tuning file's parser and writer. Header-only builds include this file at the end of
// comm/tuning/tuning_file.hpp; with COLTRAIN_SEPARATE_COMPILATION only <coltrain/src.hpp> includes it.
#pragma once

#include <coltrain/comm/tuning/cost_model.hpp>
#include <coltrain/comm/tuning/tuning_file.hpp>
#include <coltrain/comm/types.hpp>
#include <coltrain/core/atomic_file.hpp>
#include <coltrain/core/config.hpp>
#include <coltrain/core/error.hpp>
#include <coltrain/core/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace coltrain::comm {

namespace detail {

// The error for a tuning file: where it came from and which field is wrong.
inline ConfigError tuning_file_error(const std::string& source, const std::string& where,
                                     const std::string& what) {
  return ConfigError("tuning file " + source + (where.empty() ? "" : ", " + where) + ": " + what +
                     " (benchmarks/coltrain_tune writes these files; docs/collectives.md)");
}

inline const Json& tuning_member(const Json& object, std::string_view key, const std::string& where,
                                 const std::string& source) {
  const Json* found = object.find(key);
  if (found == nullptr)
    throw tuning_file_error(source, where, "'" + std::string(key) + "' is missing");
  return *found;
}

inline double tuning_cost(const Json& link, std::string_view key, const std::string& where,
                          const std::string& source) {
  const Json& value = tuning_member(link, key, where, source);
  const std::string at = where + "/" + std::string(key);
  if (!value.is_number()) throw tuning_file_error(source, at, "expected a number");
  const double number = value.get<double>();
  if (!std::isfinite(number) || number < 0)
    throw tuning_file_error(source, at, "expected a finite cost of 0 or more, not " + value.dump());
  return number;
}

inline LinkCosts parse_link_costs(const Json& link, const std::string& where,
                                  const std::string& source) {
  if (!link.is_object()) throw tuning_file_error(source, where, "expected an object");
  return {tuning_cost(link, "alpha_us", where, source),
          tuning_cost(link, "beta_us_per_byte", where, source),
          tuning_cost(link, "gamma_us_per_byte", where, source)};
}

inline Json link_costs_json(const LinkCosts& c) {
  return Json::object({{"alpha_us", c.alpha_us},
                       {"beta_us_per_byte", c.beta_us_per_byte},
                       {"gamma_us_per_byte", c.gamma_us_per_byte}});
}

inline int tuning_count(const Json& object, std::string_view key, const std::string& where,
                        const std::string& source) {
  const Json& value = tuning_member(object, key, where, source);
  const std::string at = where + "/" + std::string(key);
  if (!value.is_number_integer() || value.get<long long>() < 1 ||
      value.get<long long>() > (1 << 24))
    throw tuning_file_error(source, at,
                            "expected a whole number from 1 to 2^24, not " + value.dump());
  return static_cast<int>(value.get<long long>());
}

inline std::size_t tuning_bytes(const Json& value, const std::string& where,
                                const std::string& source) {
  if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<long long>() >= 0))
    throw tuning_file_error(source, where, "expected a byte count, not " + value.dump());
  return value.get<std::size_t>();
}

// `text`'s enum value, or an error that lists the names it may take.
template <class Parse>
auto parse_tuning_name(const Json& value, Parse parse, const std::string& where,
                       const std::string& source) {
  if (!value.is_string()) throw tuning_file_error(source, where, "expected a name");
  try {
    return parse(value.as_string());
  } catch (const Error& e) {
    throw tuning_file_error(source, where, e.what());
  }
}

inline CollectiveRules parse_collective_rules(const Json& entry, const std::string& where,
                                              const std::string& source) {
  if (!entry.is_object()) throw tuning_file_error(source, where, "expected an object");
  CollectiveRules r;
  r.backend = parse_tuning_name(tuning_member(entry, "backend", where, source), parse_backend,
                                where + "/backend", source);
  if (r.backend == Backend::kNccl)
    throw tuning_file_error(source, where + "/backend",
                            "rules are for host buffers on mpi or tcp; NCCL's choice comes from "
                            "its cost model");
  r.collective = parse_tuning_name(tuning_member(entry, "collective", where, source),
                                   parse_collective, where + "/collective", source);
  r.ranks = tuning_count(entry, "ranks", where, source);
  r.hosts = tuning_count(entry, "hosts", where, source);
  if (r.hosts > r.ranks)
    throw tuning_file_error(
        source, where + "/hosts",
        std::to_string(r.hosts) + " hosts for " + std::to_string(r.ranks) + " ranks");
  const Json& sizes = tuning_member(entry, "sizes", where, source);
  if (!sizes.is_array() || sizes.empty())
    throw tuning_file_error(source, where + "/sizes", "expected a non-empty array");
  const auto allowed = algorithms_for(r.collective);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::string at = where + "/sizes/" + std::to_string(i);
    const Json& size = sizes[i];
    if (!size.is_object()) throw tuning_file_error(source, at, "expected an object");
    SizeRule rule;
    rule.from_bytes =
        tuning_bytes(tuning_member(size, "from_bytes", at, source), at + "/from_bytes", source);
    rule.algorithm = parse_tuning_name(tuning_member(size, "algorithm", at, source),
                                       parse_algorithm, at + "/algorithm", source);
    const bool offered = std::find(allowed.begin(), allowed.end(), rule.algorithm) != allowed.end();
    if (!offered || rule.algorithm == Algorithm::kAutomatic ||
        (rule.algorithm == Algorithm::kNative && r.backend != Backend::kMpi))
      throw tuning_file_error(source, at + "/algorithm",
                              "'" + std::string(name_of(rule.algorithm)) + "' cannot run " +
                                  std::string(name_of(r.collective)) + " on " +
                                  std::string(name_of(r.backend)));
    if (i == 0 && rule.from_bytes != 0)
      throw tuning_file_error(source, at + "/from_bytes", "the first rule starts at 0 bytes");
    if (i > 0 && rule.from_bytes <= r.sizes.back().from_bytes)
      throw tuning_file_error(source, at + "/from_bytes", "sizes must ascend");
    r.sizes.push_back(rule);
  }
  return r;
}

// "never", or {"from_bytes": F} with "below_bytes": B where the range ends.
inline CallSizeRange parse_call_size_range(const Json& value, const std::string& where,
                                           const std::string& source) {
  if (value.is_string() && value.as_string() == "never") return kNoCallSizes;
  if (!value.is_object())
    throw tuning_file_error(source, where,
                            "expected \"never\" or {\"from_bytes\": ..., \"below_bytes\": ...}");
  CallSizeRange range;
  range.from = tuning_bytes(tuning_member(value, "from_bytes", where, source),
                            where + "/from_bytes", source);
  if (const Json* below = value.find("below_bytes"))
    range.below = tuning_bytes(*below, where + "/below_bytes", source);
  if (range.empty())
    throw tuning_file_error(source, where + "/below_bytes",
                            "the range ends at or before it starts (\"never\" says no size)");
  return range;
}

inline Json call_size_range_json(const CallSizeRange& range) {
  if (range.empty()) return Json("never");
  Json out = Json::object({{"from_bytes", range.from}});
  if (range.below != CallSizeRange::kUnbounded) out["below_bytes"] = range.below;
  return out;
}

// The two ranges of "shared_memory", by their keys.
inline constexpr std::array<std::pair<const char*, std::optional<CallSizeRange> TuningFile::*>, 2>
    kSingleCopyRanges = {{{"single_copy_exchanges", &TuningFile::single_copy_exchanges},
                          {"single_copy_exchanges_on_small_pages",
                           &TuningFile::single_copy_exchanges_on_small_pages}}};

}  // namespace detail

COLTRAIN_DECL TuningFile parse_tuning_file(std::string_view text, const std::string& source) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const JsonError& e) {
    throw detail::tuning_file_error(source, "", e.what());
  }
  if (!root.is_object()) throw detail::tuning_file_error(source, "", "expected a JSON object");
  const Json* format = root.find("format");
  if (format == nullptr || !format->is_string() || format->as_string() != "coltrain-tuning")
    throw detail::tuning_file_error(source, "/format", "expected \"coltrain-tuning\"");
  const Json& version = detail::tuning_member(root, "version", "", source);
  if (!version.is_number_integer() || version.get<long long>() != TuningFile::kVersion)
    throw detail::tuning_file_error(source, "/version",
                                    "this coltrain reads version " +
                                        std::to_string(TuningFile::kVersion) + ", not " +
                                        version.dump());
  TuningFile file;
  if (const Json* measured = root.find("measured")) file.measured = measured->dump();
  if (const Json* models = root.find("cost_models")) {
    if (!models->is_object())
      throw detail::tuning_file_error(source, "/cost_models", "expected an object");
    for (const auto& [name, entry] : models->items()) {
      const std::string where = "/cost_models/" + name;
      const Backend backend = detail::parse_tuning_name(Json(name), parse_backend, where, source);
      if (!entry.is_object()) throw detail::tuning_file_error(source, where, "expected an object");
      CostModel model = default_cost_model(backend);
      model.point_to_point =
          detail::parse_link_costs(detail::tuning_member(entry, "point_to_point", where, source),
                                   where + "/point_to_point", source);
      if (const Json* native = entry.find("native"))
        model.native = detail::parse_link_costs(*native, where + "/native", source);
      if (const Json* same_host = entry.find("same_host"))
        model.same_host = detail::parse_link_costs(*same_host, where + "/same_host", source);
      file.cost_models[backend] = model;
    }
  }
  if (const Json* shared = root.find("shared_memory")) {
    if (!shared->is_object())
      throw detail::tuning_file_error(source, "/shared_memory", "expected an object");
    for (const auto& [key, field] : detail::kSingleCopyRanges) {
      if (const Json* range = shared->find(key))
        file.*field =
            detail::parse_call_size_range(*range, "/shared_memory/" + std::string(key), source);
    }
  }
  if (const Json* rules = root.find("rules")) {
    if (!rules->is_array()) throw detail::tuning_file_error(source, "/rules", "expected an array");
    for (std::size_t i = 0; i < rules->size(); ++i) {
      const std::string where = "/rules/" + std::to_string(i);
      CollectiveRules r = detail::parse_collective_rules((*rules)[i], where, source);
      for (const CollectiveRules& earlier : file.rules) {
        if (earlier.backend == r.backend && earlier.collective == r.collective &&
            earlier.ranks == r.ranks && earlier.hosts == r.hosts)
          throw detail::tuning_file_error(
              source, where,
              "a second rule for " + std::string(name_of(r.collective)) + " on " +
                  std::string(name_of(r.backend)) + ", " + std::to_string(r.ranks) + " ranks on " +
                  std::to_string(r.hosts) + " hosts");
      }
      file.rules.push_back(std::move(r));
    }
  }
  return file;
}

COLTRAIN_DECL std::string tuning_file_text(const TuningFile& file) {
  Json root = Json::object({{"format", "coltrain-tuning"}, {"version", TuningFile::kVersion}});
  if (!file.measured.empty()) {
    try {
      root["measured"] = Json::parse(file.measured);
    } catch (const JsonError& e) {
      throw ConfigError(std::string("tuning file text: TuningFile::measured is not JSON: ") +
                        e.what());
    }
  }
  Json models = Json::object();
  for (const auto& [backend, model] : file.cost_models) {
    Json entry = Json::object({{"point_to_point", detail::link_costs_json(model.point_to_point)}});
    if (backend != Backend::kTcp) entry["native"] = detail::link_costs_json(model.native);
    entry["same_host"] = detail::link_costs_json(model.same_host);
    models[name_of(backend)] = entry;
  }
  root["cost_models"] = models;
  Json shared = Json::object();
  for (const auto& [key, field] : detail::kSingleCopyRanges) {
    if (const auto& range = file.*field) shared[key] = detail::call_size_range_json(*range);
  }
  if (!shared.empty()) root["shared_memory"] = shared;
  Json rules = Json::array();
  for (const CollectiveRules& r : file.rules) {
    Json sizes = Json::array();
    for (const SizeRule& size : r.sizes)
      sizes.push_back(
          Json::object({{"from_bytes", size.from_bytes}, {"algorithm", name_of(size.algorithm)}}));
    rules.push_back(Json::object({{"backend", name_of(r.backend)},
                                  {"collective", name_of(r.collective)},
                                  {"ranks", r.ranks},
                                  {"hosts", r.hosts},
                                  {"sizes", sizes}}));
  }
  root["rules"] = rules;
  return root.dump(2) + "\n";
}

COLTRAIN_DECL TuningFile load_tuning_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("tuning file " + path + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) throw ConfigError("tuning file " + path + ": read failed");
  return parse_tuning_file(text.str(), path);
}

COLTRAIN_DECL void save_tuning_file(const std::string& path, const TuningFile& file) {
  write_file_atomically(path, tuning_file_text(file), "write tuning file");
}

}  // namespace coltrain::comm
