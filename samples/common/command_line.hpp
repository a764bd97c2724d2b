#pragma once
// The sample trainers' command-line parser: long options with a value (`--name value` or
// `--name=value`), flags, an option whose value may be left out, choices and bounds checked as
// they are parsed, and --help.
//
// Why not CLI11, which the benchmarks use: it is the largest part of a sample's translation unit
// that is not training (about 13 s of the nvcc line: parsed by cudafe++, cicc and the host
// compiler, then 220 KB of host code), and the GPU training issue bounds that line at 90 s. The
// samples need a small part of it.

#include <coltrain/core/error.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace sample {

// A command line the parser refuses; what() names the option and the value.
class CommandLineError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

// Parses `text` as a whole number or a decimal of type T, or throws naming `option`.
template <class T>
T parse_number(std::string_view option, std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  // from_chars takes no leading '+'; an unsigned type must not wrap a '-' into a large number.
  const char* begin = text.data() + (!text.empty() && text.front() == '+' ? 1 : 0);
  const auto [stop, error] = std::from_chars(begin, end, value);
  if (text.empty() || error != std::errc{} || stop != end) {
    const char* kind = std::is_integral_v<T>
                           ? (std::is_signed_v<T> ? "an integer" : "a non-negative integer")
                           : "a number";
    throw CommandLineError(std::string(option) + ": '" + std::string(text) + "' is not " + kind +
                           (error == std::errc::result_out_of_range ? " in range" : ""));
  }
  return value;
}

inline void parse_into(std::string_view, std::string_view text, std::string& value) {
  value = text;
}
template <class T>
requires std::is_arithmetic_v<T>
void parse_into(std::string_view option, std::string_view text, T& value) {
  value = parse_number<T>(option, text);
}
template <class T>
void parse_into(std::string_view option, std::string_view text, std::optional<T>& value) {
  parse_into(option, text, value.emplace());
}

inline std::string to_text(const std::string& value) { return value; }
template <class T>
requires std::is_arithmetic_v<T> std::string to_text(T value) {
  if constexpr (std::is_floating_point_v<T>) {
    char buffer[32];
    const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
    return std::string(buffer, result.ptr);
  } else {
    return std::to_string(value);
  }
}
template <class T>
std::string to_text(const std::optional<T>& value) {
  return value ? to_text(*value) : std::string();
}

template <class T>
struct ValueName {
  static constexpr const char* value = std::is_integral_v<T> ? "INT" : "NUMBER";
};
template <>
struct ValueName<std::string> {
  static constexpr const char* value = "TEXT";
};
template <class T>
struct ValueName<std::optional<T>> : ValueName<T> {};

}  // namespace detail

class CommandLine {
 public:
  // One option; the setters return it so that they chain: `.choices({...}).show_default()`.
  class Option {
   public:
    // The value must be one of these (compared as written, after parsing: "020" is 20).
    Option& choices(std::initializer_list<std::string_view> allowed) {
      choices_.assign(allowed.begin(), allowed.end());
      return *this;
    }
    template <class Int>
    requires std::is_integral_v<Int> Option& choices(std::initializer_list<Int> allowed) {
      choices_.clear();
      for (const Int value : allowed) choices_.push_back(std::to_string(value));
      return *this;
    }
    Option& positive() {
      bound_ = Bound::kPositive;
      return *this;
    }
    Option& non_negative() {
      bound_ = Bound::kNonNegative;
      return *this;
    }
    // Shows the value the option holds now (the sample's default) in --help.
    Option& show_default() {
      default_text_ = current_text_();
      return *this;
    }

   private:
    friend class CommandLine;
    enum class Bound { kNone, kPositive, kNonNegative };
    enum class Arity { kFlag, kValue, kOptionalValue };

    // Checks the parsed value's text against the choices and the bound, then stores it.
    void apply(std::string_view text) {
      assign_(text);
      const std::string normalized = current_text_();
      if (!choices_.empty() &&
          std::find(choices_.begin(), choices_.end(), normalized) == choices_.end()) {
        std::string list;
        for (const std::string& choice : choices_) list += (list.empty() ? "" : ", ") + choice;
        throw CommandLineError(name_ + ": '" + std::string(text) + "' is not one of " + list);
      }
      if (bound_ == Bound::kNone) return;
      const double number = detail::parse_number<double>(name_, normalized);
      if (bound_ == Bound::kPositive ? !(number > 0) : !(number >= 0)) {
        throw CommandLineError(name_ + ": " + std::string(text) + " is not " +
                               (bound_ == Bound::kPositive ? "positive" : "non-negative"));
      }
    }

    std::string name_, help_, value_name_, default_text_;
    Arity arity_ = Arity::kValue;
    Bound bound_ = Bound::kNone;
    std::vector<std::string> choices_;
    std::function<void(std::string_view)> assign_;  // kValue, kOptionalValue: text -> variable
    std::function<std::string()> current_text_;     // the variable as text
  };

  CommandLine(std::string description, std::string program)
      : description_(std::move(description)), program_(std::move(program)) {}

  const std::string& program() const { return program_; }

  // --name VALUE into `value` (a string, a number, or an optional of one).
  template <class T>
  Option& option(std::string name, T& value, std::string help) {
    Option& o = add(std::move(name), std::move(help), Option::Arity::kValue);
    o.value_name_ = detail::ValueName<T>::value;
    o.assign_ = [&value, &o](std::string_view text) { detail::parse_into(o.name_, text, value); };
    o.current_text_ = [&value] { return detail::to_text(value); };
    return o;
  }

  // --name [VALUE]: calls `on(value)`, with "" when the value is left out.
  Option& optional_value(std::string name, std::string value_name,
                         std::function<void(const std::string&)> on, std::string help) {
    Option& o = add(std::move(name), std::move(help), Option::Arity::kOptionalValue);
    o.value_name_ = std::move(value_name);
    o.assign_ = [on = std::move(on)](std::string_view text) { on(std::string(text)); };
    o.current_text_ = [] { return std::string(); };  // no choices, bound or default to show
    return o;
  }

  // --name sets `value` to true.
  Option& flag(std::string name, bool& value, std::string help) {
    return flag(
        std::move(name), [&value] { value = true; }, std::move(help));
  }
  // --name calls `on`.
  Option& flag(std::string name, std::function<void()> on, std::string help) {
    Option& o = add(std::move(name), std::move(help), Option::Arity::kFlag);
    o.assign_ = [on = std::move(on)](std::string_view) { on(); };
    o.current_text_ = [] { return std::string(); };
    return o;
  }

  // Parses argv[1..argc): nullopt to go on, or the exit status to end with (0 after --help, 1
  // after an error, which goes to `err` with a pointer to --help).
  std::optional<int> parse(int argc, const char* const* argv, std::ostream& out,
                           std::ostream& err) {
    try {
      for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "-h" || arg == "--help") {
          print_help(out);
          return 0;
        }
        if (!arg.starts_with("--"))
          throw CommandLineError("'" + std::string(arg) + "': not an option (they start with --)");
        const std::size_t equals = arg.find('=');
        const std::string_view name = arg.substr(0, equals);
        Option& o = find(name);
        std::optional<std::string_view> value;
        if (equals != std::string_view::npos) value = arg.substr(equals + 1);
        switch (o.arity_) {
          case Option::Arity::kFlag:
            if (value) throw CommandLineError(o.name_ + " takes no value");
            o.assign_({});
            break;
          case Option::Arity::kValue:
            if (!value) {
              if (i + 1 >= argc) throw CommandLineError(o.name_ + " needs a value");
              value = argv[++i];
            }
            o.apply(*value);
            break;
          case Option::Arity::kOptionalValue:
            // The next argument is the value unless it is an option itself.
            if (!value && i + 1 < argc && !std::string_view(argv[i + 1]).starts_with("--"))
              value = argv[++i];
            o.apply(value.value_or(std::string_view()));
            break;
        }
      }
    } catch (const CommandLineError& e) {
      err << program_ << ": " << e.what() << " (" << program_ << " --help lists the options)\n";
      return 1;
    }
    return std::nullopt;
  }

  void print_help(std::ostream& out) const {
    out << description_ << "\nUsage: " << program_ << " [OPTIONS]\n\nOptions:\n"
        << "  -h, --help\n      print this help and exit\n";
    for (const auto& o : options_) {
      out << "  " << o->name_;
      if (o->arity_ != Option::Arity::kFlag) {
        std::string value = o->value_name_;
        if (!o->choices_.empty()) {
          value.clear();
          for (const std::string& choice : o->choices_)
            value += (value.empty() ? "" : "|") + choice;
        }
        out << (o->arity_ == Option::Arity::kOptionalValue ? " [" + value + "]" : " " + value);
      }
      if (!o->default_text_.empty()) out << "  (default: " << o->default_text_ << ")";
      out << "\n      " << o->help_ << "\n";
    }
  }

 private:
  Option& add(std::string name, std::string help, Option::Arity arity) {
    if (!name.starts_with("--") || name.find('=') != std::string::npos || name == "--help")
      throw coltrain::InvalidArgument("CommandLine: option name " + name);
    for (const auto& o : options_) {
      if (o->name_ == name)
        throw coltrain::InvalidArgument("CommandLine: option " + name + " added twice");
    }
    auto& o = *options_.emplace_back(std::make_unique<Option>());
    o.name_ = std::move(name);
    o.help_ = std::move(help);
    o.arity_ = arity;
    return o;
  }

  Option& find(std::string_view name) {
    for (const auto& o : options_) {
      if (o->name_ == name) return *o;
    }
    throw CommandLineError("unknown option " + std::string(name));
  }

  std::string description_, program_;
  // Pointers: the assign functions hold their option's address.
  std::vector<std::unique_ptr<Option>> options_;
};

}  // namespace sample
