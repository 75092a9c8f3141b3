// adam and adamw: Adam with L2 weight decay (torch.optim.Adam) or decoupled weight decay
// (torch.optim.AdamW).
#include <torch/torch.h>

#include "optim/torch_optimizer.h"
#include "util/format.h"

namespace trainer::optim {
namespace {

// The `optim.` keys of adam and adamw.
struct AdamOptions {
  std::vector<double> betas = {0.9, 0.999};  // moment decay rates
  double eps = 1e-8;                         // denominator epsilon

  template <class V>
  void visit(V& v) {
    v("betas", betas);
    v("eps", eps);
  }
  void validate(config::Checks& c) const {
    if (betas.size() != 2) {
      c.add("betas", "must have exactly 2 entries, got " + std::to_string(betas.size()) +
                         " (e.g. [0.9, 0.999])");
    } else {
      for (size_t i = 0; i < 2; ++i) {
        if (!(betas[i] >= 0.0 && betas[i] < 1.0)) {
          c.add("betas", "every entry must be in [0, 1), got " + format_number(betas[i]) +
                             " at item " + std::to_string(i + 1));
        }
      }
    }
    c.above("eps", eps, 0.0);
  }
};

// Adam's and AdamW's state: step, exp_avg, exp_avg_sq (and max_exp_avg_sq with amsgrad).
template <class TorchOptimizer, class TorchOptions, class State>
class AdamFamily final : public TorchOptimizerBase<TorchOptimizer, TorchOptions> {
  using Base = TorchOptimizerBase<TorchOptimizer, TorchOptions>;

 public:
  AdamFamily(ParamGroups params, const config::OptimConfig& cfg, const AdamOptions& o)
      : Base(std::move(params), TorchOptions(cfg.lr)
                                    .betas({o.betas[0], o.betas[1]})
                                    .eps(o.eps)
                                    .weight_decay(cfg.weight_decay)) {}

  NamedTensors state() const override {
    NamedTensors out;
    for (const auto& [name, p] : this->params_) {
      const auto* s = this->template state_of<State>(p);
      if (!s) continue;
      out.emplace_back(name + ".step", torch::tensor(s->step(), torch::kInt64));
      out.emplace_back(name + ".exp_avg", s->exp_avg());
      out.emplace_back(name + ".exp_avg_sq", s->exp_avg_sq());
      if (s->max_exp_avg_sq().defined()) {
        out.emplace_back(name + ".max_exp_avg_sq", s->max_exp_avg_sq());
      }
    }
    return out;
  }

  void load_state(const std::map<std::string, torch::Tensor>& state) override {
    this->clear_state();
    for (const auto& [name, p] : this->params_) {
      auto exp_avg = state_tensor(state, name + ".exp_avg", p);
      if (!exp_avg.defined()) continue;  // never stepped
      auto exp_avg_sq = state_tensor(state, name + ".exp_avg_sq", p);
      const auto step = state_tensor(state, name + ".step", {});
      if (!exp_avg_sq.defined() || !step.defined()) {
        throw std::runtime_error("optimizer state " + name +
                                 (step.defined() ? ".exp_avg_sq" : ".step") + " is missing");
      }
      auto s = std::make_unique<State>();
      s->step(step.template item<int64_t>()).exp_avg(exp_avg).exp_avg_sq(exp_avg_sq);
      s->max_exp_avg_sq(state_tensor(state, name + ".max_exp_avg_sq", p));
      this->set_state(p, std::move(s));
    }
  }

  int state_copies() const override { return 2; }
};

using Adam =
    AdamFamily<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>;
using AdamW =
    AdamFamily<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>;

}  // namespace

void register_adam(OptimizerRegistry& registry) {
  registry.add(
      "adam",
      [](ParamGroups params, const config::OptimConfig& cfg) -> std::unique_ptr<Optimizer> {
        return std::make_unique<Adam>(std::move(params), cfg, cfg.own<AdamOptions>());
      },
      config::options_of<AdamOptions>());
  registry.add(
      "adamw",
      [](ParamGroups params, const config::OptimConfig& cfg) -> std::unique_ptr<Optimizer> {
        return std::make_unique<AdamW>(std::move(params), cfg, cfg.own<AdamOptions>());
      },
      config::options_of<AdamOptions>());
}

}  // namespace trainer::optim
