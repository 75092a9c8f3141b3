// The output relay: the workers' pipes read line by line, each line shown, logged and kept.
#include "launch/relay.h"

#include <algorithm>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <ostream>
#include <utility>

#include "launch/worker.h"

namespace trainer::launch {
namespace {

constexpr size_t kTailLines = 20;          // lines of each worker kept for a failure report
constexpr size_t kMaxLineBytes = 1 << 16;  // a longer line without '\n' is passed on in pieces
constexpr size_t kSharedLines = 64;        // stderr lines compared for repeats across ranks
constexpr int kReadsPerWakeup = 16;        // reads of one pipe before the others get their turn

}  // namespace

OutputRelay::OutputRelay(const LaunchOptions& options, int restart, std::ostream& out,
                         std::ostream& err)
    : options_(options),
      restart_(restart),
      out_(out),
      err_(err),
      channels_(options.nproc_per_node) {
  for (int local = 0; local < options.nproc_per_node; ++local) {
    Channel& c = channels_[local];
    c.rank = global_rank(options, local);
    c.display = display_of(options, local, c.rank);
  }
}

// The lines of the ranks --local-ranks-filter names (every rank's without it), each after its
// rank, "[rank<N>]: ", unless --no-prefix.
OutputRelay::Display OutputRelay::display_of(const LaunchOptions& options, int local_rank,
                                             int rank) {
  Display display;
  const auto& filter = options.local_ranks_filter;
  display.shown =
      filter.empty() || std::find(filter.begin(), filter.end(), local_rank) != filter.end();
  if (options.prefix) display.prefix = "[rank" + std::to_string(rank) + "]: ";
  return display;
}

void OutputRelay::open(int local_rank) {
  if (options_.log_dir.empty()) return;
  Channel& c = channels_[local_rank];
  const auto path =
      std::filesystem::path(options_.log_dir) / ("rank_" + std::to_string(c.rank) + ".log");
  c.log_file = Fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!c.log_file.open()) throw os_error("open " + path.string());
  // Its stdout alone, as the command printed it (a --json object), this attempt's.
  auto stdout_path = path;
  stdout_path.replace_extension(".stdout");
  c.stdout_file = Fd(::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!c.stdout_file.open()) throw os_error("open " + stdout_path.string());
  struct stat st {};
  if (restart_ > 0 || (::fstat(c.log_file.get(), &st) == 0 && st.st_size > 0)) {
    write_all(c.log_file.get(), "----- trainer launch: restart " + std::to_string(restart_) +
                                    " of " + std::to_string(options_.max_restarts) + ", run id " +
                                    options_.run_id + " -----\n");
  }
}

void OutputRelay::attach(int local_rank, Fd out, Fd err) {
  Channel& c = channels_[local_rank];
  c.out = Stream{std::move(out), {}, &out_};
  c.err = Stream{std::move(err), {}, &err_};
}

void OutputRelay::add_poll_fds(std::vector<pollfd>& fds) {
  first_polled_ = fds.size();
  polled_.clear();
  for (auto& c : channels_) {
    for (Stream* s : {&c.out, &c.err}) {
      if (!s->fd.open()) continue;
      fds.push_back(pollfd{s->fd.get(), POLLIN, 0});
      polled_.emplace_back(&c, s);
    }
  }
}

void OutputRelay::read_ready(const std::vector<pollfd>& fds) {
  for (size_t i = 0; i < polled_.size(); ++i) {
    if (fds[first_polled_ + i].revents != 0) read_stream(*polled_[i].first, *polled_[i].second);
  }
}

std::vector<std::string> OutputRelay::last_lines(int local_rank) {
  Channel& c = channels_[local_rank];
  drain(c);
  std::vector<std::string> lines(c.tail.begin(), c.tail.end());
  for (const Stream* s : {&c.out, &c.err}) {
    if (!s->partial.empty()) lines.push_back(s->partial);
  }
  return lines;
}

// Reads what a stream has without blocking, up to kReadsPerWakeup pipe buffers, and passes
// complete lines on.
void OutputRelay::read_stream(Channel& c, Stream& s) {
  char buf[1 << 16];
  bool wrote = false;
  for (int reads = 0; reads < kReadsPerWakeup && s.fd.open(); ++reads) {
    const ssize_t n = ::read(s.fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // EAGAIN: nothing more for now
    if (n == 0) {
      if (!s.partial.empty()) emit(c, s, std::exchange(s.partial, {}));
      s.fd.reset();
      wrote = true;
      break;
    }
    s.partial.append(buf, n);
    size_t start = 0;
    for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      emit(c, s, s.partial.substr(start, nl - start));
    }
    s.partial.erase(0, start);
    if (s.partial.size() >= kMaxLineBytes) emit(c, s, std::exchange(s.partial, {}));
    wrote = true;
  }
  if (wrote) {
    s.sink->flush();
    flush_log(c);
  }
}

void OutputRelay::flush_log(Channel& c) {
  if (c.log_file.open()) write_all(c.log_file.get(), c.log_pending);
  if (c.stdout_file.open()) write_all(c.stdout_file.get(), c.stdout_pending);
  c.log_pending.clear();
  c.stdout_pending.clear();
}

void OutputRelay::drain(Channel& c) {
  read_stream(c, c.out);
  read_stream(c, c.err);
}

// A stderr line that another rank showed among the last kSharedLines stderr lines (the same
// error from every rank, e.g. a configuration error found while building the data) is shown once;
// the log files and tails keep every rank's copy.
bool OutputRelay::shown_by_another_rank(const Channel& c, const Stream& s,
                                        const std::string& line) {
  if (&s != &c.err) return false;
  const bool repeated = std::any_of(
      shown_errors_.begin(), shown_errors_.end(),
      [&](const std::pair<int, std::string>& e) { return e.first != c.rank && e.second == line; });
  if (repeated) return true;
  shown_errors_.emplace_back(c.rank, line);
  if (shown_errors_.size() > kSharedLines) shown_errors_.pop_front();
  return false;
}

void OutputRelay::emit(Channel& c, const Stream& s, std::string line) {
  if (c.display.shown && !shown_by_another_rank(c, s, line)) {
    *s.sink << c.display.prefix << line << '\n';
  }
  if (c.log_file.open()) c.log_pending.append(line).push_back('\n');
  if (c.stdout_file.open() && &s == &c.out) c.stdout_pending.append(line).push_back('\n');
  c.tail.push_back(std::move(line));
  if (c.tail.size() > kTailLines) c.tail.pop_front();
}

void OutputRelay::finish() {
  for (auto& c : channels_) {
    drain(c);
    for (Stream* s : {&c.out, &c.err}) {
      if (!s->partial.empty()) {
        emit(c, *s, std::exchange(s->partial, {}));
        s->sink->flush();
      }
      s->fd.reset();
    }
    flush_log(c);
    c.log_file.reset();
    c.stdout_file.reset();
  }
}

}  // namespace trainer::launch
