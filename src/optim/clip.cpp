#include "optim/clip.h"

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <torch/torch.h>

#include <stdexcept>

namespace trainer::optim {
namespace {

// The defined gradients of `params`.
std::vector<torch::Tensor> defined_grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

// Scales `grads` by min(1, max_norm / (total + 1e-6)), as Python computes it (reciprocal, then
// the product).
void scale_to(const std::vector<torch::Tensor>& grads, const torch::Tensor& total,
              double max_norm) {
  const auto coef = at::clamp((total + 1e-6).reciprocal() * max_norm, std::nullopt, 1.0);
  at::_foreach_mul_(grads, coef);
}

}  // namespace

torch::Tensor grad_norm(const std::vector<torch::Tensor>& params, const SquaredNormSum& sum) {
  torch::NoGradGuard no_grad;
  const auto grads = defined_grads(params);
  torch::Tensor total;  // []
  if (!grads.empty()) {
    const auto norms = at::_foreach_norm(grads, 2.0);  // each [], per gradient
    total = at::linalg_vector_norm(at::stack(norms), 2.0);
  }
  // Sharded: the squares summed over the shards (every process joins, with gradients or not).
  if (sum) total = sum(total.defined() ? total * total : total).sqrt();
  return total;
}

void clip_for_step(const Optimizer& optimizer, const std::vector<torch::Tensor>& params,
                   double max_norm, const torch::Tensor& total, KernelInputs& inputs) {
  if (inputs.grad_scale.defined())
    throw std::logic_error("clip_for_step: grad_scale is already set");
  torch::NoGradGuard no_grad;
  const auto grads = defined_grads(params);
  if (grads.empty()) return;
  if (!optimizer.takes_device_inputs()) {
    scale_to(grads, total, max_norm);
    return;
  }
  inputs.grad_scale = at::clamp_min((total + 1e-6) / max_norm, 1.0);  // []
}

}  // namespace trainer::optim
