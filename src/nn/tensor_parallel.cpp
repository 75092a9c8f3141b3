#include "nn/tensor_parallel.h"

#include "nn/deferred_init.h"

#include <torch/torch.h>

#include <set>
#include <stdexcept>
#include <vector>

namespace trainer::nn {

void keep_parts(torch::nn::Module& module, const SplitPlan& plan, int rank, int parts) {
  std::vector<std::pair<torch::Tensor, TensorSplit>> chosen;
  std::set<const void*> seen;  // a tied parameter is split once
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const torch::Tensor& p = item.value();
    const auto it = plan.find(name);
    if (it == plan.end() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    const std::string problem = split_problem(p.sizes().vec(), it->second, parts);
    if (!problem.empty()) throw std::invalid_argument(name + ": " + problem);
    chosen.emplace_back(p, it->second);
  }
  torch::NoGradGuard no_grad;
  const bool unwritten = deferral() == Deferral::unwritten;
  for (auto& [p, split] : chosen) {
    const auto part = split_part(p, split, rank, parts);
    p.set_data(unwritten ? torch::empty(part.sizes(), p.options()) : part.contiguous().clone());
  }
}

torch::Tensor column_parallel(TensorParallel& tp, const torch::Tensor& x,
                              const torch::Tensor& weight, const torch::Tensor& bias) {
  return torch::linear(tp.copy_in(x), weight, bias);  // [..., out / tp]
}

torch::Tensor row_parallel(TensorParallel& tp, const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias) {
  auto y = tp.reduce_out(torch::linear(x, weight));  // [..., out]
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

}  // namespace trainer::nn
