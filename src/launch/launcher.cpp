#include "launch/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "util/cxxopts.h"
#include "util/net.h"

extern char** environ;

namespace trainer::launch {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kTailLines = 20;          // lines of each worker kept for a failure report
constexpr size_t kMaxLineBytes = 1 << 16;  // a longer line without '\n' is passed on in pieces
constexpr int kReadsPerWakeup = 16;        // reads of one pipe before the others get their turn
constexpr int kIdlePollMs = 1000;          // poll's timeout when no deadline is near
constexpr int kGroupPollMs = 10;           // poll's timeout while killed processes disappear
constexpr double kGroupTimeoutS = 5;       // how long a worker's group may outlive SIGKILL
constexpr int kUsageExitCode = 2;          // a worker's usage or configuration error

// The write end of the self-pipe through which the signal handler wakes run(); -1 outside run().
volatile sig_atomic_t g_wake_fd = -1;

void on_signal(int sig) {
  const int saved_errno = errno;
  const int fd = g_wake_fd;
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    (void)!::write(fd, &byte, 1);
  }
  errno = saved_errno;
}

std::system_error os_error(const std::string& what) {
  return std::system_error(errno, std::generic_category(), what);
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk loses log lines, not the run
    done += static_cast<size_t>(n);
  }
}

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// A close-on-exec pipe.
struct Pipe {
  Fd read;   // read end
  Fd write;  // write end
};

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw os_error("pipe2");
  return Pipe{Fd(fds[0]), Fd(fds[1])};
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) throw os_error("fcntl");
}

bool is_stop_signal(int sig) {
  return sig == SIGINT || sig == SIGTERM;
}

// While alive: SIGINT, SIGTERM and SIGCHLD write their number into a self-pipe that the monitor
// loop polls. The previous handlers come back when it goes.
class SignalWatch {
 public:
  SignalWatch() {
    if (g_wake_fd >= 0) throw std::logic_error("trainer::launch::run is already active");
    pipe_ = make_pipe();
    set_nonblocking(pipe_.read.get());
    set_nonblocking(pipe_.write.get());
    g_wake_fd = pipe_.write.get();
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &action, &previous_[i]);
  }
  ~SignalWatch() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
    g_wake_fd = -1;
  }
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  int fd() const { return pipe_.read.get(); }

  // The signals received since the last call, in order of arrival.
  std::vector<int> take() {
    std::vector<int> signals;
    unsigned char buf[64];
    for (;;) {
      const ssize_t n = ::read(pipe_.read.get(), buf, sizeof buf);
      if (n > 0) {
        signals.insert(signals.end(), buf, buf + n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        break;
      }
    }
    return signals;
  }

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGCHLD};
  Pipe pipe_;                                   // the self-pipe
  std::array<struct sigaction, 3> previous_{};  // handlers to restore
};

// While alive, the process is a child subreaper: descendants orphaned by a worker's exit become its
// children, so the launcher can reap everything a worker started. The previous setting comes back
// when it goes.
class SubreaperScope {
 public:
  SubreaperScope() {
    ::prctl(PR_GET_CHILD_SUBREAPER, &previous_);
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }
  ~SubreaperScope() { ::prctl(PR_SET_CHILD_SUBREAPER, previous_); }
  SubreaperScope(const SubreaperScope&) = delete;
  SubreaperScope& operator=(const SubreaperScope&) = delete;

 private:
  int previous_ = 0;  // the setting to restore
};

// One of a worker's output pipes.
struct Stream {
  Fd fd;                 // read end; closed at end of file
  std::string partial;   // text after the last '\n'
  std::ostream* sink{};  // the launcher's stdout or stderr
};

// One worker process of the current attempt.
struct Worker {
  int local_rank = 0;            // index on this node
  int rank = 0;                  // global rank
  pid_t pid = -1;                // process id, also its process group id; -1 before it starts
  bool running = false;          // started and not yet reaped
  bool group_alive = false;      // its process group may still have members
  Clock::time_point exited_at;   // when it was reaped
  int status = 0;                // waitpid status once reaped
  int exec_errno = 0;            // why the program could not be executed; 0 when it could
  Stream out;                    // its stdout
  Stream err;                    // its stderr
  std::deque<std::string> tail;  // its last kTailLines lines, stdout and stderr together
  Fd log_file;                   // <log_dir>/rank_<N>.log, when there is a log dir
  std::string log_pending;       // lines not yet written to log_file
};

bool exited_ok(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "killed by signal " + signal_name(sig) + " (" + std::to_string(sig) + ")";
  }
  return "status " + std::to_string(status);
}

std::string worker_name(const Worker& w) {
  return "rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) +
         ", pid " + std::to_string(w.pid) + ")";
}

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
  Attempt(const LaunchOptions& options, int restart,
          const std::vector<std::pair<std::string, std::string>>& env, std::ostream& out,
          std::ostream& err, std::ostream& log, SignalWatch& signals)
      : options_(options),
        restart_(restart),
        env_(env),
        out_(out),
        err_(err),
        log_(log),
        signals_(signals),
        workers_(options.nproc_per_node) {}

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
    Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!devnull.open()) throw os_error("open /dev/null");
    for (int local = 0; local < options_.nproc_per_node; ++local) {
      Worker& w = workers_[local];
      w.local_rank = local;
      w.rank = options_.node_rank * options_.nproc_per_node + local;
      open_log_file(w);
      spawn(w, devnull.get());
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

  void open_log_file(Worker& w) {
    if (options_.log_dir.empty()) return;
    const auto path =
        std::filesystem::path(options_.log_dir) / ("rank_" + std::to_string(w.rank) + ".log");
    w.log_file = Fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!w.log_file.open()) throw os_error("open " + path.string());
    struct stat st {};
    if (restart_ > 0 || (::fstat(w.log_file.get(), &st) == 0 && st.st_size > 0)) {
      write_all(w.log_file.get(), "----- trainer launch: restart " + std::to_string(restart_) +
                                      " of " + std::to_string(options_.max_restarts) + ", run id " +
                                      options_.run_id + " -----\n");
    }
  }

  std::vector<std::string> worker_env(const Worker& w) const {
    const int world = options_.nnodes * options_.nproc_per_node;
    const std::pair<const char*, std::string> vars[] = {
        {"RANK", std::to_string(w.rank)},
        {"LOCAL_RANK", std::to_string(w.local_rank)},
        {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_WORLD_SIZE", std::to_string(options_.nproc_per_node)},
        {"GROUP_RANK", std::to_string(options_.node_rank)},
        {"GROUP_WORLD_SIZE", std::to_string(options_.nnodes)},
        {"ROLE_NAME", "default"},
        {"ROLE_RANK", std::to_string(w.rank)},
        {"ROLE_WORLD_SIZE", std::to_string(world)},
        {"MASTER_ADDR", options_.master_addr},
        {"MASTER_PORT", std::to_string(options_.master_port)},
        {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_)},
        {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options_.max_restarts)},
        {"TORCHELASTIC_RUN_ID", options_.run_id},
    };
    std::map<std::string, std::string> merged(env_.begin(), env_.end());
    for (const auto& [key, value] : vars) merged[key] = value;
    std::vector<std::string> entries;
    entries.reserve(merged.size());
    for (const auto& [key, value] : merged) entries.push_back(key + "=" + value);
    return entries;
  }

  // Forks and executes one worker. Everything the child needs is prepared before the fork: between
  // fork and exec it calls async-signal-safe functions only.
  void spawn(Worker& w, int devnull) {
    std::vector<std::string> env = worker_env(w);
    std::vector<char*> envp;
    for (auto& entry : env) envp.push_back(entry.data());
    envp.push_back(nullptr);
    std::vector<std::string> arg_text{options_.program};
    arg_text.insert(arg_text.end(), options_.args.begin(), options_.args.end());
    std::vector<char*> argv;
    for (auto& arg : arg_text) argv.push_back(arg.data());
    argv.push_back(nullptr);

    Pipe out = make_pipe();
    Pipe err = make_pipe();
    Pipe exec_status = make_pipe();
    set_nonblocking(out.read.get());
    set_nonblocking(err.read.get());

    // Signals stay blocked across fork so that the child never runs the launcher's handler.
    sigset_t all, previous;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &previous);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      exec_child(parent, devnull, out.write.get(), err.write.get(), exec_status.write.get(),
                 argv.data(), envp.data());
    }
    const int fork_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    if (pid < 0) {
      errno = fork_errno;
      throw os_error("fork");
    }
    ::setpgid(pid, pid);  // also done by the child; whichever comes first wins
    w.pid = pid;
    w.running = true;
    w.group_alive = true;
    w.out = Stream{std::move(out.read), {}, &out_};
    w.err = Stream{std::move(err.read), {}, &err_};
    exec_status.write.reset();

    int child_errno = 0;
    ssize_t n;
    while ((n = ::read(exec_status.read.get(), &child_errno, sizeof child_errno)) < 0 &&
           errno == EINTR) {
    }
    if (n == static_cast<ssize_t>(sizeof child_errno)) {
      w.exec_errno = child_errno;
      int status;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      w.running = false;
      w.group_alive = false;
      w.status = status;
    }
  }

  [[noreturn]] static void exec_child(pid_t parent, int devnull, int out, int err, int exec_status,
                                      char* const* argv, char* const* envp) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the launcher is already gone
    struct sigaction action {};
    action.sa_handler = SIG_DFL;
    sigemptyset(&action.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP, SIGQUIT}) {
      ::sigaction(sig, &action, nullptr);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (::dup2(devnull, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) {
      const int e = errno;
      (void)!::write(exec_status, &e, sizeof e);
      ::_exit(127);
    }
    ::execve(argv[0], argv, envp);
    const int e = errno;
    (void)!::write(exec_status, &e, sizeof e);
    ::_exit(127);
  }

  void monitor() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, Stream*>> streams;  // the owner of fds[i + 1]
    while (std::any_of(workers_.begin(), workers_.end(),
                       [](const Worker& w) { return w.running || w.group_alive; })) {
      fds.assign(1, pollfd{signals_.fd(), POLLIN, 0});
      streams.clear();
      for (auto& w : workers_) {
        for (Stream* s : {&w.out, &w.err}) {
          if (!s->fd.open()) continue;
          fds.push_back(pollfd{s->fd.get(), POLLIN, 0});
          streams.emplace_back(&w, s);
        }
      }
      if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR) {
        throw os_error("poll");
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) read_stream(*streams[i - 1].first, *streams[i - 1].second);
      }
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

  // The worker and whatever it started in its process group. Only while the worker has not been
  // reaped: until then its pid, which is the group's id, cannot belong to another process.
  static void signal_worker(const Worker& w, int sig) {
    if (!w.running) return;
    if (::kill(-w.pid, sig) != 0) ::kill(w.pid, sig);
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

  // The failure line and the worker's last lines.
  void report_failure(Worker& w) {
    drain(w);
    log_ << "trainer launch: " << worker_name(w) << " failed: " << describe_status(w.status)
         << "\n";
    for (const auto& line : w.tail) log_ << "  | " << line << "\n";
    for (const Stream* s : {&w.out, &w.err}) {
      if (!s->partial.empty()) log_ << "  | " << s->partial << "\n";
    }
    const bool others =
        std::any_of(workers_.begin(), workers_.end(), [](const Worker& o) { return o.running; });
    if (others) {
      log_ << "trainer launch: stopping the other workers (SIGTERM, SIGKILL after "
           << seconds_text(options_.grace_s) << ")\n";
    }
  }

  // Reads what a stream has without blocking, up to kReadsPerWakeup pipe buffers, and passes
  // complete lines on.
  void read_stream(Worker& w, Stream& s) {
    char buf[1 << 16];
    bool wrote = false;
    for (int reads = 0; reads < kReadsPerWakeup && s.fd.open(); ++reads) {
      const ssize_t n = ::read(s.fd.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;  // EAGAIN: nothing more for now
      if (n == 0) {
        if (!s.partial.empty()) emit(w, s, std::exchange(s.partial, {}));
        s.fd.reset();
        wrote = true;
        break;
      }
      s.partial.append(buf, n);
      size_t start = 0;
      for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
        emit(w, s, s.partial.substr(start, nl - start));
      }
      s.partial.erase(0, start);
      if (s.partial.size() >= kMaxLineBytes) emit(w, s, std::exchange(s.partial, {}));
      wrote = true;
    }
    if (wrote) {
      s.sink->flush();
      flush_log(w);
    }
  }

  static void flush_log(Worker& w) {
    if (w.log_file.open()) write_all(w.log_file.get(), w.log_pending);
    w.log_pending.clear();
  }

  void drain(Worker& w) {
    read_stream(w, w.out);
    read_stream(w, w.err);
  }

  void emit(Worker& w, const Stream& s, std::string line) {
    *s.sink << "[rank" << w.rank << "]: " << line << '\n';
    if (w.log_file.open()) w.log_pending.append(line).push_back('\n');
    w.tail.push_back(std::move(line));
    if (w.tail.size() > kTailLines) w.tail.pop_front();
  }

  // After the last worker has exited: what is left in the pipes, partial last lines included.
  void finish() {
    for (auto& w : workers_) {
      drain(w);
      for (Stream* s : {&w.out, &w.err}) {
        if (!s->partial.empty()) {
          emit(w, *s, std::exchange(s->partial, {}));
          s->sink->flush();
        }
        s->fd.reset();
      }
      flush_log(w);
      w.log_file.reset();
    }
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
    const bool usage =
        WIFEXITED(first_bad_->status) && WEXITSTATUS(first_bad_->status) == kUsageExitCode;
    result.exit_code = usage ? kUsageExitCode : 1;
    result.restartable = !usage && !result.stop_signal;
    if (usage) result.no_restart = "exit code 2 is a usage or configuration error";
    return result;
  }

  const LaunchOptions& options_;                                 // what to start
  const int restart_;                                            // TORCHELASTIC_RESTART_COUNT
  const std::vector<std::pair<std::string, std::string>>& env_;  // the launcher's environment
  std::ostream& out_;                                            // workers' stdout lines
  std::ostream& err_;                                            // workers' stderr lines
  std::ostream& log_;                                            // the launcher's messages
  SignalWatch& signals_;                                         // SIGINT, SIGTERM, SIGCHLD
  std::vector<Worker> workers_;                                  // one per local rank
  const Worker* first_bad_ = nullptr;  // the first worker reaped with a non-zero status
  bool exec_failed_ = false;           // a worker's program could not be executed
  bool failed_ = false;                // a worker failure started the stop
  bool stopping_ = false;              // the workers were asked to stop
  bool killed_ = false;                // SIGKILL was sent to all
  int stop_sent_ = 0;                  // the signal sent by begin_stop
  int stop_signal_ = 0;                // SIGINT or SIGTERM received by the launcher; 0 if none
  Clock::time_point deadline_{};       // when stopping turns into SIGKILL
};

void check(const LaunchOptions& o) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("launch: " + what); };
  if (o.program.empty()) fail("no program to run");
  if (o.nproc_per_node < 1) fail("nproc_per_node must be at least 1");
  if (o.nnodes < 1) fail("nnodes must be at least 1");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) fail("node_rank must be in [0, nnodes)");
  if (o.master_port < 1 || o.master_port > 65535) fail("master_port must be in 1..65535");
  if (o.max_restarts < 0) fail("max_restarts must not be negative");
  if (!(o.grace_s >= 0) || !std::isfinite(o.grace_s)) fail("grace_s must be a finite number >= 0");
}

std::vector<std::pair<std::string, std::string>> launcher_env() {
  std::vector<std::pair<std::string, std::string>> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env.emplace_back(text.substr(0, eq), text.substr(eq + 1));
  }
  return env;
}

// --- the command line --------------------------------------------------------------------------

cxxopts::Options command_options() {
  cxxopts::Options options("trainer launch",
                           "Starts this node's workers of a distributed run, like torchrun.");
  options.custom_help("[options] -- <trainer arguments>");
  // clang-format off
  options.add_options()
      ("nproc-per-node", "workers on this node: a number, auto (the GPUs, or the CPUs without "
       "CUDA), gpu or cpu (default 1)", cxxopts::value<std::string>(), "N")
      ("nnodes", "nodes in the run (default 1)", cxxopts::value<std::string>(), "N")
      ("node-rank", "this node's index, 0..nnodes-1 (default 0)", cxxopts::value<std::string>(),
       "R")
      ("master-addr", "host of rank 0 (default 127.0.0.1)", cxxopts::value<std::string>(), "HOST")
      ("master-port", "rendezvous port on that host (default 29500)",
       cxxopts::value<std::string>(), "PORT")
      ("max-restarts", "times the workers are started again after a failure (default 0)",
       cxxopts::value<std::string>(), "K")
      ("standalone", "one node on 127.0.0.1 with a free port")
      ("log-dir", "also write each rank's output to DIR/rank_<N>.log",
       cxxopts::value<std::string>(), "DIR")
      ("grace-period", "seconds from SIGTERM to SIGKILL when stopping workers (default 10)",
       cxxopts::value<std::string>(), "S")
      ("h,help", "print this help");
  // clang-format on
  return options;
}

// "--nproc_per_node=2" -> "--nproc-per-node=2": underscores in a long option's name only.
std::string normalise(const std::string& arg) {
  if (arg.size() <= 2 || arg.compare(0, 2, "--") != 0) return arg;
  std::string out = arg;
  const size_t end = std::min(out.find('='), out.size());
  std::replace(out.begin() + 2, out.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  return out;
}

int parse_int(const std::string& flag, const std::string& text, long min, long max) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < min || value > max) {
    throw ArgumentError("--" + flag + ": expected an integer in " + std::to_string(min) + ".." +
                        std::to_string(max) + ", got '" + text + "'");
  }
  return static_cast<int>(value);
}

int cpu_count() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

int parse_nproc(const std::string& text, const std::function<int()>& gpu_count) {
  if (text == "cpu") return cpu_count();
  if (text == "gpu" || text == "auto") {
    const int gpus = gpu_count ? gpu_count() : 0;
    if (gpus > 0) return gpus;
    if (text == "gpu") throw ArgumentError("--nproc-per-node gpu: no CUDA device is available");
    return cpu_count();
  }
  return parse_int("nproc-per-node", text, 1, 1 << 16);
}

std::string random_run_id() {
  std::random_device random;
  char text[33];
  std::snprintf(text, sizeof text, "%08x%08x%08x%08x", random(), random(), random(), random());
  return text;
}

}  // namespace

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev == nullptr) return "signal " + std::to_string(sig);
  return std::string("SIG") + abbrev;
}

std::string launch_help() {
  return command_options().help() +
         "\nEach worker runs the trainer with the arguments after --, in the launcher's "
         "environment "
         "plus\nRANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, "
         "ROLE_RANK,\nROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, "
         "TORCHELASTIC_MAX_RESTARTS\nand TORCHELASTIC_RUN_ID (and OMP_NUM_THREADS=1 when it is "
         "unset and there are several\nworkers). Their output is prefixed with [rank<N>]:. When "
         "a worker fails the others get SIGTERM,\nthen SIGKILL after the grace period; the group "
         "is restarted while restarts remain, except\nafter exit code 2. SIGINT/SIGTERM are "
         "passed to the workers; a second one kills them.\n"
         "\nExit codes: 0 all workers exited 0, 1 a worker failed, 2 usage or configuration "
         "error.\n";
}

namespace {

// The launcher's own options (before "--", underscores normalised), parsed.
cxxopts::ParseResult parse_own(std::vector<std::string> own) {
  own.insert(own.begin(), "launch");
  auto options = command_options();
  std::vector<char*> argv;
  for (auto& arg : own) argv.push_back(arg.data());
  argv.push_back(nullptr);
  cxxopts::ParseResult parsed;
  try {
    parsed = options.parse(static_cast<int>(own.size()), argv.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw ArgumentError(e.what());
  }
  if (!parsed.unmatched().empty()) {
    throw ArgumentError("unexpected argument '" + parsed.unmatched().front() + "'");
  }
  return parsed;
}

// --standalone: one node on 127.0.0.1, a free port and a random run id.
void make_standalone(const cxxopts::ParseResult& parsed, LaunchOptions& o) {
  if (o.nnodes != 1) throw ArgumentError("--standalone runs one node; drop --nnodes");
  if (parsed.count("master-addr") || parsed.count("master-port")) {
    throw ArgumentError("--standalone picks its own address and port; drop --master-addr/-port");
  }
  o.master_addr = "127.0.0.1";
  o.master_port = free_port();
  o.run_id = random_run_id();
}

// The options' values, checked one by one.
void read_options(const cxxopts::ParseResult& parsed, const std::function<int()>& gpu_count,
                  LaunchOptions& o) {
  auto text = [&](const char* flag) -> std::optional<std::string> {
    if (!parsed.count(flag)) return std::nullopt;
    return parsed[flag].as<std::string>();
  };
  if (auto v = text("nproc-per-node")) o.nproc_per_node = parse_nproc(*v, gpu_count);
  if (auto v = text("nnodes")) o.nnodes = parse_int("nnodes", *v, 1, 1 << 20);
  if (auto v = text("node-rank")) o.node_rank = parse_int("node-rank", *v, 0, 1 << 20);
  if (auto v = text("master-addr")) {
    if (v->empty()) throw ArgumentError("--master-addr: empty host name");
    o.master_addr = *v;
  }
  if (auto v = text("master-port")) o.master_port = parse_int("master-port", *v, 1, 65535);
  if (auto v = text("max-restarts")) o.max_restarts = parse_int("max-restarts", *v, 0, 1 << 20);
  if (auto v = text("log-dir")) o.log_dir = *v;
  if (auto v = text("grace-period")) {
    char* end = nullptr;
    o.grace_s = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0' || !std::isfinite(o.grace_s) || o.grace_s < 0) {
      throw ArgumentError("--grace-period: expected seconds >= 0, got '" + *v + "'");
    }
  }
}

}  // namespace

LaunchCommand parse_launch_args(const std::vector<std::string>& args,
                                const std::function<int()>& gpu_count) {
  const auto separator = std::find(args.begin(), args.end(), "--");
  std::vector<std::string> own;
  for (auto it = args.begin(); it != separator; ++it) own.push_back(normalise(*it));
  const cxxopts::ParseResult parsed = parse_own(own);
  LaunchCommand command;
  if (parsed.count("help")) {
    command.help = true;
    return command;
  }
  LaunchOptions& o = command.options;
  read_options(parsed, gpu_count, o);
  if (parsed.count("standalone")) make_standalone(parsed, o);
  if (o.node_rank >= o.nnodes) {
    throw ArgumentError("--node-rank " + std::to_string(o.node_rank) +
                        " is out of range for --nnodes " + std::to_string(o.nnodes) + " (0.." +
                        std::to_string(o.nnodes - 1) + ")");
  }
  if (separator == args.end() || separator + 1 == args.end()) {
    throw ArgumentError("no trainer arguments: trainer launch [options] -- <trainer arguments>");
  }
  o.args.assign(separator + 1, args.end());
  return command;
}

int run(const LaunchOptions& options, std::ostream& out, std::ostream& err, std::ostream& log) {
  check(options);
  auto env = launcher_env();
  if (options.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    env.emplace_back("OMP_NUM_THREADS", "1");
    log << "trainer launch: OMP_NUM_THREADS is unset; setting it to 1 for each worker so that "
           "they do not overload the CPUs (set it to tune)\n";
  }
  if (!options.log_dir.empty()) std::filesystem::create_directories(options.log_dir);
  const int world = options.nnodes * options.nproc_per_node;
  const int first_rank = options.node_rank * options.nproc_per_node;
  log << "trainer launch: node " << options.node_rank << " of " << options.nnodes << ", ranks "
      << first_rank << ".." << first_rank + options.nproc_per_node - 1 << " of " << world
      << ", master " << options.master_addr << ":" << options.master_port << ", run id "
      << options.run_id << "\n";
  log.flush();

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
