// cxxopts, configured once for every command: a repeated option's value is taken whole, commas
// included (--set data.shape=[3,32,32]).
#pragma once

#define CXXOPTS_VECTOR_DELIMITER '\0'
#include <cxxopts.hpp>
#include <string>

#include "cli/commands.h"

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
