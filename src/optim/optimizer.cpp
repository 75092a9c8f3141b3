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

const char* impl_name(Impl impl) {
  switch (impl) {
    case Impl::fused:
      return "fused";
    case Impl::foreach:
      return "foreach";
    case Impl::loop:
      return "loop";
  }
  return "?";
}

config::OptimConfig default_optim_config(const std::string& name) {
  config::OptimConfig cfg;
  cfg.name = name;
  cfg.options = optimizer_registry().options();
  return cfg;
}

Impl resolve_impl(const std::string& impl, torch::Device device) {
  if (impl == "foreach") return Impl::foreach;
  if (impl == "loop") return Impl::loop;
  if (impl == "fused" || device.is_cpu() || device.is_cuda()) return Impl::fused;
  return Impl::foreach;
}

Optimizer::Optimizer(ParamGroups params, double weight_decay, Impl impl) : impl_(impl) {
  for (auto* part : {&params.decay, &params.no_decay}) {
    const double decay = part == &params.decay ? weight_decay : 0.0;
    std::map<c10::ScalarType, size_t> group_of_dtype;
    for (auto& [name, p] : *part) {
      const auto [it, added] = group_of_dtype.emplace(p.scalar_type(), groups_.size());
      if (added) groups_.push_back(Group{decay, {}});
      groups_[it->second].members.push_back(params_.size());
      names_.push_back(name);
      params_.push_back(p);
    }
  }
}

std::vector<size_t> Optimizer::with_grad(const Group& group) const {
  std::vector<size_t> out;
  for (size_t i : group.members) {
    if (params_[i].grad().defined()) out.push_back(i);
  }
  return out;
}

std::vector<torch::Tensor> Optimizer::pick(const std::vector<torch::Tensor>& v,
                                           const std::vector<size_t>& indices) {
  std::vector<torch::Tensor> out;
  out.reserve(indices.size());
  for (size_t i : indices) out.push_back(v[i]);
  return out;
}

std::vector<torch::Tensor> Optimizer::grads(const std::vector<size_t>& indices) const {
  std::vector<torch::Tensor> out;
  out.reserve(indices.size());
  for (size_t i : indices) out.push_back(params_[i].grad());
  return out;
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
  return make_optimizer(split_parameters(model, cfg), cfg);
}

std::unique_ptr<Optimizer> make_optimizer(ParamGroups params, const config::OptimConfig& cfg) {
  const auto& factory = optimizer_registry().get(cfg.name);
  const auto& any = params.decay.empty() ? params.no_decay : params.decay;
  const torch::Device device =
      any.empty() ? torch::Device(torch::kCPU) : any.front().second.device();
  return factory(std::move(params), cfg, resolve_impl(cfg.impl, device));
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
