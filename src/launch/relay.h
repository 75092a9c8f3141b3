// The output relay: reads the workers' stdout and stderr pipes, passes complete lines on to the
// launcher's stdout and stderr as the relay decides to show them (the ranks --local-ranks-filter
// names, every rank without it; prefixed with "[rank<N>]: " unless --no-prefix), writes each
// rank's lines to <log_dir>/rank_<N>.log (its stdout alone also to rank_<N>.stdout) and keeps
// each rank's last
// lines for a failure report. The only place that decides how a rank's output is shown. Internal
// to launch/: nothing outside src/launch/ includes it.
#pragma once

#include <poll.h>

#include <deque>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "launch/launcher.h"
#include "launch/posix.h"

namespace trainer::launch {

// The output of one attempt's workers, one channel per local rank of options.
class OutputRelay {
 public:
  // restart is the attempt's number (0 for the first), for the log files' restart header. Worker
  // stdout lines go to out, stderr lines to err. Opens nothing yet.
  OutputRelay(const LaunchOptions& options, int restart, std::ostream& out, std::ostream& err);
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  // Before the rank's worker starts: opens its log file when there is a log dir, appending, with a
  // header line after the first attempt or when the file is not empty. Throws std::system_error.
  void open(int local_rank);

  // The rank's worker has started: these are its output pipes.
  void attach(int local_rank, Fd out, Fd err);

  // Appends a pollfd (POLLIN) for each pipe still open; after poll(), read_ready(fds) reads the
  // pipes whose entries have events. Only one add_poll_fds may precede each read_ready.
  void add_poll_fds(std::vector<pollfd>& fds);
  void read_ready(const std::vector<pollfd>& fds);

  // The rank's last lines, stdout and stderr together, after reading what its pipes hold now; the
  // partial lines after them.
  std::vector<std::string> last_lines(int local_rank);

  // Whether the rank's lines go to the console (--local-ranks-filter).
  bool shown(int local_rank) const { return channels_[local_rank].display.shown; }

  // After the last worker has exited: passes on what is left in the pipes, partial last lines
  // included, and closes the pipes and log files.
  void finish();

 private:
  // One of a worker's output pipes.
  struct Stream {
    Fd fd;                 // read end; closed at end of file
    std::string partial;   // text after the last '\n'
    std::ostream* sink{};  // the launcher's stdout or stderr
  };

  // How a rank's lines reach the launcher's stdout and stderr.
  struct Display {
    bool shown = true;   // its lines go to the console (the log file and tail keep them all)
    std::string prefix;  // put before each line
  };

  // The output of one local rank.
  struct Channel {
    int rank = 0;                  // global rank
    Display display;               // how its lines are shown
    Stream out;                    // its stdout
    Stream err;                    // its stderr
    std::deque<std::string> tail;  // its last kTailLines lines, stdout and stderr together
    Fd log_file;                   // <log_dir>/rank_<N>.log, when there is a log dir
    std::string log_pending;       // lines not yet written to log_file
    Fd stdout_file;                // <log_dir>/rank_<N>.stdout: its stdout alone
    std::string stdout_pending;    // stdout lines not yet written to stdout_file
  };

  static Display display_of(const LaunchOptions& options, int local_rank, int rank);
  void read_stream(Channel& c, Stream& s);
  static void flush_log(Channel& c);
  void drain(Channel& c);
  void emit(Channel& c, const Stream& s, std::string line);
  bool shown_by_another_rank(const Channel& c, const Stream& s, const std::string& line);

  const LaunchOptions& options_;   // the log dir and what the restart header names
  const int restart_;              // TORCHELASTIC_RESTART_COUNT
  std::ostream& out_;              // workers' stdout lines
  std::ostream& err_;              // workers' stderr lines
  std::vector<Channel> channels_;  // one per local rank
  std::deque<std::pair<int, std::string>> shown_errors_;  // (rank, line): recent stderr shown
  size_t first_polled_ = 0;                               // the index of polled_[0] in the pollfds
  std::vector<std::pair<Channel*, Stream*>> polled_;      // the owners of the appended pollfds
};

}  // namespace trainer::launch
