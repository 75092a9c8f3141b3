#include "optim/grad_scaler.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <torch/torch.h>

#include <map>
#include <stdexcept>

#include "util/device.h"

namespace trainer::optim {

GradScaler::GradScaler(const GradScalerOptions& options, torch::Device device) : options_(options) {
  scale_ = torch::full({}, options.init_scale, torch::TensorOptions().device(device));
  growth_tracker_ = torch::zeros({}, torch::TensorOptions().device(device).dtype(torch::kInt));
  one_ = torch::ones({}, scale_.options());
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

torch::Tensor GradScaler::unscale(const std::vector<torch::Tensor>& params) const {
  // 1/scale computed in double and rounded once, as torch.amp does.
  return check_and_multiply(params, scale_.to(torch::kDouble).reciprocal().to(torch::kFloat));
}

torch::Tensor GradScaler::check(const std::vector<torch::Tensor>& params) const {
  return check_and_multiply(params, one_);
}

torch::Tensor GradScaler::check_and_multiply(const std::vector<torch::Tensor>& params,
                                             const torch::Tensor& factor) const {
  auto found_inf = torch::zeros({}, scale_.options());
  // The fused kernel takes one dtype per call; every gradient is on the scale's device.
  std::map<c10::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& p : params) {
    const auto& g = p.grad();
    if (!g.defined()) continue;
    TORCH_CHECK(!g.is_sparse(), "GradScaler: sparse gradients are not supported");
    TORCH_CHECK(g.device() == scale_.device(), "GradScaler: a gradient on ", g.device(),
                ", the scale on ", scale_.device());
    by_dtype[g.scalar_type()].push_back(g);
  }
  for (auto& [dtype, grads] : by_dtype) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, factor);
  }
  return found_inf;
}

void GradScaler::update(const torch::Tensor& found_inf) {
  const auto& inf =
      found_inf.device() == scale_.device() ? found_inf : found_inf.to(scale_.device());
  at::_amp_update_scale_(scale_, growth_tracker_, inf, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
}

double GradScaler::scale_value() const {
  return host_double(scale_);
}

int64_t GradScaler::growth_tracker() const {
  return host_int(growth_tracker_);
}

std::vector<std::pair<std::string, torch::Tensor>> GradScaler::state() const {
  return {{"scale", scale_}, {"growth_tracker", growth_tracker_}};
}

void GradScaler::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  auto take = [&](const std::string& name, torch::Tensor& into) {
    for (const auto& [key, t] : state) {
      if (key != name) continue;
      if (t.dim() != 0 || t.scalar_type() != into.scalar_type()) {
        throw std::runtime_error("grad scaler state '" + name + "' has the wrong dtype or shape");
      }
      torch::NoGradGuard no_grad;
      into.copy_(t);
      return;
    }
    throw std::runtime_error("grad scaler state has no '" + name + "'");
  };
  take("scale", scale_);
  take("growth_tracker", growth_tracker_);
}

}  // namespace trainer::optim
