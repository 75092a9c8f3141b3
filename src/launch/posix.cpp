// The operating-system pieces of the launcher: errors, pipes, the signal handler and its self-pipe,
// and the child-subreaper setting.
#include "launch/posix.h"

#include <fcntl.h>
#include <sys/prctl.h>

#include <cerrno>
#include <stdexcept>

namespace trainer::launch {
namespace {

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

}  // namespace

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

SignalWatch::SignalWatch() {
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

SignalWatch::~SignalWatch() {
  for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
  g_wake_fd = -1;
}

std::vector<int> SignalWatch::take() {
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

SubreaperScope::SubreaperScope() {
  ::prctl(PR_GET_CHILD_SUBREAPER, &previous_);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

SubreaperScope::~SubreaperScope() {
  ::prctl(PR_SET_CHILD_SUBREAPER, previous_);
}

}  // namespace trainer::launch
