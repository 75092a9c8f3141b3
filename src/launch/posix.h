// The operating-system pieces the launcher is built from: owned file descriptors, close-on-exec
// pipes, the signal watch that wakes the monitor loop, and the child-subreaper scope. Internal to
// launch/: nothing outside src/launch/ includes it.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <array>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace trainer::launch {

// A system_error with errno's code.
std::system_error os_error(const std::string& what);

// Writes all of text to fd; gives up silently when the write fails.
void write_all(int fd, const std::string& text);

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

Pipe make_pipe();

void set_nonblocking(int fd);

bool is_stop_signal(int sig);

// While alive: SIGINT, SIGTERM and SIGCHLD write their number into a self-pipe that the monitor
// loop polls. The previous handlers come back when it goes.
class SignalWatch {
 public:
  SignalWatch();
  ~SignalWatch();
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  int fd() const { return pipe_.read.get(); }

  // The signals received since the last call, in order of arrival.
  std::vector<int> take();

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
  SubreaperScope();
  ~SubreaperScope();
  SubreaperScope(const SubreaperScope&) = delete;
  SubreaperScope& operator=(const SubreaperScope&) = delete;

 private:
  int previous_ = 0;  // the setting to restore
};

}  // namespace trainer::launch
