// The run's metrics.jsonl and the console progress display.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

namespace trainer::engine {

// Appends one JSON object per line to a file, flushed per line so a crash loses nothing written.
class MetricsWriter {
 public:
  // Creates (truncates) `path`; an empty path writes nothing.
  explicit MetricsWriter(const std::string& path);
  void write(const nlohmann::json& record);

 private:
  std::ofstream out_;
};

// A one-line progress bar on stderr, redrawn in place; inactive when stderr is not a terminal
// (unless forced), in which case the caller logs plain periodic lines instead.
class Progress {
 public:
  // mode: auto|always|never.
  explicit Progress(const std::string& mode);
  bool active() const { return active_; }
  // Redraws the bar; throttled to a few redraws per second.
  void update(int64_t step, int64_t total_steps, int64_t epoch, double loss, double samples_per_sec,
              double eta_seconds);
  // Clears the bar so other output starts on a clean line.
  void clear();

 private:
  bool active_ = false;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

// "1:02:03" or "2:03".
std::string format_duration(double seconds);

}  // namespace trainer::engine
