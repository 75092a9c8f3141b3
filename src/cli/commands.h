// The trainer's sub-commands besides training.
#pragma once

#include <stdexcept>

namespace trainer::cli {

// A bad command line: printed with a pointer to --help, exit 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// trainer doctor [--json] [--config FILE]; argv[0] is "doctor". Returns the exit code.
int doctor_command(int argc, char** argv);

// trainer launch [options] -- <trainer arguments>; argv[0] is "launch". Returns the exit code.
int launch_command(int argc, char** argv);

}  // namespace trainer::cli
