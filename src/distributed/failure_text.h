// The line a rank's failure in a group ends with: said once, in the library's words without its
// source paths. Torch-free.
#pragma once

#include <cinttypes>
#include <cstdio>
#include <string>

#include "util/error_text.h"

namespace trainer::distributed {

// "rank R: step S failed: WHAT", WHAT being `error` without the library's source paths and
// without a repeated "rank R: " (a GroupError's own); the likely cause (another rank, and
// dist.timeout_s) is added unless WHAT says it already.
inline std::string step_failure_line(int rank, int64_t step, const std::string& error,
                                     double timeout_s) {
  std::string what = without_source_paths(error);
  const std::string own = "rank " + std::to_string(rank) + ": ";
  if (what.rfind(own, 0) == 0) what.erase(0, own.size());
  std::string line =
      "rank " + std::to_string(rank) + ": step " + std::to_string(step) + " failed: " + what;
  if (what.find("ended or is stuck") != std::string::npos) return line;
  char timeout[64];
  std::snprintf(timeout, sizeof timeout, "%g", timeout_s);
  // Gloo reports a lost peer or a timeout as a plain error.
  return line +
         " (when another rank has ended or is stuck, collectives fail after dist.timeout_s, " +
         timeout + " s)";
}

}  // namespace trainer::distributed
