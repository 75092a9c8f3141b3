// train.skip_update_zscore: llm.c's loss-spike guard, decided on the device.
//
// The step's loss (averaged over the ranks) and the gradients' global norm each go through a
// window of the previous `window` steps' values: once the window is full, a value more than the
// limit standard deviations (population) above the window's mean is a spike, and the step's
// update is skipped like an inf/NaN one. Every step's value then enters the window, the skipped
// ones too (a lasting change in level is learned, not skipped forever); an inf/NaN value enters
// as the window's mean. Nothing reads the device: the window and its count are device tensors,
// so the check also runs inside a captured step (train.cuda_graph).
#pragma once

#include <torch/types.h>

#include <string>

#include "config/config.h"
#include "engine/setup/saved_part.h"

namespace trainer::engine {

// One value's window.
class ZScoreWindow {
 public:
  ZScoreWindow(int64_t window, torch::Device device);

  // 1 (a float32 device scalar) when the window is full and `value` lies more than `limit`
  // standard deviations above its mean, else 0; then enters `value`. `z` gets the z-score (0
  // before the window is full). Queues device work only.
  torch::Tensor spike(const torch::Tensor& value, double limit, torch::Tensor& z);

  // values [window] float64 and count, an int64 scalar.
  checkpoint::NamedTensors tensors(const std::string& prefix) const;
  void restore(const std::map<std::string, torch::Tensor>& saved, const std::string& prefix,
               const std::string& path);

 private:
  int64_t size_;
  torch::Tensor values_;  // [size_] float64, 0 where not filled yet
  torch::Tensor count_;   // [] int64: values entered so far (the next takes slot count % size)
};

class SpikeGuard final : public SavedPart {
 public:
  SpikeGuard(const config::ZScoreConfig& cfg, torch::Device device);

  // Whether the gradient norm is checked (the step must compute it).
  bool checks_grad_norm() const { return cfg_.grad_norm > 0.0; }

  // The spike flag of a step (a float32 device scalar, 1: skip its update) from its `loss` and
  // `grad_norm` (undefined when not checked). Fills `z` with the two z-scores [loss, grad_norm]
  // for the log. Queues device work only.
  torch::Tensor check(const torch::Tensor& loss, const torch::Tensor& grad_norm, torch::Tensor& z);

  std::string prefix() const override { return "guard."; }
  checkpoint::NamedTensors tensors() const override;
  void restore(const checkpoint::NamedTensors& saved, const std::string& path) override;

 private:
  config::ZScoreConfig cfg_;
  ZScoreWindow loss_, grad_norm_;
};

}  // namespace trainer::engine
