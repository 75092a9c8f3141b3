#include "optim/optimizer.h"

#include <torch/torch.h>

#include <stdexcept>

#include "nn/parameters.h"

namespace trainer::optim {

// The built-in optimizers, a line each: X(file) for the register_<file> function in
// src/optim/<file>.cpp, which registers that file's optimizers.
#define TRAINER_BUILTIN_OPTIMIZERS(X) \
  X(sgd)                              \
  X(adam)                             \
  /* end of the list */

using R = OptimizerRegistry;
TRAINER_BUILTIN_OPTIMIZERS(TRAINER_DECLARE_REGISTER_FN)

const OptimizerRegistry& optimizer_registry() {
  static const auto registry = make_registry<OptimizerRegistry>(
      "optimizer", {TRAINER_BUILTIN_OPTIMIZERS(TRAINER_REGISTER_FN)});
  return registry;
}

config::OptimConfig default_optim_config(const std::string& name) {
  config::OptimConfig cfg;
  cfg.name = name;
  cfg.options = optimizer_registry().options();
  return cfg;
}

ParamGroups split_parameters(const torch::nn::Module& model, const config::OptimConfig& cfg) {
  ParamGroups groups;
  const bool split = cfg.weight_decay > 0.0 && !cfg.decay_bias_and_norm;
  for (auto& [name, p] : nn::unique_named_parameters(model)) {
    if (!p.requires_grad()) continue;
    (split && p.dim() <= 1 ? groups.no_decay : groups.decay).emplace_back(name, p);
  }
  return groups;
}

std::unique_ptr<Optimizer> make_optimizer(const torch::nn::Module& model,
                                          const config::OptimConfig& cfg) {
  const auto& factory = optimizer_registry().get(cfg.name);
  return factory(split_parameters(model, cfg), cfg);
}

torch::Tensor state_tensor(const std::map<std::string, torch::Tensor>& state,
                           const std::string& name, const torch::Tensor& like) {
  const auto it = state.find(name);
  if (it == state.end()) return {};
  if (like.defined() && it->second.sizes() != like.sizes()) {
    throw std::runtime_error("optimizer state " + name + " has another shape than its parameter");
  }
  return like.defined() ? it->second.to(like.options()).clone() : it->second.clone();
}

}  // namespace trainer::optim
