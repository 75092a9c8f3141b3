// Logging: a console sink on stderr and, once the run dir exists, a file sink.
//
// spdlog stays behind this header: LibTorch ships its own fmt headers, which clash with the fmt
// that Debian's spdlog is built against, so code that includes torch logs through these
// functions and formats with strprintf() (util/format.h).
#pragma once

#include <string>

namespace trainer::log {

enum class Level { trace, debug, info, warn, error };

// Parses trace|debug|info|warn|error; returns false for anything else.
bool parse_level(const std::string& text, Level* level);

// Installs the process's logger (console on stderr) at `level`. Lines carry `rank` in their
// prefix, so the lines of several processes can be told apart.
void setup(Level level, int rank);

// Also writes every log line to `path` (appending), with the same rank prefix, after the lines
// logged since setup() (up to 2000).
void add_file(const std::string& path, int rank);

void write(Level level, const std::string& line);
inline void debug(const std::string& line) {
  write(Level::debug, line);
}
inline void info(const std::string& line) {
  write(Level::info, line);
}
inline void warn(const std::string& line) {
  write(Level::warn, line);
}
inline void error(const std::string& line) {
  write(Level::error, line);
}

// Writes one line to the file sink only (the console shows a progress bar instead).
void file_only(Level level, const std::string& line);

}  // namespace trainer::log
