// Gradient scaling for float16 training, with torch.amp.GradScaler's algorithm: the loss is
// multiplied by a scale before backward; before the optimizer step the gradients are divided by
// it and checked for inf/NaN; a step with a non-finite gradient is skipped and the scale backed
// off, and after `growth_interval` clean steps in a row the scale grows.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainer::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;     // the first scale
  double growth_factor = 2.0;      // scale *= this after growth_interval clean steps
  double backoff_factor = 0.5;     // scale *= this after a step with inf/NaN gradients
  int64_t growth_interval = 2000;  // clean steps in a row before growing
};

class GradScaler {
 public:
  GradScaler(const GradScalerOptions& options, torch::Device device);

  // loss * scale, for backward. Nothing waits for the device.
  torch::Tensor scale(const torch::Tensor& loss) const;

  // Divides every defined gradient of `params` (on the scaler's device) by the scale in place,
  // once per optimizer step (after all micro-batches, before clipping). Returns a float32 device
  // scalar: 1 when any gradient is inf or NaN, else 0. Nothing waits for the device.
  torch::Tensor unscale(const std::vector<torch::Tensor>& params) const;

  // What a fused optimizer step needs instead of unscale(): the same found_inf, the gradients
  // left scaled (the kernel divides them by scale_tensor()). Nothing waits for the device.
  torch::Tensor check(const std::vector<torch::Tensor>& params) const;
  // The scale, a float32 device scalar (for a fused optimizer step's grad_scale).
  const torch::Tensor& scale_tensor() const { return scale_; }

  // After the step (taken or skipped): backs off on found_inf != 0, else counts a clean step and
  // grows the scale every growth_interval of them (a growth to inf is not taken).
  void update(const torch::Tensor& found_inf);

  // The current scale (synchronises the device).
  double scale_value() const;
  // Clean steps since the last growth or backoff (synchronises the device).
  int64_t growth_tracker() const;

  // The scale and growth tracker, for checkpoints: "scale" (float32) and "growth_tracker"
  // (int32) scalars.
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  // Restores what state() returned. Throws std::runtime_error when a tensor is missing or has
  // another dtype or shape.
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state);

  const GradScalerOptions& options() const { return options_; }

 private:
  // Multiplies every defined gradient by `factor` and returns found_inf.
  torch::Tensor check_and_multiply(const std::vector<torch::Tensor>& params,
                                   const torch::Tensor& factor) const;

  GradScalerOptions options_;
  torch::Tensor scale_;           // float32 scalar on the device
  torch::Tensor growth_tracker_;  // int32 scalar on the device
  torch::Tensor one_;             // 1.0 on the device: check()'s factor
};

}  // namespace trainer::optim
