// Optimizers, registered by the YAML `optim.name`.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "util/registry.h"

namespace trainer::optim {

// Parameters split by whether weight decay applies to them.
struct ParamGroups {
  std::vector<torch::Tensor> decay;     // weights of linear and conv layers
  std::vector<torch::Tensor> no_decay;  // biases and norm weights, unless decay_bias_and_norm
};

using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
    const ParamGroups& params, const config::OptimConfig& cfg)>;
using OptimizerRegistry = Registry<OptimizerFactory>;

// sgd, adam, adamw.
const OptimizerRegistry& optimizer_registry();

// Splits the trainable parameters of `model` (tied weights once): 1-D tensors (biases, norm
// weights) go to no_decay unless cfg.decay_bias_and_norm or weight decay is off.
ParamGroups split_parameters(const torch::nn::Module& model, const config::OptimConfig& cfg);

// The optimizer named by cfg.name over the parameters of `model`.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const torch::nn::Module& model,
                                                        const config::OptimConfig& cfg);

// Sets the learning rate of every parameter group.
void set_lr(torch::optim::Optimizer& optimizer, double lr);

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// The per-parameter state of `optimizer` (sgd: momentum_buffer; adam, adamw: step, exp_avg,
// exp_avg_sq, max_exp_avg_sq) as tensors named "<parameter name>.<field>", for the parameters
// `params` (name, tensor) that have state. The tensors are the optimizer's own, not copies.
NamedTensors optimizer_state(const torch::optim::Optimizer& optimizer, const NamedTensors& params);

// Replaces the state of `optimizer` by `state` as optimizer_state() names it. Throws
// std::runtime_error naming a field that is missing or of another shape.
void load_optimizer_state(torch::optim::Optimizer& optimizer, const NamedTensors& params,
                          const std::map<std::string, torch::Tensor>& state);

}  // namespace trainer::optim
