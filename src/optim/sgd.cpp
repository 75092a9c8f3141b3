// sgd: stochastic gradient descent with momentum, torch.optim.SGD's update (dampening 0).
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_fused_sgd.h>
#include <torch/torch.h>

#include <algorithm>

#include "optim/optimizer.h"
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

class Sgd final : public Optimizer {
 public:
  Sgd(ParamGroups params, const config::OptimConfig& cfg, Impl impl)
      : Optimizer(std::move(params), cfg.weight_decay, impl), o_(cfg.own<SgdOptions>()) {
    buffers_.resize(params_.size());
  }

  void step(double lr, const KernelInputs& device) override {
    for (const auto& group : groups_) {
      const auto members = with_grad(group);
      if (members.empty()) continue;
      if (impl_ == Impl::fused) {
        fused_step(members, group.weight_decay, lr, device);
      } else if (impl_ == Impl::foreach) {
        foreach_step(members, group.weight_decay, lr);
      } else {
        for (size_t i : members) loop_step(i, group.weight_decay, lr);
      }
    }
  }

  NamedTensors state() const override {
    NamedTensors out;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (buffers_[i].defined()) out.emplace_back(names_[i] + ".momentum_buffer", buffers_[i]);
    }
    return out;
  }

  void load_state(const std::map<std::string, torch::Tensor>& state) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      buffers_[i] = state_tensor(state, names_[i] + ".momentum_buffer", params_[i]);
    }
  }

  int state_copies() const override { return o_.momentum > 0.0 ? 1 : 0; }

  // momentum * 0 + g is g: a zero buffer steps as the first step's copy of g does.
  void prepare_state() override {
    if (o_.momentum == 0.0) return;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!buffers_[i].defined()) buffers_[i] = torch::zeros_like(params_[i]);
    }
  }

 private:
  // torch.optim.SGD's single-tensor update of parameter i.
  void loop_step(size_t i, double weight_decay, double lr) {
    torch::NoGradGuard no_grad;
    auto& p = params_[i];
    torch::Tensor g = p.grad();
    if (weight_decay != 0.0) g = g.add(p, weight_decay);
    if (o_.momentum != 0.0) {
      auto& buf = buffers_[i];
      if (!buf.defined()) {
        buf = g.detach().clone();
      } else {
        buf.mul_(o_.momentum).add_(g);
      }
      g = o_.nesterov ? g.add(buf, o_.momentum) : buf;
    }
    p.add_(g, -lr);
  }

  // torch.optim.SGD(foreach=True)'s update.
  void foreach_step(const std::vector<size_t>& members, double weight_decay, double lr) {
    torch::NoGradGuard no_grad;
    const auto params = pick(params_, members);
    auto g = grads(members);
    if (weight_decay != 0.0) g = at::_foreach_add(g, params, weight_decay);
    if (o_.momentum != 0.0) {
      const auto bufs = momentum_buffers(members, g);
      // Nesterov: g + momentum * buf, into a copy while g is still the parameters' .grad.
      if (!o_.nesterov) {
        g = bufs;
      } else if (weight_decay == 0.0) {
        g = at::_foreach_add(g, bufs, o_.momentum);
      } else {
        at::_foreach_add_(g, bufs, o_.momentum);
      }
    }
    at::_foreach_add_(params, g, -lr);
  }

  // The members' buffers after this step's momentum update: momentum * buf + g, or g itself for
  // a member without a buffer yet.
  std::vector<torch::Tensor> momentum_buffers(const std::vector<size_t>& members,
                                              const std::vector<torch::Tensor>& g) {
    auto bufs = pick(buffers_, members);
    const bool all =
        std::all_of(bufs.begin(), bufs.end(), [](const auto& b) { return b.defined(); });
    if (all) {
      at::_foreach_mul_(bufs, o_.momentum);
      at::_foreach_add_(bufs, g);
      return bufs;
    }
    for (size_t k = 0; k < members.size(); ++k) {
      if (bufs[k].defined()) {
        bufs[k].mul_(o_.momentum).add_(g[k]);
      } else {
        bufs[k] = buffers_[members[k]] = g[k].detach().clone();
      }
    }
    return bufs;
  }

  // at::_fused_sgd_: one kernel for every member. With momentum, members without a buffer yet
  // start theirs from the gradient (is_first_step) in a call of their own.
  void fused_step(const std::vector<size_t>& members, double weight_decay, double lr,
                  const KernelInputs& device) {
    if (o_.momentum == 0.0) {
      fused_call(members, {}, weight_decay, lr, /*first=*/false, device);
      return;
    }
    std::vector<size_t> fresh, stepped;
    for (size_t i : members) (buffers_[i].defined() ? stepped : fresh).push_back(i);
    if (device.found_inf.defined()) {
      // The device may skip this step: a zero buffer stepped as any other starts from the
      // gradient as is_first_step does (dampening 0) and stays zero when the step is skipped.
      for (size_t i : fresh) buffers_[i] = torch::zeros_like(params_[i]);
      stepped.insert(stepped.end(), fresh.begin(), fresh.end());
      std::sort(stepped.begin(), stepped.end());
      fresh.clear();
    }
    for (size_t i : fresh) buffers_[i] = torch::empty_like(params_[i]);
    if (!fresh.empty()) {
      fused_call(fresh, pick(buffers_, fresh), weight_decay, lr, /*first=*/true, device);
    }
    if (!stepped.empty()) {
      fused_call(stepped, pick(buffers_, stepped), weight_decay, lr, /*first=*/false, device);
    }
  }

  void fused_call(const std::vector<size_t>& members, const std::vector<torch::Tensor>& bufs,
                  double weight_decay, double lr, bool first, const KernelInputs& device) {
    const auto params = pick(params_, members), g = grads(members);
    const auto scale = maybe(device.grad_scale), found_inf = maybe(device.found_inf);
    if (device.lr.defined()) {  // read on the device (the tensor_lr overload)
      at::_fused_sgd_(params, g, bufs, weight_decay, o_.momentum, device.lr, /*dampening=*/0.0,
                      o_.nesterov, /*maximize=*/false, /*is_first_step=*/first, scale, found_inf);
    } else {
      at::_fused_sgd_(params, g, bufs, weight_decay, o_.momentum, lr, /*dampening=*/0.0,
                      o_.nesterov, /*maximize=*/false, /*is_first_step=*/first, scale, found_inf);
    }
  }

  SgdOptions o_;
  std::vector<torch::Tensor>
      buffers_;  // momentum buffers; undefined before a parameter's first step
};

}  // namespace

void register_sgd(OptimizerRegistry& registry) {
  const auto make = [](ParamGroups params, const config::OptimConfig& cfg,
                       Impl impl) -> std::unique_ptr<Optimizer> {
    return std::make_unique<Sgd>(std::move(params), cfg, impl);
  };
  registry.add("sgd", make, config::options_of<SgdOptions>());
}

}  // namespace trainer::optim
