// The supervisor: one attempt's workers started, watched, stopped and reaped; attempts repeated
// while restarts remain.
#include "launch/supervisor.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "launch/posix.h"
#include "launch/relay.h"

namespace trainer::launch {
namespace {

constexpr int kIdlePollMs = 1000;     // poll's timeout when no deadline is near
constexpr int kGroupPollMs = 10;      // poll's timeout while killed processes disappear
constexpr double kGroupTimeoutS = 5;  // how long a worker's group may outlive SIGKILL
constexpr int kUsageExitCode = 2;     // a worker's usage or configuration error

std::string seconds_text(double s) {
  std::ostringstream text;
  text << s << " s";
  return text.str();
}

// The result of one attempt.
struct Outcome {
  int exit_code = 0;         // the launcher's exit code if this attempt is the last
  bool restartable = false;  // a failure that a restart may cure
  bool stop_signal = false;  // SIGINT or SIGTERM arrived: no restart
  std::string no_restart;    // why a failure is not restartable
};

// Starts the workers of one attempt and supervises them until all have exited.
class Attempt {
 public:
  Attempt(const LaunchOptions& options, int restart, const Environment& env, std::ostream& out,
          std::ostream& err, std::ostream& log, SignalWatch& signals)
      : options_(options),
        restart_(restart),
        env_(env),
        log_(log),
        signals_(signals),
        workers_(options.nproc_per_node),
        relay_(options, restart, out, err) {}

  // Kills and reaps whatever is still running (only after an exception).
  ~Attempt() {
    for (auto& w : workers_) {
      if (!w.running) continue;
      signal_worker(w, SIGKILL);
      int status;
      while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
      }
      ::kill(-w.pid, SIGKILL);
    }
  }
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  Outcome run() {
    start();
    monitor();
    finish();
    return outcome();
  }

 private:
  void start() {
    Spawner spawner(options_, restart_, env_);
    for (int local = 0; local < options_.nproc_per_node; ++local) {
      Worker& w = workers_[local];
      w.local_rank = local;
      w.rank = global_rank(options_, local);
      relay_.open(local);
      OutputPipes pipes = spawner.spawn(w);
      relay_.attach(local, std::move(pipes.out), std::move(pipes.err));
      if (w.exec_errno != 0) {
        log_ << "trainer launch: rank " << w.rank << " (local rank " << w.local_rank
             << ") failed to start: cannot execute '" << options_.program
             << "': " << std::strerror(w.exec_errno) << "\n";
        exec_failed_ = true;
        failed_ = true;
        begin_stop(SIGTERM);
        break;
      }
    }
    log_.flush();
  }

  void monitor() {
    std::vector<pollfd> fds;
    while (std::any_of(workers_.begin(), workers_.end(),
                       [](const Worker& w) { return w.running || w.group_alive; })) {
      fds.assign(1, pollfd{signals_.fd(), POLLIN, 0});
      relay_.add_poll_fds(fds);
      if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR) {
        throw os_error("poll");
      }
      relay_.read_ready(fds);
      for (int sig : signals_.take()) {
        if (is_stop_signal(sig)) on_stop_signal(sig);
      }
      reap();
      if (stopping_ && !killed_ && Clock::now() >= deadline_) {
        for (const auto& w : workers_) {
          if (w.running) {
            log_ << "trainer launch: " << worker_name(w) << " still running "
                 << seconds_text(options_.grace_s) << " after " << signal_name(stop_sent_)
                 << "; sending SIGKILL\n";
          }
        }
        kill_all(SIGKILL);
      }
      log_.flush();
    }
  }

  int poll_timeout_ms() const {
    const bool leaders =
        std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
    if (!leaders) return kGroupPollMs;
    if (!stopping_ || killed_) return kIdlePollMs;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left + 1, 0, kIdlePollMs));
  }

  void on_stop_signal(int sig) {
    if (stop_signal_ != 0 || (stopping_ && !failed_)) {
      log_ << "trainer launch: got " << signal_name(sig) << " again; killing the workers\n";
      kill_all(SIGKILL);
      stop_signal_ = sig;
      return;
    }
    stop_signal_ = sig;
    if (stopping_) {
      log_ << "trainer launch: got " << signal_name(sig)
           << "; the workers are already stopping, no restart\n";
      return;
    }
    log_ << "trainer launch: got " << signal_name(sig) << "; passing it to the workers (SIGKILL "
         << "after " << seconds_text(options_.grace_s) << " or on a second signal)\n";
    begin_stop(sig);
  }

  // Sends sig to every worker's process group and starts the grace period.
  void begin_stop(int sig) {
    stopping_ = true;
    stop_sent_ = sig;
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(options_.grace_s));
    for (const auto& w : workers_) signal_worker(w, sig);
  }

  void kill_all(int sig) {
    killed_ = true;
    for (const auto& w : workers_) signal_worker(w, sig);
  }

  void reap() {
    for (auto& w : workers_) {
      if (!w.running && w.group_alive) reap_group(w);
      if (!w.running) continue;
      int status;
      const pid_t pid = ::waitpid(w.pid, &status, WNOHANG);
      if (pid != w.pid) continue;
      w.running = false;
      w.status = status;
      w.exited_at = Clock::now();
      reap_group(w);
      if (exited_ok(status)) continue;
      const bool first = first_bad_ == nullptr;
      if (first) first_bad_ = &w;
      if (stop_signal_ != 0 && !failed_) {
        log_ << "trainer launch: " << worker_name(w) << " failed: " << describe_status(status)
             << "\n";
      } else if (first && !stopping_) {
        report_failure(w);
        failed_ = true;
        begin_stop(SIGTERM);
      }
    }
  }

  // Kills what a reaped worker left in its process group and reaps it (its members become the
  // subreaper's children as their parents die). The group id stays reserved while it has members.
  void reap_group(Worker& w) {
    for (;;) {
      siginfo_t info{};
      if (::waitid(P_PGID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG) != 0) break;
      if (info.si_pid == 0) break;
    }
    if (::kill(-w.pid, SIGKILL) != 0 && errno == ESRCH) {
      w.group_alive = false;
    } else if (Clock::now() - w.exited_at > std::chrono::duration<double>(kGroupTimeoutS)) {
      log_ << "trainer launch: processes in the group of " << worker_name(w) << " outlive SIGKILL "
           << "for " << seconds_text(kGroupTimeoutS) << "; leaving them\n";
      w.group_alive = false;
    }
  }

  // The failure line and the worker's last lines; not those of a usage or configuration error
  // (exit code 2) of a rank shown on the console, whose one line the relay has just shown.
  void report_failure(const Worker& w) {
    const std::vector<std::string> last = relay_.last_lines(w.local_rank);
    log_ << "trainer launch: " << worker_name(w) << " failed: " << describe_status(w.status)
         << "\n";
    const bool usage = WIFEXITED(w.status) && WEXITSTATUS(w.status) == kUsageExitCode;
    if (!usage || !relay_.shown(w.local_rank)) {
      for (const auto& line : last) log_ << "  | " << line << "\n";
    }
    const bool others =
        std::any_of(workers_.begin(), workers_.end(), [](const Worker& o) { return o.running; });
    if (others) {
      log_ << "trainer launch: stopping the other workers (SIGTERM, SIGKILL after "
           << seconds_text(options_.grace_s) << ")\n";
    }
  }

  // After the last worker has exited: what is left in the pipes, partial last lines included.
  void finish() {
    relay_.finish();
    log_.flush();
  }

  Outcome outcome() const {
    Outcome result;
    result.stop_signal = stop_signal_ != 0;
    if (exec_failed_) {
      result.exit_code = 1;
      result.no_restart = "the program cannot be executed";
      return result;
    }
    if (first_bad_ == nullptr) return result;
    // A usage or configuration error of any worker, even one reaped after a peer that failed on
    // its exit (a process group that could not be formed): exit 2, no restart.
    const bool usage = std::any_of(workers_.begin(), workers_.end(), [](const Worker& o) {
      return !o.running && WIFEXITED(o.status) && WEXITSTATUS(o.status) == kUsageExitCode;
    });
    result.exit_code = usage ? kUsageExitCode : 1;
    result.restartable = !usage && !result.stop_signal;
    if (usage) result.no_restart = "exit code 2 is a usage or configuration error";
    return result;
  }

  const LaunchOptions& options_;       // what to start
  const int restart_;                  // TORCHELASTIC_RESTART_COUNT
  const Environment& env_;             // the launcher's environment
  std::ostream& log_;                  // the launcher's messages
  SignalWatch& signals_;               // SIGINT, SIGTERM, SIGCHLD
  std::vector<Worker> workers_;        // one per local rank
  OutputRelay relay_;                  // the workers' stdout and stderr lines
  const Worker* first_bad_ = nullptr;  // the first worker reaped with a non-zero status
  bool exec_failed_ = false;           // a worker's program could not be executed
  bool failed_ = false;                // a worker failure started the stop
  bool stopping_ = false;              // the workers were asked to stop
  bool killed_ = false;                // SIGKILL was sent to all
  int stop_sent_ = 0;                  // the signal sent by begin_stop
  int stop_signal_ = 0;                // SIGINT or SIGTERM received by the launcher; 0 if none
  Clock::time_point deadline_{};       // when stopping turns into SIGKILL
};

}  // namespace

int supervise(const LaunchOptions& options, const Environment& env, std::ostream& out,
              std::ostream& err, std::ostream& log) {
  SubreaperScope subreaper;
  SignalWatch signals;
  for (int restart = 0;; ++restart) {
    const Outcome result = Attempt(options, restart, env, out, err, log, signals).run();
    if (result.exit_code == 0 || result.stop_signal) return result.exit_code;
    if (!result.restartable) {
      if (options.max_restarts > restart) {
        log << "trainer launch: not restarting: " << result.no_restart << "\n";
      }
      return result.exit_code;
    }
    if (restart >= options.max_restarts) {
      if (options.max_restarts > 0) {
        log << "trainer launch: no restarts left (--max-restarts " << options.max_restarts << ")\n";
      }
      return result.exit_code;
    }
    for (int sig : signals.take()) {
      if (is_stop_signal(sig)) {
        log << "trainer launch: got " << signal_name(sig) << "; not restarting\n";
        return result.exit_code;
      }
    }
    log << "trainer launch: restarting the workers (restart " << restart + 1 << " of "
        << options.max_restarts << ")\n";
    log.flush();
  }
}

}  // namespace trainer::launch
