// Command-line parsing shared by the commands (cxxopts as util/cxxopts.h configures it).
#pragma once

#include <string>

#include "cli/commands.h"
#include "util/cxxopts.h"

namespace trainer::cli {

// cxxopts' "Argument 'V' failed to parse" with the option V was given to: "--seed: '-1' is not
// a valid value" (the message as it is when V is not found after an option).
inline std::string bad_value_message(const std::string& what, int argc, char** argv) {
  const std::string open = "\u2018", close = "\u2019";  // cxxopts' quotes
  const size_t a = what.find(open), b = what.rfind(close);
  if (a == std::string::npos || b == std::string::npos || b < a) return what;
  const std::string value = what.substr(a + open.size(), b - a - open.size());
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    std::string flag;
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos && arg.substr(eq + 1) == value) {
      flag = arg.substr(0, eq);
    } else if (arg == value && i > 1 && argv[i - 1][0] == '-') {
      flag = argv[i - 1];
    }
    if (!flag.empty()) return flag + ": '" + value + "' is not a valid value";
  }
  return what;
}

// Parses a command line; a malformed option or an unexpected argument is a UsageError.
inline cxxopts::ParseResult parse_or_usage(cxxopts::Options& options, int argc, char** argv) {
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    throw UsageError(bad_value_message(e.what(), argc, argv));
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(e.what());
  }
  if (!args.unmatched().empty()) {
    throw UsageError("unexpected argument '" + args.unmatched().front() + "'");
  }
  return args;
}

}  // namespace trainer::cli
