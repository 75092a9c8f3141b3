// The targets that end a run after an evaluation reaches them (time to a target, as MLPerf
// measures it): train.stop_at, and train.stop_at_top1 as {metric: val/top1, above: X}.
#pragma once

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "config/loader.h"
#include "engine/setup/results.h"

namespace trainer::engine {

struct StopTarget {
  std::string key;     // the config key that set it: train.stop_at or train.stop_at_top1
  std::string metric;  // as the metrics log names it: val/loss, val_ema/top1, ...
  double below = std::numeric_limits<double>::quiet_NaN();  // reached at a value <= below
  double above = std::numeric_limits<double>::quiet_NaN();  // reached at a value >= above

  // Whether `value` reaches the target.
  bool reached_by(double value) const;
  // "val/loss <= 0.925"
  std::string describe() const;
};

// The run's targets, none when neither key is set.
std::vector<StopTarget> stop_targets(const config::TrainConfig& train);

// The value of metric `name` (split/field: val/loss, val_ema/ppl) in the evaluation of the
// weights (`val`) or of train.ema's average (`ema`, null without one); nullopt when that
// evaluation has no such field (top1 and top5 of a language model, ppl of a classifier).
std::optional<double> eval_metric(const std::string& name, const EvalResult& val,
                                  const EvalResult* ema);

// config::ConfigError naming train.stop_at.metric when the model's evaluations have no such
// field (`sequence`: a language model's, which give loss and ppl; else loss, top1 and top5; a
// train.objective other than supervised, dpo: loss).
void check_stop_target(const config::LoadedConfig& loaded, bool sequence);

// Seconds since this process started (Linux: its start time in /proc; elsewhere, since this
// library's static initialisation).
double seconds_since_process_start();

}  // namespace trainer::engine
