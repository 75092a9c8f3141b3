// Optimizers, registered by the YAML `optim.name`, each with its own keys (config/options.h).
//
// An optimizer updates a model's trainable parameters in groups (with and without weight decay),
// takes the learning rate with each step, and saves and restores its own state under the
// parameters' names, so that a checkpoint resumes the run exactly. Each has three
// implementations of one update (`optim.impl`): `fused` (one ATen kernel updates every parameter:
// at::_fused_sgd_, _fused_adam_, _fused_adamw_), `foreach` (a few multi-tensor _foreach_ ops per
// step) and `loop` (the ops one parameter at a time), as torch.optim's fused=True, foreach=True
// and single-tensor paths compute them.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
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

enum class Impl { fused, foreach, loop };

// "fused", "foreach" or "loop".
const char* impl_name(Impl impl);

// What a fused step takes from the device instead of the host (torch.amp.GradScaler's fused path,
// and a step captured in a CUDA graph, engine/loop/graphed_step.h). Undefined tensors are not
// given.
struct KernelInputs {
  torch::Tensor
      grad_scale;  // float32 scalar the kernel divides the gradients by (loss scale, clipping)
  torch::Tensor found_inf;  // float32 scalar: 1 makes the step skip itself
  torch::Tensor lr;         // float32 scalar: the learning rate, read when the kernel runs
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // Updates every parameter that has a gradient, at learning rate `lr` (weight decay applies to
  // the decay group only) or `device.lr` when defined. `device` may be non-empty only when
  // takes_device_inputs(). Nothing waits for the device.
  virtual void step(double lr, const KernelInputs& device = {}) = 0;

  // Whether step() takes KernelInputs: the fused kernels unscale, skip on found_inf and read the
  // learning rate on the device.
  bool takes_device_inputs() const { return impl_ == Impl::fused; }
  Impl impl() const { return impl_; }

  // The per-parameter state as tensors named "<parameter name>.<field>" (sgd: momentum_buffer;
  // adam, adamw: step (int64), exp_avg, exp_avg_sq), for the parameters that have state, the
  // same whatever the implementation. Synchronises the device when the steps live there (fused).
  virtual NamedTensors state() const = 0;

  // Replaces the state by `state` as state() names it; parameters it does not name start afresh.
  // Throws std::runtime_error naming a field that is missing or of another shape.
  virtual void load_state(const std::map<std::string, torch::Tensor>& state) = 0;

  // Tensors of state a stepped parameter has, each of the parameter's size (sgd with momentum 1,
  // adam 2): what a memory estimate multiplies the parameter bytes by.
  virtual int state_copies() const = 0;

  // Creates the state every parameter lacks as its first step would find it (zero momentum,
  // zero moments at step 0), so that a step captured in a CUDA graph allocates none and takes no
  // first-step path. The updates are the same as without.
  virtual void prepare_state() = 0;

 protected:
  // The parameters of a step: one group per weight decay and dtype (a fused kernel takes one
  // dtype), each listing its members' indices.
  struct Group {
    double weight_decay = 0.0;
    std::vector<size_t> members;
  };

  Optimizer(ParamGroups params, double weight_decay, Impl impl);

  // The members of `group` that have a gradient now.
  std::vector<size_t> with_grad(const Group& group) const;
  // v[i] for each i of `indices`.
  static std::vector<torch::Tensor> pick(const std::vector<torch::Tensor>& v,
                                         const std::vector<size_t>& indices);
  // The gradients of `indices`.
  std::vector<torch::Tensor> grads(const std::vector<size_t>& indices) const;
  // `t`, or nullopt when undefined: a fused kernel's optional argument.
  static std::optional<torch::Tensor> maybe(const torch::Tensor& t) {
    return t.defined() ? std::optional<torch::Tensor>(t) : std::nullopt;
  }

  std::vector<std::string> names_;     // every parameter's name
  std::vector<torch::Tensor> params_;  // and the parameter
  std::vector<Group> groups_;
  Impl impl_;
};

using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(
    ParamGroups params, const config::OptimConfig& cfg, Impl impl)>;
using OptimizerRegistry = Registry<OptimizerFactory>;

// sgd, adam, adamw.
const OptimizerRegistry& optimizer_registry();

// The optim section with every optimizer's default options and name `name`.
config::OptimConfig default_optim_config(const std::string& name);

// optim.impl resolved for parameters on `device`: auto is fused (every built-in optimizer has
// fused kernels for the CPU and CUDA in LibTorch 2.11), the others as named.
Impl resolve_impl(const std::string& impl, torch::Device device);

// Splits the trainable parameters of `model` (tied weights once): 1-D tensors (biases, norm
// weights) go to no_decay unless cfg.decay_bias_and_norm or weight decay is off.
ParamGroups split_parameters(const torch::nn::Module& model, const config::OptimConfig& cfg);

// The optimizer named by cfg.name over the parameters of `model`, in cfg.impl resolved for the
// parameters' device.
std::unique_ptr<Optimizer> make_optimizer(const torch::nn::Module& model,
                                          const config::OptimConfig& cfg);

// The optimizer named by cfg.name over `params` (sharded ones, distributed/fsdp.h), in cfg.impl
// resolved for their device.
std::unique_ptr<Optimizer> make_optimizer(ParamGroups params, const config::OptimConfig& cfg);

// state[name], converted to `like`'s dtype and device and copied; undefined when absent. Throws
// std::runtime_error when its shape differs from `like`'s (a defined `like`).
torch::Tensor state_tensor(const std::map<std::string, torch::Tensor>& state,
                           const std::string& name, const torch::Tensor& like);

}  // namespace trainer::optim
