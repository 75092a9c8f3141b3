// One worker process: its state while supervised, its environment, how it is forked and executed
// and how it is signalled, and how its exit status reads. Internal to launch/: nothing outside
// src/launch/ includes it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "launch/launcher.h"
#include "launch/posix.h"

namespace trainer::launch {

using Clock = std::chrono::steady_clock;

// Environment variables as (name, value) pairs.
using Environment = std::vector<std::pair<std::string, std::string>>;

// One worker process of the current attempt.
struct Worker {
  int local_rank = 0;           // index on this node
  int rank = 0;                 // global rank
  pid_t pid = -1;               // process id, also its process group id; -1 before it starts
  bool running = false;         // started and not yet reaped
  bool group_alive = false;     // its process group may still have members
  Clock::time_point exited_at;  // when it was reaped
  int status = 0;               // waitpid status once reaped
  int exec_errno = 0;           // why the program could not be executed; 0 when it could
};

// The read ends of a started worker's stdout and stderr pipes (non-blocking).
struct OutputPipes {
  Fd out;  // its stdout
  Fd err;  // its stderr
};

// The global rank of the worker with this local rank on this node.
int global_rank(const LaunchOptions& options, int local_rank);

// The launcher's own environment.
Environment launcher_env();

// Starts the workers of one attempt with the program, arguments and environment they share.
class Spawner {
 public:
  // restart is TORCHELASTIC_RESTART_COUNT; env the launcher's environment. Opens /dev/null, the
  // workers' stdin.
  Spawner(const LaunchOptions& options, int restart, const Environment& env);

  // Forks and executes one worker, whose local_rank and rank are set. Afterwards w.pid is the
  // child's; when its program could not be executed, w.exec_errno says why and it is reaped.
  // Throws std::system_error when a pipe or the fork fails.
  OutputPipes spawn(Worker& w);

 private:
  std::vector<std::string> worker_env(const Worker& w) const;

  const LaunchOptions& options_;  // what to start
  const int restart_;             // TORCHELASTIC_RESTART_COUNT
  const Environment& env_;        // the launcher's environment
  Fd devnull_;                    // the workers' stdin
};

// The worker and whatever it started in its process group. Only while the worker has not been
// reaped: until then its pid, which is the group's id, cannot belong to another process.
void signal_worker(const Worker& w, int sig);

// "rank 3 (local rank 1, pid 1234)".
std::string worker_name(const Worker& w);

bool exited_ok(int status);

// "exit code 1", "killed by signal SIGKILL (9)".
std::string describe_status(int status);

}  // namespace trainer::launch
