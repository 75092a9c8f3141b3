#include "engine/persist/sharded_state.h"

#include <torch/torch.h>

#include <set>

namespace trainer::engine {

std::map<std::string, std::vector<std::string>> parameter_names(const torch::nn::Module& model) {
  std::map<const void*, std::string> canonical;
  for (const auto& [name, p] : models::unique_named_parameters(model)) {
    canonical.emplace(p.unsafeGetTensorImpl(), name);
  }
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [name, t] : models::state_dict(model)) {
    const auto it = canonical.find(t.unsafeGetTensorImpl());
    if (it != canonical.end()) out[it->second].push_back(name);
  }
  return out;
}

std::set<std::string> parameter_entries(const torch::nn::Module& model) {
  std::set<std::string> out;
  for (const auto& [canonical, names] : parameter_names(model))
    out.insert(names.begin(), names.end());
  return out;
}

std::vector<checkpoint::ShardPiece> sharded_pieces(const Components& parts,
                                                   const std::string& model_prefix,
                                                   const std::string& optim_prefix) {
  const auto& fsdp = *parts.fsdp;
  const auto names = parameter_names(*parts.model);
  std::vector<checkpoint::ShardPiece> out;
  for (const auto& piece : fsdp.parameter_pieces()) {
    for (const auto& name : names.at(piece.name)) {
      out.push_back({model_prefix + name, piece.shape, piece.offset, piece.data});
    }
  }
  std::map<std::string, size_t> view_of;
  for (size_t v = 0; v < fsdp.views().size(); ++v) view_of[fsdp.views()[v].name] = v;
  for (const auto& [key, tensor] : parts.optimizer->state()) {
    const auto dot = key.rfind('.');
    const auto it = view_of.find(key.substr(0, dot));
    if (dot == std::string::npos || it == view_of.end()) continue;
    for (auto& piece : fsdp.view_pieces(it->second, tensor, key.substr(dot + 1))) {
      out.push_back({optim_prefix + piece.name, piece.shape, piece.offset, piece.data});
    }
  }
  return out;
}

std::string load_sharded_weights(Components& parts, const checkpoint::NamedTensors& weights) {
  std::map<std::string, torch::Tensor> by_name(weights.begin(), weights.end());
  auto& model = *parts.model;
  std::string problems;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> buffers;  // model's, checkpoint's
  const auto params_named = parameter_entries(model);
  for (const auto& [name, t] : models::state_dict(model)) {
    if (params_named.count(name)) continue;
    const auto it = by_name.find(name);
    if (it == by_name.end() || it->second.sizes() != t.sizes()) {
      problems += (problems.empty() ? "" : ", ") + name +
                  (it == by_name.end() ? " missing" : " of another shape");
      continue;
    }
    buffers.emplace_back(t, it->second);
  }
  const std::string params = parts.fsdp->load_parameters([&](const std::string& name) {
    const auto it = by_name.find(name);
    return it == by_name.end() ? torch::Tensor() : it->second;
  });
  if (!params.empty()) problems += (problems.empty() ? "" : ", ") + params;
  if (!problems.empty()) return problems;
  torch::NoGradGuard no_grad;
  for (auto& [mine, theirs] : buffers) mine.copy_(theirs);
  return "";
}

std::map<std::string, torch::Tensor> sharded_optimizer_state(
    const Components& parts, const std::map<std::string, torch::Tensor>& state) {
  const auto& fsdp = *parts.fsdp;
  std::map<std::string, std::set<std::string>> fields;  // parameter -> its fields
  for (const auto& [key, tensor] : state) {
    const auto dot = key.rfind('.');
    if (dot != std::string::npos) fields[key.substr(0, dot)].insert(key.substr(dot + 1));
  }
  std::map<std::string, torch::Tensor> out;
  for (size_t v = 0; v < fsdp.views().size(); ++v) {
    const auto params = fsdp.view_parameters(v);
    const auto it = fields.find(params.front());
    if (it == fields.end()) continue;  // no state: starts afresh
    for (const auto& field : it->second) {
      const torch::Tensor& first = state.at(params.front() + "." + field);
      const std::string key = fsdp.views()[v].name + "." + field;
      if (first.dim() == 0) {
        out[key] = first;
        continue;
      }
      auto whole = fsdp.view_from_full(v, [&](const std::string& name) {
        const auto found = state.find(name + "." + field);
        return found == state.end() ? torch::Tensor() : found->second;
      });
      if (whole.defined()) out[key] = whole;
    }
  }
  return out;
}

}  // namespace trainer::engine
