// The run directory a training run owns: created, locked for the run's lifetime, and checked
// before anything of the run is written into it.
#pragma once

#include <stdexcept>
#include <string>

#include "config/loader.h"

namespace trainer::engine {

// Another process holds the run dir's lock; the message names its pid and host.
class RunDirInUse : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Rank 0's hold on <run.dir>: an exclusive flock(2) on <run.dir>/.lock (holding "pid host") for as
// long as the object lives; the kernel releases it when the process ends, however it ends.
class RunDir {
 public:
  // Creates run.dir and locks it (throws RunDirInUse when another process holds it), and checks
  // that checkpoints can be written there (config::ConfigError naming run.dir). A fresh run
  // (`resuming` false) into a dir holding another run's checkpoints or metrics is refused
  // (config::ConfigError naming the choices), or with run.overwrite that run is moved to
  // <run.dir>.replaced-<UTC time>/ first. Writes nothing but the lock file.
  RunDir(const config::LoadedConfig& loaded, bool resuming);
  ~RunDir();
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;

 private:
  void lock();
  void start_fresh();

  const config::LoadedConfig& loaded_;
  std::string dir_;
  int fd_ = -1;
};

}  // namespace trainer::engine
