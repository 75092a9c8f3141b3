// The run's metrics: the train and eval records (metrics.jsonl, TensorBoard), the log lines and
// the console progress display.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "engine/setup/components.h"
#include "engine/setup/results.h"
#include "engine/setup/state.h"
#include "tracking/mlflow.h"
#include "util/csv_log.h"
#include "util/gpu_monitor.h"
#include "util/tensorboard.h"

namespace trainer::engine {

// The run's metrics: <run.dir>/metrics.jsonl, one JSON object per line, and, when enabled, the
// same scalars as a TensorBoard event file in <run.dir>/tb/ and as rows of <run.dir>/metrics.csv.
// All are flushed per record, so a crash loses nothing already written.
class MetricsWriter {
 public:
  // Creates (truncates) metrics.jsonl in `run_dir`, the event file when `tensorboard` and
  // metrics.csv when `csv`. With resume_step >= 0, keeps the existing lines up to that step and
  // appends after them (metrics.csv is rewritten from those); the evaluation lines of that step
  // only when `evaluated_at_resume` (else the resumed run evaluates again and writes them).
  MetricsWriter(const std::string& run_dir, bool tensorboard, int64_t resume_step = -1,
                bool evaluated_at_resume = false, bool csv = false);
  ~MetricsWriter();

  // `record` has "split" ("train", "val" or "val_ema"), "step", "epoch" and numeric fields.
  // TensorBoard tags (and MLflow's metric names) are "<split>/<field>", except the learning
  // rate, tagged "lr".
  void write(const nlohmann::json& record);

  // Also sends every record to `mlflow` (tracking.mlflow).
  void track(std::unique_ptr<tracking::MlflowTracker> mlflow) { mlflow_ = std::move(mlflow); }
  // Ends the MLflow run with `status` (FINISHED or KILLED), tagged with the run's last
  // checkpoint; waits a few seconds at most for the server.
  void finish(const std::string& status, const std::string& last_checkpoint);

 private:
  std::ofstream out_;
  std::unique_ptr<tensorboard::EventWriter> events_;
  std::unique_ptr<CsvLog> csv_;
  std::unique_ptr<tracking::MlflowTracker> mlflow_;
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
  // Redraws the bar for an evaluation: `what` (e.g. "eval"), `done` of `total` batches.
  void evaluation(const std::string& what, int64_t done, int64_t total);
  // Clears the bar so other output starts on a clean line.
  void clear();

 private:
  // Whether to redraw now: a few times per second, and always at the end (`last`).
  bool due(bool last);
  bool active_ = false;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

// "1:02:03" or "2:03".
std::string format_duration(double seconds);

// What fit() reports: one train record per run.log_every steps with the window's mean loss and
// throughput over every rank (and on a GPU the caching allocator's peak and NVML's readings), one
// val record per evaluation, as JSON lines and TensorBoard scalars (rank 0), log lines and the
// progress bar.
class MetricsLog {
 public:
  // A run resumed at `resumed_step` (-1: a fresh run) keeps metrics.jsonl's records up to it.
  MetricsLog(const config::Config& cfg, Components& parts, TrainingState& state, int rank,
             int64_t resumed_step);

  // The step's samples and unreadable samples, into the window.
  void count(const std::vector<data::Batch>& micro_batches);
  // Around each step: the window's CUDA peak (host bookkeeping only).
  void begin_step();
  void end_step();
  // A step with a finite loss, counted in the window (the step adds its loss to
  // TrainingState::window_loss on the device).
  void add(const StepOutcome& outcome);

  // Writes the train record of the window ending at this step and starts the next window. Throws
  // when the window's mean loss is inf/NaN (train.max_bad_steps 0: nothing skipped such steps).
  // Every rank must call this, in the same order (the window's sums are all-reduced);
  // synchronises the device (reads the loss).
  void train(int64_t epoch);
  // Writes an evaluation's record and log line; `split` names it ("val", or "val_ema" for
  // train.ema's average).
  void eval(const EvalResult& result, int64_t epoch, const std::string& split = "val");
  // Language models: the model FLOPs of one training sample (forward and backward) and one
  // device's peak TFLOP/s, which give the train records' `tflops` (per device), `mfu` and
  // `peak_tflops`.
  void set_utilisation(double flops_per_sample, double peak_tflops) {
    flops_per_sample_ = flops_per_sample;
    peak_tflops_ = peak_tflops;
  }
  // Redraws the progress bar; without one, logs this process's first step when its train line
  // comes later (run.log_every).
  void progress(int64_t epoch);
  // The evaluation's progress bar (engine::evaluate's `progress`), `split` naming it.
  EvalProgress eval_progress(const std::string& split) {
    return [this, split](int64_t done, int64_t total) {
      progress_.evaluation(split == "val" ? "eval" : "eval (ema)", done, total);
    };
  }
  // Clears the progress bar so that other output starts on a clean line.
  void clear() { progress_.clear(); }

  // Seconds since the log began.
  double seconds() const;

  // The run ended: `status` FINISHED, or KILLED when stopped early (to resume), for the trackers.
  void finish(const std::string& status, const std::string& last_checkpoint);

 private:
  // Seconds left at this process's average step time.
  double eta() const;
  // The window's mean loss and samples of every rank.
  struct WindowSums {
    double loss = 0.0, samples = 0.0, grad_norm = 0.0;
  };
  WindowSums window_sums();
  // The line of this process's first step, unless a train line is due there.
  void first_step_line(int64_t epoch);
  // NVML's and the allocator's figures, into the record and the line.
  void add_gpu_readings(nlohmann::json& record, std::string& line);

  const config::Config& cfg_;
  Components& parts_;
  TrainingState& state_;
  std::unique_ptr<MetricsWriter> writer_;  // rank 0 only
  Progress progress_;
  std::unique_ptr<GpuMonitor> gpu_;  // on a GPU, when NVML loads
  int cuda_index_ = 0;
  std::chrono::steady_clock::time_point start_, window_start_;
  int64_t first_step_ = 0;
  int64_t window_cuda_peak_ = 0;  // the most bytes the window's steps held in tensors (CUDA)
  double last_loss_ = std::numeric_limits<double>::quiet_NaN();  // the last window's mean
  double last_sps_ = 0.0;                                        // and samples per second
  double flops_per_sample_ = 0.0, peak_tflops_ = 0.0;            // 0: no MFU
};

}  // namespace trainer::engine
