// Learning-rate schedules: linear warmup followed by a decay chosen by `sched.name`.
//
// Torch-free: a schedule is a pure function of the optimizer step.
#pragma once

#include <cstdint>
#include <functional>

#include "config/config.h"
#include "config/registry.h"

namespace trainer::optim {

// Learning rate after warmup as a function of t, the optimizer steps taken since warmup ended.
using Decay = std::function<double(int64_t t)>;
// Builds a decay from the config, the peak rate and the number of steps after warmup.
using DecayFactory =
    std::function<Decay(const config::SchedConfig& cfg, double base_lr, int64_t decay_steps)>;
using ScheduleRegistry = Registry<DecayFactory>;

// constant, step, multistep, cosine, linear.
const ScheduleRegistry& schedule_registry();

class Schedule {
 public:
  // `total_steps` is the number of optimizer steps of the whole run.
  Schedule(const config::SchedConfig& cfg, double base_lr, int64_t total_steps);

  // The learning rate for the optimizer step with 0-based index `step`.
  //   step < W (warmup): base * (s0 + (1 - s0) * (step + 1) / W), s0 = warmup_start_factor
  //   otherwise:         decay(step - W)
  double lr(int64_t step) const;

  // The warm-up's optimizer steps (sched.warmup_steps, or sched.warmup_epochs resolved).
  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  double base_lr_;
  int64_t warmup_steps_;
  double warmup_start_factor_;
  Decay decay_;
};

}  // namespace trainer::optim
