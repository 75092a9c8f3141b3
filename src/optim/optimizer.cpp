#include "optim/optimizer.h"

#include <torch/torch.h>

#include "models/model.h"

namespace trainer::optim {
namespace {

// One group with the configured options and, when there are any, one without weight decay.
template <class Optimizer, class Options>
std::unique_ptr<torch::optim::Optimizer> build(const ParamGroups& params, const Options& options) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!params.decay.empty()) {
    groups.emplace_back(params.decay, std::make_unique<Options>(options));
  }
  if (!params.no_decay.empty()) {
    auto no_decay = std::make_unique<Options>(options);
    no_decay->weight_decay(0.0);
    groups.emplace_back(params.no_decay, std::move(no_decay));
  }
  return std::make_unique<Optimizer>(std::move(groups), options);
}

}  // namespace

const OptimizerRegistry& optimizer_registry() {
  static const OptimizerRegistry registry = [] {
    OptimizerRegistry r("optimizer");
    r.add("sgd", [](const ParamGroups& params, const config::OptimConfig& cfg) {
      return build<torch::optim::SGD>(params, torch::optim::SGDOptions(cfg.lr)
                                                  .momentum(cfg.momentum)
                                                  .nesterov(cfg.nesterov)
                                                  .weight_decay(cfg.weight_decay));
    });
    r.add("adam", [](const ParamGroups& params, const config::OptimConfig& cfg) {
      return build<torch::optim::Adam>(params, torch::optim::AdamOptions(cfg.lr)
                                                   .betas({cfg.betas[0], cfg.betas[1]})
                                                   .eps(cfg.eps)
                                                   .weight_decay(cfg.weight_decay));
    });
    r.add("adamw", [](const ParamGroups& params, const config::OptimConfig& cfg) {
      return build<torch::optim::AdamW>(params, torch::optim::AdamWOptions(cfg.lr)
                                                    .betas({cfg.betas[0], cfg.betas[1]})
                                                    .eps(cfg.eps)
                                                    .weight_decay(cfg.weight_decay));
    });
    return r;
  }();
  return registry;
}

ParamGroups split_parameters(const torch::nn::Module& model, const config::OptimConfig& cfg) {
  ParamGroups groups;
  const bool split = cfg.weight_decay > 0.0 && !cfg.decay_bias_and_norm;
  for (const auto& p : models::unique_parameters(model)) {
    if (!p.requires_grad()) continue;
    (split && p.dim() <= 1 ? groups.no_decay : groups.decay).push_back(p);
  }
  return groups;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const torch::nn::Module& model,
                                                        const config::OptimConfig& cfg) {
  return optimizer_registry().get(cfg.name)(split_parameters(model, cfg), cfg);
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace trainer::optim
