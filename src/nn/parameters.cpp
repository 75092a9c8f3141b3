#include "nn/parameters.h"

#include <unordered_set>

namespace trainer::nn {

std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters(
    const torch::nn::Module& module) {
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), p.value());
  }
  return out;
}

std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (auto& [name, p] : unique_named_parameters(module)) out.push_back(std::move(p));
  return out;
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : unique_parameters(module)) n += p.numel();
  return n;
}

}  // namespace trainer::nn
