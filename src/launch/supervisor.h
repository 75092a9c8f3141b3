// The supervisor: runs attempts of one node's worker group (start, monitor, stop sequence, reaping)
// and restarts the group after a failure while restarts remain. Internal to launch/: nothing
// outside src/launch/ includes it.
#pragma once

#include <iosfwd>

#include "launch/launcher.h"
#include "launch/worker.h"

namespace trainer::launch {

// run()'s work once the options are checked: starts the workers with env plus their torchrun
// variables, passes their output to out and err, writes the launcher's messages to log, and
// returns the launcher's exit code (launcher.h, run()). Makes the process a child subreaper and
// watches SIGINT, SIGTERM and SIGCHLD until it returns.
int supervise(const LaunchOptions& options, const Environment& env, std::ostream& out,
              std::ostream& err, std::ostream& log);

}  // namespace trainer::launch
