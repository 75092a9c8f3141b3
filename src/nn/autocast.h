// Autocast as torch.autocast does it: per device type, nestable, the cast cache cleared when the
// outermost region ends.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace trainer::nn {

// The thread's autocast settings for the CPU and CUDA.
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::kHalf;
  bool cache_enabled = true;  // casts of weights reused within the outermost region

  static AutocastState current();
  void apply() const;
};

// Whether autocast is on for tensors of `device_type`, and its dtype there: off for a device type
// autocast does not know (the meta device of a planned model's step, engine/measure/memory.h,
// which emulates autocast itself), where LibTorch's at::autocast::is_autocast_enabled throws.
bool autocast_enabled(c10::DeviceType device_type);
c10::ScalarType autocast_dtype(c10::DeviceType device_type);

// While alive: autocast on `device_type` (kCPU or kCUDA) in `dtype` when `enabled`, off there
// when not (like torch.autocast(enabled=False) inside an autocast region). On destruction the
// previous settings return, and the cast cache is cleared when this was the outermost region.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true);
  // Reinstates `state` for both device types (a recomputation in backward sees the forward's).
  explicit AutocastGuard(const AutocastState& state);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState saved_;
};

}  // namespace trainer::nn
