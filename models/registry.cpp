#include <torch/torch.h>

#include <sstream>

#include "models/builtin.h"

namespace trainer::models {

const ModelRegistry& model_registry() {
  static const ModelRegistry registry = [] {
    ModelRegistry r("model");
    register_mlp(r);
    register_lenet(r);
    return r;
  }();
  return registry;
}

torch::Tensor activate(const std::string& name, const torch::Tensor& x) {
  if (name == "gelu") return torch::gelu(x);
  if (name == "tanh") return torch::tanh(x);
  return torch::relu(x);
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
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
