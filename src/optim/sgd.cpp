// sgd: stochastic gradient descent with momentum (torch.optim.SGD's update).
#include <torch/torch.h>

#include "optim/torch_optimizer.h"
#include "util/format.h"

namespace trainer::optim {
namespace {

// The `optim.` keys of sgd.
struct SgdOptions {
  double momentum = 0.9;  // momentum factor; 0 = none
  bool nesterov = false;  // Nesterov momentum

  template <class V>
  void visit(V& v) {
    v("momentum", momentum);
    v("nesterov", nesterov);
  }
  void validate(config::Checks& c) const {
    c.fraction("momentum", momentum);
    if (nesterov && !(momentum > 0.0)) {
      c.add("nesterov", "Nesterov momentum needs optim.momentum > 0, got momentum " +
                            format_number(momentum) + "; set a momentum or nesterov: false");
    }
  }
};

class Sgd final : public TorchOptimizerBase<torch::optim::SGD, torch::optim::SGDOptions> {
 public:
  Sgd(ParamGroups params, const config::OptimConfig& cfg, const SgdOptions& o)
      : TorchOptimizerBase(std::move(params), torch::optim::SGDOptions(cfg.lr)
                                                  .momentum(o.momentum)
                                                  .nesterov(o.nesterov)
                                                  .weight_decay(cfg.weight_decay)),
        momentum_(o.momentum > 0.0) {}

  NamedTensors state() const override {
    NamedTensors out;
    for (const auto& [name, p] : params_) {
      const auto* s = state_of<torch::optim::SGDParamState>(p);
      if (s && s->momentum_buffer().defined()) {
        out.emplace_back(name + ".momentum_buffer", s->momentum_buffer());
      }
    }
    return out;
  }

  void load_state(const std::map<std::string, torch::Tensor>& state) override {
    clear_state();
    for (const auto& [name, p] : params_) {
      auto buffer = state_tensor(state, name + ".momentum_buffer", p);
      if (!buffer.defined()) continue;  // no momentum, or never stepped
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(buffer);
      set_state(p, std::move(s));
    }
  }

  int state_copies() const override { return momentum_ ? 1 : 0; }

 private:
  bool momentum_;
};

}  // namespace

void register_sgd(OptimizerRegistry& registry) {
  const auto make = [](ParamGroups params, const config::OptimConfig& cfg) {
    return std::unique_ptr<Optimizer>(new Sgd(std::move(params), cfg, cfg.own<SgdOptions>()));
  };
  registry.add("sgd", make, config::options_of<SgdOptions>());
}

}  // namespace trainer::optim
