// Worker processes: the torchrun environment each one gets, the fork and exec that start it, the
// signals that reach its process group, and the words for its exit status.
#include "launch/worker.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <map>

extern char** environ;

namespace trainer::launch {
namespace {

[[noreturn]] void exec_child(pid_t parent, int devnull, int out, int err, int exec_status,
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

// Waits until the child has executed its program (the close-on-exec pipe reaches end of file) or
// reported why it could not; in that case it is reaped.
void await_exec(Pipe& exec_status, Worker& w) {
  exec_status.write.reset();
  int child_errno = 0;
  ssize_t n;
  while ((n = ::read(exec_status.read.get(), &child_errno, sizeof child_errno)) < 0 &&
         errno == EINTR) {
  }
  if (n == static_cast<ssize_t>(sizeof child_errno)) {
    w.exec_errno = child_errno;
    int status;
    while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
    w.running = false;
    w.group_alive = false;
    w.status = status;
  }
}

}  // namespace

int global_rank(const LaunchOptions& options, int local_rank) {
  return options.node_rank * options.nproc_per_node + local_rank;
}

Environment launcher_env() {
  Environment env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env.emplace_back(text.substr(0, eq), text.substr(eq + 1));
  }
  return env;
}

Spawner::Spawner(const LaunchOptions& options, int restart, const Environment& env)
    : options_(options),
      restart_(restart),
      env_(env),
      devnull_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {
  if (!devnull_.open()) throw os_error("open /dev/null");
}

std::vector<std::string> Spawner::worker_env(const Worker& w) const {
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
      {"TRAINER_LAUNCHER", "trainer launch"},  // how the worker's log names what started it
  };
  std::map<std::string, std::string> merged(env_.begin(), env_.end());
  for (const auto& [key, value] : vars) merged[key] = value;
  std::vector<std::string> entries;
  entries.reserve(merged.size());
  for (const auto& [key, value] : merged) entries.push_back(key + "=" + value);
  return entries;
}

// Everything the child needs is prepared before the fork: between fork and exec it calls
// async-signal-safe functions only.
OutputPipes Spawner::spawn(Worker& w) {
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
    exec_child(parent, devnull_.get(), out.write.get(), err.write.get(), exec_status.write.get(),
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
  OutputPipes pipes{std::move(out.read), std::move(err.read)};
  await_exec(exec_status, w);
  return pipes;
}

void signal_worker(const Worker& w, int sig) {
  if (!w.running) return;
  if (::kill(-w.pid, sig) != 0) ::kill(w.pid, sig);
}

std::string worker_name(const Worker& w) {
  return "rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) +
         ", pid " + std::to_string(w.pid) + ")";
}

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

}  // namespace trainer::launch
