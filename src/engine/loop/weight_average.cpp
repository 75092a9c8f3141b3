#include "engine/loop/weight_average.h"

#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_lerp.h>
#include <torch/torch.h>

#include <cmath>
#include <map>

#include "engine/persist/sharded_state.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

constexpr const char* kSuffix = "ema";  // fsdp's piece names: "<parameter>.ema"

}  // namespace

WeightAverage::WeightAverage(const config::EmaConfig& cfg, Components& parts)
    : cfg_(cfg), parts_(parts) {
  torch::NoGradGuard no_grad;
  for (const auto& p : parts.params) average_.push_back(p.detach().clone());
  if (parts.fsdp) return;                                     // named by fsdp's pieces
  std::map<const void*, std::vector<std::string>> by_tensor;  // a tied one under each name
  for (const auto& [name, t] : models::state_dict(*parts.model)) {
    by_tensor[t.unsafeGetTensorImpl()].push_back(name);
  }
  for (const auto& p : parts.params) names_.push_back(by_tensor.at(p.unsafeGetTensorImpl()));
}

double WeightAverage::decay_at(const config::EmaConfig& cfg, int64_t step) {
  const int64_t n = step - 1;  // updates before this one
  if (n <= 0) return 0.0;
  if (!cfg.warmup) return cfg.decay;
  const double warm = 1.0 - std::pow(1.0 + static_cast<double>(n), -2.0 / 3.0);
  return std::max(std::min(warm, cfg.decay), 0.0);
}

void WeightAverage::update(int64_t step) {
  if (step % cfg_.every != 0) return;
  torch::NoGradGuard no_grad;
  at::_foreach_lerp_(average_, parts_.params, 1.0 - decay_at(cfg_, step));
}

WeightAverage::Swapped::Swapped(WeightAverage& average) : average_(average) {
  torch::NoGradGuard no_grad;
  for (const auto& p : average.parts_.params) kept_.push_back(p.detach().clone());
  at::_foreach_copy_(average.parts_.params, average.average_);
}

WeightAverage::Swapped::~Swapped() {
  torch::NoGradGuard no_grad;
  at::_foreach_copy_(average_.parts_.params, kept_);
}

checkpoint::NamedTensors WeightAverage::tensors() const {
  checkpoint::NamedTensors out;
  if (parts_.fsdp) return out;
  for (size_t i = 0; i < average_.size(); ++i) {
    for (const auto& name : names_[i]) out.emplace_back(name, average_[i]);
  }
  return out;
}

std::vector<checkpoint::ShardPiece> WeightAverage::pieces() const {
  std::vector<checkpoint::ShardPiece> out;
  if (!parts_.fsdp) return out;
  const auto aliases = parameter_names(*parts_.model);
  const std::string suffix = std::string(".") + kSuffix;
  for (size_t v = 0; v < average_.size(); ++v) {
    for (auto& piece : parts_.fsdp->view_pieces(v, average_[v], kSuffix)) {
      const std::string canonical = piece.name.substr(0, piece.name.size() - suffix.size());
      for (const auto& name : aliases.at(canonical)) {
        out.push_back({name, piece.shape, piece.offset, piece.data});
      }
    }
  }
  return out;
}

void WeightAverage::restore(const checkpoint::NamedTensors& saved, const std::string& path) {
  torch::NoGradGuard no_grad;
  if (saved.empty()) {
    log::info("the checkpoint " + path + " holds no train.ema average; it starts from the weights");
    at::_foreach_copy_(average_, parts_.params);
    return;
  }
  const std::map<std::string, torch::Tensor> by_name(saved.begin(), saved.end());
  const auto find = [&](const std::string& name) {
    const auto it = by_name.find(name);
    return it == by_name.end() ? torch::Tensor() : it->second;
  };
  for (size_t i = 0; i < average_.size(); ++i) {
    const std::string what = parts_.fsdp ? parts_.fsdp->views()[i].name : names_[i].front();
    const torch::Tensor whole =
        parts_.fsdp ? parts_.fsdp->view_from_full(i, find) : find(names_[i].front());
    if (!whole.defined() || whole.numel() != average_[i].numel()) {
      throw checkpoint::CorruptCheckpoint(path + ": its ema." + what +
                                          " is missing or of another shape");
    }
    average_[i].copy_(whole.reshape(average_[i].sizes()));
  }
}

}  // namespace trainer::engine
