// Command-line parsing shared by the commands (cxxopts as util/cxxopts.h configures it).
#pragma once

#include <string>

#include "cli/commands.h"
#include "util/cxxopts.h"

namespace trainer::cli {

// Parses a command line; a malformed option or an unexpected argument is a UsageError.
inline cxxopts::ParseResult parse_or_usage(cxxopts::Options& options, int argc, char** argv) {
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(e.what());
  }
  if (!args.unmatched().empty()) {
    throw UsageError("unexpected argument '" + args.unmatched().front() + "'");
  }
  return args;
}

}  // namespace trainer::cli
