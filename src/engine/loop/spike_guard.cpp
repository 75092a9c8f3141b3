#include "engine/loop/spike_guard.h"

#include <torch/torch.h>

#include <map>

namespace trainer::engine {

ZScoreWindow::ZScoreWindow(int64_t window, torch::Device device)
    : size_(window),
      values_(torch::zeros({window}, torch::TensorOptions(torch::kDouble).device(device))),
      count_(torch::zeros({}, torch::TensorOptions(torch::kLong).device(device))) {}

torch::Tensor ZScoreWindow::spike(const torch::Tensor& value, double limit, torch::Tensor& z) {
  torch::NoGradGuard no_grad;
  const auto x = value.detach().to(torch::kDouble);                        // []
  const auto n = count_.clamp_max(size_).clamp_min(1).to(torch::kDouble);  // values held
  const auto mean = values_.sum() / n;
  const auto spread = (values_.square().sum() / n - mean.square()).clamp_min(0.0).sqrt();
  const auto finite = x.isfinite();
  const auto scored = count_.ge(size_).logical_and(spread.gt(0.0)).logical_and(finite);
  z = torch::where(scored, (x - mean) / spread, torch::zeros_like(x));
  const auto out = z.gt(limit).to(torch::kFloat);
  values_.scatter_(0, count_.remainder(size_).view({1}), torch::where(finite, x, mean).view({1}));
  count_.add_(1);
  return out;
}

checkpoint::NamedTensors ZScoreWindow::tensors(const std::string& prefix) const {
  return {{prefix + "values", values_}, {prefix + "count", count_}};
}

void ZScoreWindow::restore(const std::map<std::string, torch::Tensor>& saved,
                           const std::string& prefix, const std::string& path) {
  torch::NoGradGuard no_grad;
  for (auto [name, mine] :
       {std::pair<const char*, torch::Tensor*>{"values", &values_}, {"count", &count_}}) {
    const auto it = saved.find(prefix + name);
    if (it == saved.end() || it->second.sizes() != mine->sizes()) {
      throw checkpoint::CorruptCheckpoint(
          path + ": its guard." + prefix + name +
          " is missing or of another shape (train.skip_update_zscore.window changed?); resume "
          "with the window it was written with");
    }
    mine->copy_(it->second);
  }
}

SpikeGuard::SpikeGuard(const config::ZScoreConfig& cfg, torch::Device device)
    : cfg_(cfg), loss_(cfg.window, device), grad_norm_(cfg.window, device) {}

torch::Tensor SpikeGuard::check(const torch::Tensor& loss, const torch::Tensor& grad_norm,
                                torch::Tensor& z) {
  torch::Tensor z_loss = torch::zeros({}, loss.options().dtype(torch::kDouble));
  torch::Tensor z_norm = z_loss;
  torch::Tensor spike = torch::zeros({}, loss.options().dtype(torch::kFloat));
  if (cfg_.loss > 0.0) spike = loss_.spike(loss, cfg_.loss, z_loss);
  if (cfg_.grad_norm > 0.0 && grad_norm.defined()) {
    spike = torch::maximum(spike, grad_norm_.spike(grad_norm, cfg_.grad_norm, z_norm));
  }
  z = torch::stack({z_loss, z_norm}).to(torch::kFloat);
  return spike;
}

checkpoint::NamedTensors SpikeGuard::tensors() const {
  auto out = loss_.tensors("loss.");
  for (auto& t : grad_norm_.tensors("grad_norm.")) out.push_back(std::move(t));
  return out;
}

void SpikeGuard::restore(const checkpoint::NamedTensors& saved, const std::string& path) {
  if (saved.empty()) return;  // written without the guard: its windows fill afresh
  const std::map<std::string, torch::Tensor> by_name(saved.begin(), saved.end());
  loss_.restore(by_name, "loss.", path);
  grad_norm_.restore(by_name, "grad_norm.", path);
}

}  // namespace trainer::engine
