// train.ema: an exponential moving average of the trained parameters, kept beside them on the
// device, evaluated as `val_ema_*`, saved in checkpoints and exported with `--weights ema`.
//
// timm's ModelEmaV3 (exclude_buffers): after step n's update, every `every` steps,
// average = lerp(average, parameter, 1 - decay(n)) in one _foreach_lerp_ over the parameters;
// decay(n) is 0 at the first step (the average starts as the weights), then train.ema.decay, or
// with warm-up min(decay, 1 - (1 + (n - 1))^(-2/3)). Buffers (batch-norm statistics) are not
// averaged: the model's own are used with the average.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "engine/setup/components.h"
#include "engine/setup/saved_part.h"

namespace trainer::engine {

class WeightAverage final : public SavedPart {
 public:
  // The average of `parts.params` (with fsdp this rank's shards of them), starting as their
  // current values.
  WeightAverage(const config::EmaConfig& cfg, Components& parts);

  // timm's decay for the update after optimizer step `step` (1-based).
  static double decay_at(const config::EmaConfig& cfg, int64_t step);

  // After step `step`'s update is queued: averages when `step` is a multiple of train.ema.every.
  // Queues one multi-tensor lerp; nothing waits for the device.
  void update(int64_t step);

  // Puts the average into the parameters, keeping theirs aside, until the guard ends: what the
  // model evaluates meanwhile is the average. Copies on the device.
  class Swapped {
   public:
    explicit Swapped(WeightAverage& average);
    ~Swapped();
    Swapped(const Swapped&) = delete;
    Swapped& operator=(const Swapped&) = delete;

   private:
    WeightAverage& average_;
    std::vector<torch::Tensor> kept_;  // the trained values
  };

  std::string prefix() const override { return "ema."; }
  checkpoint::NamedTensors tensors() const override;
  std::vector<checkpoint::ShardPiece> pieces() const override;
  void restore(const checkpoint::NamedTensors& saved, const std::string& path) override;

 private:
  // The state-dict names of parts.params[i] (a tied parameter under each of its names).
  std::vector<std::vector<std::string>> names_;
  config::EmaConfig cfg_;
  Components& parts_;
  std::vector<torch::Tensor> average_;  // like parts_.params
};

}  // namespace trainer::engine
