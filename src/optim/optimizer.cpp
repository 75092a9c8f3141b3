#include "optim/optimizer.h"

#include <torch/torch.h>

#include <stdexcept>

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

namespace {

const void* key_of(const torch::Tensor& param) {
  return param.unsafeGetTensorImpl();
}

// Adam's and AdamW's per-parameter states have the same fields in two types.
template <class AdamState>
void add_adam_fields(const AdamState& s, NamedTensors& out) {
  out.emplace_back("step", torch::tensor(s.step(), torch::kInt64));
  out.emplace_back("exp_avg", s.exp_avg());
  out.emplace_back("exp_avg_sq", s.exp_avg_sq());
  if (s.max_exp_avg_sq().defined()) out.emplace_back("max_exp_avg_sq", s.max_exp_avg_sq());
}

// The fields of one parameter's state, by name; undefined tensors are left out.
NamedTensors fields_of(const torch::optim::OptimizerParamState& state) {
  NamedTensors out;
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    if (sgd->momentum_buffer().defined())
      out.emplace_back("momentum_buffer", sgd->momentum_buffer());
  } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    add_adam_fields(*adam, out);
  } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    add_adam_fields(*adamw, out);
  } else {
    throw std::runtime_error("optimizer state of an unknown type cannot be saved");
  }
  return out;
}

template <class AdamState>
std::unique_ptr<torch::optim::OptimizerParamState> adam_state(int64_t step, torch::Tensor exp_avg,
                                                              torch::Tensor exp_avg_sq,
                                                              torch::Tensor max_exp_avg_sq) {
  auto s = std::make_unique<AdamState>();
  s->step(step).exp_avg(std::move(exp_avg)).exp_avg_sq(std::move(exp_avg_sq));
  s->max_exp_avg_sq(std::move(max_exp_avg_sq));
  return s;
}

}  // namespace

NamedTensors optimizer_state(const torch::optim::Optimizer& optimizer, const NamedTensors& params) {
  NamedTensors out;
  const auto& state = optimizer.state();
  for (const auto& [name, param] : params) {
    auto it = state.find(const_cast<void*>(key_of(param)));
    if (it == state.end()) continue;
    for (auto& [field, tensor] : fields_of(*it->second)) {
      out.emplace_back(name + "." + field, tensor);
    }
  }
  return out;
}

void load_optimizer_state(torch::optim::Optimizer& optimizer, const NamedTensors& params,
                          const std::map<std::string, torch::Tensor>& state) {
  auto get = [&](const std::string& name, const torch::Tensor& like) -> torch::Tensor {
    auto it = state.find(name);
    if (it == state.end()) return {};
    if (like.defined() && it->second.sizes() != like.sizes()) {
      throw std::runtime_error("optimizer state " + name + " has another shape than its parameter");
    }
    return like.defined() ? it->second.to(like.options()).clone() : it->second.clone();
  };
  auto step_of = [&](const std::string& name) {
    auto t = get(name + ".step", {});
    if (!t.defined()) throw std::runtime_error("optimizer state " + name + ".step is missing");
    return t.item<int64_t>();
  };
  auto& own = optimizer.state();
  own.clear();
  const bool sgd = dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr;
  const bool adam = dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr;
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  for (const auto& [name, param] : params) {
    void* key = const_cast<void*>(key_of(param));
    if (sgd) {
      auto buf = get(name + ".momentum_buffer", param);
      if (!buf.defined()) continue;  // no momentum, or never stepped
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(buf);
      own[key] = std::move(s);
    } else if (adam || adamw) {
      auto exp_avg = get(name + ".exp_avg", param);
      if (!exp_avg.defined()) continue;  // never stepped
      auto exp_avg_sq = get(name + ".exp_avg_sq", param);
      auto max_sq = get(name + ".max_exp_avg_sq", param);
      if (!exp_avg_sq.defined()) {
        throw std::runtime_error("optimizer state " + name + ".exp_avg_sq is missing");
      }
      own[key] = adam ? adam_state<torch::optim::AdamParamState>(step_of(name), exp_avg, exp_avg_sq,
                                                                 max_sq)
                      : adam_state<torch::optim::AdamWParamState>(step_of(name), exp_avg,
                                                                  exp_avg_sq, max_sq);
    } else {
      throw std::runtime_error("optimizer state of an unknown optimizer type cannot be loaded");
    }
  }
}

}  // namespace trainer::optim
