#include <torch/torch.h>

#include <sstream>
#include <unordered_set>

#include "config/loader.h"
#include "models/builtin.h"

namespace trainer::models {

const ModelRegistry& model_registry() {
  static const ModelRegistry registry = [] {
    ModelRegistry r("model");
    register_mlp(r);
    register_lenet(r);
    register_gpt(r);
    register_resnet(r);
    return r;
  }();
  return registry;
}

nn::CheckpointPolicy checkpoint_policy(const config::ModelConfig& cfg, bool has_blocks) {
  const auto period = config::checkpoint_period(cfg.checkpointing);
  if (!period) {
    throw ModelError("model.checkpointing", "must be none, blocks or every:N with N >= 1, got '" +
                                                cfg.checkpointing + "'");
  }
  if (*period > 0 && !has_blocks) {
    throw ModelError("model.checkpointing", "model '" + cfg.name +
                                                "' has no blocks to checkpoint; use none "
                                                "(resnet and gpt models have them)");
  }
  return nn::CheckpointPolicy(*period);
}

torch::Tensor activate(const std::string& name, const torch::Tensor& x) {
  if (name == "gelu") return torch::gelu(x);
  if (name == "tanh") return torch::tanh(x);
  return torch::relu(x);
}

std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters(
    const torch::nn::Module& module) {
  // A tied weight (gpt's lm_head.weight and transformer.wte.weight) is registered under two names
  // and listed twice by named_parameters(); keep its first appearance.
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

std::string summary(const torch::nn::Module& module, const std::string& name) {
  std::ostringstream out;
  out << "model: " << name << "\n";
  for (const auto& child : module.named_children()) {
    std::ostringstream line;
    child.value()->pretty_print(line);
    out << "  " << child.key() << ": " << line.str() << "  (" << parameter_count(*child.value())
        << " parameters)\n";
  }
  out << "parameters: " << parameter_count(module) << "\n";
  return out.str();
}

}  // namespace trainer::models
