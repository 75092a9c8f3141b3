// Optimizers, registered by the YAML `optim.name`, each with its own keys (config/options.h).
//
// An optimizer updates a model's trainable parameters in two groups (with and without weight
// decay), takes the learning rate with each step, and saves and restores its own state under
// the parameters' names, so that a checkpoint resumes the run exactly.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "config/registry.h"

namespace trainer::optim {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Trainable parameters, under their model names, split by whether weight decay applies to them.
struct ParamGroups {
  NamedTensors decay;     // weights of linear and conv layers
  NamedTensors no_decay;  // biases and norm weights, unless decay_bias_and_norm
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Updates every parameter that has a gradient, at learning rate `lr` (weight decay applies to
  // the decay group only). Nothing waits for the device.
  virtual void step(double lr) = 0;

  // The per-parameter state as tensors named "<parameter name>.<field>" (sgd: momentum_buffer;
  // adam, adamw: step, exp_avg, exp_avg_sq), for the parameters that have state. The tensors are
  // the optimizer's own, not copies.
  virtual NamedTensors state() const = 0;

  // Replaces the state by `state` as state() names it; parameters it does not name start afresh.
  // Throws std::runtime_error naming a field that is missing or of another shape.
  virtual void load_state(const std::map<std::string, torch::Tensor>& state) = 0;

  // Tensors of state a stepped parameter has, each of the parameter's size (sgd with momentum 1,
  // adam 2): what a memory estimate multiplies the parameter bytes by.
  virtual int state_copies() const = 0;
};

using OptimizerFactory =
    std::function<std::unique_ptr<Optimizer>(ParamGroups params, const config::OptimConfig& cfg)>;
using OptimizerRegistry = Registry<OptimizerFactory>;

// sgd, adam, adamw.
const OptimizerRegistry& optimizer_registry();

// The optim section with every optimizer's default options and name `name`.
config::OptimConfig default_optim_config(const std::string& name);

// Splits the trainable parameters of `model` (tied weights once): 1-D tensors (biases, norm
// weights) go to no_decay unless cfg.decay_bias_and_norm or weight decay is off.
ParamGroups split_parameters(const torch::nn::Module& model, const config::OptimConfig& cfg);

// The optimizer named by cfg.name over the parameters of `model`.
std::unique_ptr<Optimizer> make_optimizer(const torch::nn::Module& model,
                                          const config::OptimConfig& cfg);

// state[name], converted to `like`'s dtype and device and copied; undefined when absent. Throws
// std::runtime_error when its shape differs from `like`'s (a defined `like`).
torch::Tensor state_tensor(const std::map<std::string, torch::Tensor>& state,
                           const std::string& name, const torch::Tensor& like);

}  // namespace trainer::optim
