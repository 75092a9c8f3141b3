// The run's metrics.jsonl and the console progress display.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "util/tensorboard.h"

namespace trainer::engine {

// The run's metrics: <run.dir>/metrics.jsonl, one JSON object per line, and, when enabled, the
// same scalars as a TensorBoard event file in <run.dir>/tb/. Both are flushed per record, so a
// crash loses nothing already written.
class MetricsWriter {
 public:
  // Creates (truncates) metrics.jsonl in `run_dir`, and the event file when `tensorboard`. With
  // resume_step >= 0, keeps the existing lines up to that step and appends after them; the
  // evaluation lines of that step only when `evaluated_at_resume` (else the resumed run
  // evaluates again and writes them).
  MetricsWriter(const std::string& run_dir, bool tensorboard, int64_t resume_step = -1,
                bool evaluated_at_resume = false);
  ~MetricsWriter();

  // `record` has "split" ("train" or "val"), "step", "epoch" and numeric fields. TensorBoard
  // tags are "<split>/<field>", except the learning rate, tagged "lr".
  void write(const nlohmann::json& record);

 private:
  std::ofstream out_;
  std::unique_ptr<tensorboard::EventWriter> events_;
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
