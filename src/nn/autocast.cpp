#include "nn/autocast.h"

#include <ATen/autocast_mode.h>

#include <stdexcept>
#include <string>

namespace trainer::nn {

AutocastState AutocastState::current() {
  AutocastState s;
  s.cpu_enabled = at::autocast::is_autocast_enabled(at::kCPU);
  s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  s.cuda_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
  s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  s.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

void AutocastState::apply() const {
  at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
  at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
  at::autocast::set_autocast_enabled(at::kCUDA, cuda_enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
  at::autocast::set_autocast_cache_enabled(cache_enabled);
}

bool autocast_enabled(c10::DeviceType device_type) {
  return (device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA) &&
         at::autocast::is_autocast_enabled(device_type);
}

c10::ScalarType autocast_dtype(c10::DeviceType device_type) {
  return at::autocast::get_autocast_dtype(device_type);
}

AutocastGuard::AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled)
    : saved_(AutocastState::current()) {
  if (device_type != at::kCPU && device_type != at::kCUDA) {
    throw std::invalid_argument("autocast supports cpu and cuda devices, not " +
                                c10::DeviceTypeName(device_type, /*lower_case=*/true));
  }
  at::autocast::set_autocast_enabled(device_type, enabled);
  at::autocast::set_autocast_dtype(device_type, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::AutocastGuard(const AutocastState& state) : saved_(AutocastState::current()) {
  state.apply();
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  saved_.apply();
}

}  // namespace trainer::nn
