#include "optim/grad_scaler.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

namespace trainer::optim {

GradScaler::GradScaler(const GradScalerOptions& options, torch::Device device) : options_(options) {
  scale_ = torch::full({}, options.init_scale, torch::TensorOptions().device(device));
  growth_tracker_ = torch::zeros({}, torch::TensorOptions().device(device).dtype(torch::kInt));
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

torch::Tensor GradScaler::unscale(const std::vector<torch::Tensor>& params) const {
  auto found_inf = torch::zeros({}, scale_.options());
  // 1/scale computed in double and rounded once, as torch.amp does.
  const auto inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  // The fused kernel takes one device and dtype per call.
  struct Group {
    c10::Device device;
    c10::ScalarType dtype;
    std::vector<torch::Tensor> grads;
  };
  std::vector<Group> groups;
  for (const auto& p : params) {
    const auto& g = p.grad();
    if (!g.defined()) continue;
    if (g.is_sparse())
      throw std::invalid_argument("GradScaler: sparse gradients are not supported");
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& group) {
      return group.device == g.device() && group.dtype == g.scalar_type();
    });
    if (it == groups.end())
      it = groups.insert(groups.end(), Group{g.device(), g.scalar_type(), {}});
    it->grads.push_back(g);
  }
  for (auto& group : groups) {
    if (group.device == found_inf.device()) {
      at::_amp_foreach_non_finite_check_and_unscale_(group.grads, found_inf, inv_scale);
    } else {
      auto local = torch::zeros({}, found_inf.options().device(group.device));
      at::_amp_foreach_non_finite_check_and_unscale_(group.grads, local,
                                                     inv_scale.to(group.device));
      found_inf = torch::maximum(found_inf, local.to(found_inf.device()));
    }
  }
  return found_inf;
}

void GradScaler::update(const torch::Tensor& found_inf) {
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf.to(scale_.device()),
                         options_.growth_factor, options_.backoff_factor, options_.growth_interval);
}

double GradScaler::scale_value() const {
  return scale_.item<double>();
}

int64_t GradScaler::growth_tracker() const {
  return growth_tracker_.item<int64_t>();
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
