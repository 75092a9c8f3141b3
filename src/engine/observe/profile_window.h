// The `profile:` section: a window of training steps recorded by LibTorch's Kineto profiler.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "config/config.h"
#include "engine/observe/profiler.h"
#include "engine/setup/results.h"

namespace trainer::engine {

// From step profile.start_step (1-based), profile.steps steps (or to the run's end) under the
// profiler, with each step (`ProfilerStep#<step>`) and the trainer's phases as named ranges. Then
// every rank writes its Chrome trace to <run.dir>/profile/rank_<N>.trace.json, and rank 0 logs
// the table of the operators by self time. A run that stops inside the window (train.stop_at_step,
// a signal, an error) writes what was recorded when the window is destroyed; a run resumed inside
// the window records the rest of it, into rank_<N>.from_step_<S>.trace.json (S its first step).
// A run resumed past the window records nothing; a window after the run's last step is warned
// about after the first step.
class ProfileWindow {
 public:
  ProfileWindow(const config::ProfileConfig& cfg, torch::Device device, std::string run_dir,
                int rank);
  // Writes the trace of a window still recording (the run stopped inside it).
  ~ProfileWindow();
  ProfileWindow(const ProfileWindow&) = delete;
  ProfileWindow& operator=(const ProfileWindow&) = delete;

  // Before step `step` runs: starts recording at the window's first step. The observer to pass
  // to the step while recording; null otherwise.
  StepObserver* before(int64_t step);
  // After step `step` ran, `last_step` being the run's last: at the window's end, stops and
  // writes the trace. Reads the device: the profiler's stop waits for the work in flight.
  void after(int64_t step, int64_t last_step);

 private:
  void stop(int64_t step);

  config::ProfileConfig cfg_;
  torch::Device device_;
  std::string run_dir_;
  int rank_;
  int64_t first_ = 0;       // the first step recorded
  int64_t last_ended_ = 0;  // the last step recorded to its end
  bool checked_ = false;    // the window checked against the run's last step
  std::unique_ptr<StepProfiler> profiler_;
  std::unique_ptr<PhaseRanges> ranges_;
};

}  // namespace trainer::engine
