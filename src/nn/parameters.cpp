#include "nn/parameters.h"

#include <torch/torch.h>

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

namespace trainer::nn {

void move_to_meta(torch::Tensor& t) {
  if (!t.defined() || t.is_meta()) return;
  // What Tensor::set_data does after its check of the two tensors' kinds, which refuses a CPU
  // tensor's data replaced by a meta tensor's (LibTorch's Module::to(kMeta) fails on it).
  const auto meta = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
  t.unsafeGetTensorImpl()->shallow_copy_from(meta.getIntrusivePtr());
}

void move_to_meta(torch::Tensor& t, c10::IntArrayRef sizes) {
  const auto meta = at::empty(sizes, t.options().device(at::kMeta));
  t.unsafeGetTensorImpl()->shallow_copy_from(meta.getIntrusivePtr());
}

void move_to_meta(torch::nn::Module& module) {
  for (auto& p : module.parameters(/*recurse=*/true)) move_to_meta(p);
  for (auto& b : module.buffers(/*recurse=*/true)) move_to_meta(b);
}

}  // namespace trainer::nn
