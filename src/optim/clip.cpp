#include "optim/clip.h"

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <torch/torch.h>

namespace trainer::optim {

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return {};
  torch::NoGradGuard no_grad;
  const auto norms = at::_foreach_norm(grads, 2.0);                  // each [], per gradient
  const auto total = at::linalg_vector_norm(at::stack(norms), 2.0);  // []
  // max_norm / (total + 1e-6) as Python computes it (reciprocal, then the product), at most 1.
  const auto coef = at::clamp((total + 1e-6).reciprocal() * max_norm, std::nullopt, 1.0);
  at::_foreach_mul_(grads, coef);
  return total;
}

}  // namespace trainer::optim
