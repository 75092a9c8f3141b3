// adam and adamw: Adam with L2 weight decay (torch.optim.Adam) or decoupled weight decay
// (torch.optim.AdamW).
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_maximum.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <torch/torch.h>

#include <cmath>

#include "optim/optimizer.h"
#include "util/device.h"
#include "util/format.h"

namespace trainer::optim {
namespace {

// The `optim.` keys of adam and adamw.
struct AdamOptions {
  std::vector<double> betas = {0.9, 0.999};  // moment decay rates
  double eps = 1e-8;                         // denominator epsilon
  bool amsgrad = false;                      // keep the maximum of the second moments (AMSGrad)

  template <class V>
  void visit(V& v) {
    v("betas", betas);
    v("eps", eps);
    v("amsgrad", amsgrad);
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

class Adam final : public Optimizer {
 public:
  // `decoupled`: AdamW's weight decay (p *= 1 - lr * wd) instead of Adam's L2 term.
  Adam(ParamGroups params, const config::OptimConfig& cfg, Impl impl, bool decoupled)
      : Optimizer(std::move(params), cfg.weight_decay, impl),
        o_(cfg.own<AdamOptions>()),
        decoupled_(decoupled) {
    const size_t n = params_.size();
    exp_avg_.resize(n);
    exp_avg_sq_.resize(n);
    max_exp_avg_sq_.resize(n);
    steps_.assign(n, 0);
    device_steps_.resize(n);
  }

  void step(double lr, const KernelInputs& device) override {
    torch::NoGradGuard no_grad;
    if (impl_ == Impl::fused) return fused_steps(lr, device);
    for (const auto& group : groups_) {
      const auto members = with_grad(group);
      if (members.empty()) continue;
      for (size_t i : members) init_state(i);
      if (impl_ == Impl::foreach) {
        foreach_step(members, group.weight_decay, lr);
      } else {
        for (size_t i : members) loop_step(i, group.weight_decay, lr);
      }
    }
  }

  NamedTensors state() const override {
    const auto steps = host_steps();
    NamedTensors out;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!exp_avg_[i].defined()) continue;
      out.emplace_back(names_[i] + ".step", torch::tensor(steps[i], torch::kInt64));
      out.emplace_back(names_[i] + ".exp_avg", exp_avg_[i]);
      out.emplace_back(names_[i] + ".exp_avg_sq", exp_avg_sq_[i]);
      if (o_.amsgrad) out.emplace_back(names_[i] + ".max_exp_avg_sq", max_exp_avg_sq_[i]);
    }
    return out;
  }

  void load_state(const std::map<std::string, torch::Tensor>& state) override;

  int state_copies() const override { return o_.amsgrad ? 3 : 2; }

  void prepare_state() override {
    for (size_t i = 0; i < params_.size(); ++i) init_state(i);
  }

 private:
  // Zero moments and step 0 for a parameter's first step.
  void init_state(size_t i) {
    if (exp_avg_[i].defined()) return;
    exp_avg_[i] = torch::zeros_like(params_[i]);
    exp_avg_sq_[i] = torch::zeros_like(params_[i]);
    if (o_.amsgrad) max_exp_avg_sq_[i] = torch::zeros_like(params_[i]);
    steps_[i] = 0;
    if (impl_ == Impl::fused) {
      device_steps_[i] = torch::zeros({}, params_[i].options().dtype(torch::kFloat));
    }
  }

  // Every parameter's step count; the fused steps live on the device (one read for all).
  std::vector<int64_t> host_steps() const;

  // torch.optim.Adam's single-tensor update of parameter i.
  void loop_step(size_t i, double weight_decay, double lr) {
    auto& p = params_[i];
    torch::Tensor g = p.grad();
    const double beta1 = o_.betas[0], beta2 = o_.betas[1];
    const auto step = static_cast<double>(++steps_[i]);
    if (weight_decay != 0.0) {
      if (decoupled_) {
        p.mul_(1.0 - lr * weight_decay);
      } else {
        g = g.add(p, weight_decay);
      }
    }
    exp_avg_[i].lerp_(g, 1.0 - beta1);
    exp_avg_sq_[i].mul_(beta2).addcmul_(g, g, 1.0 - beta2);
    const double step_size = lr / (1.0 - std::pow(beta1, step));
    const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(beta2, step));
    torch::Tensor second = exp_avg_sq_[i];
    if (o_.amsgrad) second = torch::maximum_out(max_exp_avg_sq_[i], max_exp_avg_sq_[i], second);
    const auto denom = (second.sqrt() / bias_correction2_sqrt).add_(o_.eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
  }

  // torch.optim.Adam(foreach=True)'s update.
  void foreach_step(const std::vector<size_t>& members, double weight_decay, double lr) {
    const double beta1 = o_.betas[0], beta2 = o_.betas[1];
    const auto params = pick(params_, members);
    const auto exp_avgs = pick(exp_avg_, members);
    const auto exp_avg_sqs = pick(exp_avg_sq_, members);
    auto g = grads(members);
    if (weight_decay != 0.0) {
      if (decoupled_) {
        at::_foreach_mul_(params, 1.0 - lr * weight_decay);
      } else {
        g = at::_foreach_add(g, params, weight_decay);
      }
    }
    at::_foreach_lerp_(exp_avgs, g, 1.0 - beta1);
    at::_foreach_mul_(exp_avg_sqs, beta2);
    at::_foreach_addcmul_(exp_avg_sqs, g, g, 1.0 - beta2);
    std::vector<at::Scalar> step_size, bias_correction2_sqrt;
    for (size_t i : members) {
      const auto step = static_cast<double>(++steps_[i]);
      step_size.emplace_back(lr / (1.0 - std::pow(beta1, step)) * -1.0);
      bias_correction2_sqrt.emplace_back(std::sqrt(1.0 - std::pow(beta2, step)));
    }
    std::vector<torch::Tensor> denom;
    if (o_.amsgrad) {
      const auto max_sqs = pick(max_exp_avg_sq_, members);
      at::_foreach_maximum_(max_sqs, exp_avg_sqs);
      denom = at::_foreach_sqrt(max_sqs);
    } else {
      denom = at::_foreach_sqrt(exp_avg_sqs);
    }
    at::_foreach_div_(denom, bias_correction2_sqrt);
    at::_foreach_add_(denom, o_.eps);
    at::_foreach_addcdiv_(params, exp_avgs, denom, step_size);
  }

  // at::_fused_adam(w)_: one kernel per group, the step counts on the device, counted for every
  // group at once (skipped steps, found_inf, leave them as they were).
  void fused_steps(double lr, const KernelInputs& device) {
    std::vector<std::vector<size_t>> members;
    std::vector<size_t> all;
    for (const auto& group : groups_) {
      members.push_back(with_grad(group));
      for (size_t i : members.back()) {
        init_state(i);
        all.push_back(i);
      }
    }
    if (all.empty()) return;
    const auto steps = pick(device_steps_, all);
    at::_foreach_add_(steps, 1.0);
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (!members[g].empty()) fused_call(members[g], groups_[g].weight_decay, lr, device);
    }
    const auto found_inf = maybe(device.found_inf);
    if (found_inf) at::_foreach_sub_(steps, std::vector<torch::Tensor>(steps.size(), *found_inf));
    for (size_t i : all) ++steps_[i];
  }

  void fused_call(const std::vector<size_t>& members, double weight_decay, double lr,
                  const KernelInputs& device) {
    const auto steps = pick(device_steps_, members);
    const auto params = pick(params_, members), g = grads(members);
    const auto m = pick(exp_avg_, members), v = pick(exp_avg_sq_, members);
    const auto vmax = o_.amsgrad ? pick(max_exp_avg_sq_, members) : std::vector<torch::Tensor>{};
    const auto scale = maybe(device.grad_scale), found_inf = maybe(device.found_inf);
    // The learning rate as a double, or as a device tensor (the kernels' tensor_lr overloads).
    const auto kernel = [&](const auto& rate) {
      if (decoupled_) {
        at::_fused_adamw_(params, g, m, v, vmax, steps, rate, o_.betas[0], o_.betas[1],
                          weight_decay, o_.eps, o_.amsgrad, /*maximize=*/false, scale, found_inf);
      } else {
        at::_fused_adam_(params, g, m, v, vmax, steps, rate, o_.betas[0], o_.betas[1], weight_decay,
                         o_.eps, o_.amsgrad, /*maximize=*/false, scale, found_inf);
      }
    };
    if (device.lr.defined()) {
      kernel(device.lr);
    } else {
      kernel(lr);
    }
  }

  AdamOptions o_;
  bool decoupled_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_, max_exp_avg_sq_;  // undefined before step 1
  std::vector<int64_t> steps_;               // each parameter's steps (loop, foreach)
  std::vector<torch::Tensor> device_steps_;  // fused: float32 device scalars the kernel reads
};

std::vector<int64_t> Adam::host_steps() const {
  if (impl_ != Impl::fused) return steps_;
  std::vector<torch::Tensor> defined;
  for (const auto& s : device_steps_) {
    if (s.defined()) defined.push_back(s.reshape({1}));
  }
  if (defined.empty()) return steps_;
  const auto host = read_to_host(torch::cat(defined).to(torch::kDouble));
  const auto* v = host.data_ptr<double>();
  std::vector<int64_t> out(params_.size(), 0);
  for (size_t i = 0, k = 0; i < params_.size(); ++i) {
    if (device_steps_[i].defined()) out[i] = std::llround(v[k++]);
  }
  return out;
}

void Adam::load_state(const std::map<std::string, torch::Tensor>& state) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& name = names_[i];
    const auto& p = params_[i];
    exp_avg_[i] = state_tensor(state, name + ".exp_avg", p);
    steps_[i] = 0;
    device_steps_[i] = torch::Tensor();
    if (!exp_avg_[i].defined()) continue;  // never stepped
    exp_avg_sq_[i] = state_tensor(state, name + ".exp_avg_sq", p);
    const auto step = state_tensor(state, name + ".step", {});
    if (!exp_avg_sq_[i].defined() || !step.defined()) {
      throw std::runtime_error("optimizer state " + name +
                               (step.defined() ? ".exp_avg_sq" : ".step") + " is missing");
    }
    steps_[i] = step.to(torch::kLong).item<int64_t>();
    max_exp_avg_sq_[i] = state_tensor(state, name + ".max_exp_avg_sq", p);
    if (o_.amsgrad && !max_exp_avg_sq_[i].defined()) max_exp_avg_sq_[i] = exp_avg_sq_[i].clone();
    if (impl_ == Impl::fused) {
      device_steps_[i] =
          torch::full({}, static_cast<double>(steps_[i]), p.options().dtype(torch::kFloat));
    }
  }
}

}  // namespace

void register_adam(OptimizerRegistry& registry) {
  for (const bool decoupled : {false, true}) {
    const auto make = [decoupled](ParamGroups params, const config::OptimConfig& cfg,
                                  Impl impl) -> std::unique_ptr<Optimizer> {
      return std::make_unique<Adam>(std::move(params), cfg, impl, decoupled);
    };
    registry.add(decoupled ? "adamw" : "adam", make, config::options_of<AdamOptions>());
  }
}

}  // namespace trainer::optim
