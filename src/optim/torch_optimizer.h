// An Optimizer on one of LibTorch's torch::optim optimizers (for the optimizers' own files).
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <utility>
#include <vector>

#include "optim/optimizer.h"

namespace trainer::optim {

// Wraps a TorchOptimizer (torch::optim::SGD, Adam, AdamW) with one parameter group for the decay
// parameters and, when there are any, one without weight decay.
template <class TorchOptimizer, class TorchOptions>
class TorchOptimizerBase : public Optimizer {
 public:
  TorchOptimizerBase(ParamGroups params, const TorchOptions& options) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (!params.decay.empty()) {
      groups.emplace_back(tensors(params.decay), std::make_unique<TorchOptions>(options));
    }
    if (!params.no_decay.empty()) {
      auto no_decay = std::make_unique<TorchOptions>(options);
      no_decay->weight_decay(0.0);
      groups.emplace_back(tensors(params.no_decay), std::move(no_decay));
    }
    optimizer_ = std::make_unique<TorchOptimizer>(std::move(groups), options);
    params_ = std::move(params.decay);
    for (auto& p : params.no_decay) params_.push_back(std::move(p));
  }

  void step(double lr) override {
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
    optimizer_->step();
  }

 protected:
  // The state of `param` as the optimizer's state type, or null when it has none yet.
  template <class State>
  State* state_of(const torch::Tensor& param) const {
    auto& own = optimizer_->state();
    const auto it = own.find(param.unsafeGetTensorImpl());
    return it == own.end() ? nullptr : static_cast<State*>(it->second.get());
  }

  // Sets the state of `param`.
  void set_state(const torch::Tensor& param,
                 std::unique_ptr<torch::optim::OptimizerParamState> state) {
    optimizer_->state()[param.unsafeGetTensorImpl()] = std::move(state);
  }
  void clear_state() { optimizer_->state().clear(); }

  NamedTensors params_;  // every parameter under its name, the decay group's first
  std::unique_ptr<TorchOptimizer> optimizer_;

 private:
  static std::vector<torch::Tensor> tensors(const NamedTensors& named) {
    std::vector<torch::Tensor> out;
    for (const auto& [name, p] : named) out.push_back(p);
    return out;
  }
};

}  // namespace trainer::optim
