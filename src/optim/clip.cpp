#include "optim/clip.h"

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <torch/torch.h>

#include <stdexcept>

namespace trainer::optim {
namespace {

// The defined gradients of `params` and their global L2 norm (a float32 device scalar).
std::pair<std::vector<torch::Tensor>, torch::Tensor> global_norm(
    const std::vector<torch::Tensor>& params, const SquaredNormSum& sum) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  torch::Tensor total;  // []
  if (!grads.empty()) {
    const auto norms = at::_foreach_norm(grads, 2.0);  // each [], per gradient
    total = at::linalg_vector_norm(at::stack(norms), 2.0);
  }
  // Sharded: the squares summed over the shards (every process joins, with gradients or not).
  if (sum) total = sum(total.defined() ? total * total : total).sqrt();
  return {std::move(grads), std::move(total)};
}

}  // namespace

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                             const SquaredNormSum& sum) {
  torch::NoGradGuard no_grad;
  auto [grads, total] = global_norm(params, sum);
  if (grads.empty()) return {};
  // max_norm / (total + 1e-6) as Python computes it (reciprocal, then the product), at most 1.
  const auto coef = at::clamp((total + 1e-6).reciprocal() * max_norm, std::nullopt, 1.0);
  at::_foreach_mul_(grads, coef);
  return total;
}

void clip_for_step(const Optimizer& optimizer, const std::vector<torch::Tensor>& params,
                   double max_norm, KernelInputs& inputs, const SquaredNormSum& sum) {
  if (inputs.grad_scale.defined())
    throw std::logic_error("clip_for_step: grad_scale is already set");
  if (!optimizer.takes_device_inputs()) {
    clip_grad_norm(params, max_norm, sum);
    return;
  }
  torch::NoGradGuard no_grad;
  auto [grads, total] = global_norm(params, sum);
  if (grads.empty()) return;
  inputs.grad_scale = at::clamp_min((total + 1e-6) / max_norm, 1.0);  // []
}

}  // namespace trainer::optim
