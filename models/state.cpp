// Model weights by name: the state dict and loading one into a model.
#include <torch/torch.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "models/model.h"

namespace trainer::models {
namespace {

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

// "a, b, c" (at most `limit` names, then "and N more").
std::string list(const std::vector<std::string>& names, size_t limit = 6) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += " and " + std::to_string(names.size() - limit) + " more";
  return out;
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> state_dict(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    out.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), b.value());
  return out;
}

std::string head_prefix(const torch::nn::Module& module) {
  const auto params = module.named_parameters(/*recurse=*/true);
  if (params.size() == 0) return "";
  const std::string last = params.keys().back();
  return last.substr(0, last.rfind('.') + 1);
}

namespace {

// "a and b" for the names that share one tensor in `own` but whose values in `weights` differ.
std::string differing_tied_names(
    const std::vector<std::pair<std::string, torch::Tensor>>& own,
    const std::vector<std::pair<std::string, torch::Tensor>>& weights) {
  std::map<std::string, torch::Tensor> given(weights.begin(), weights.end());
  std::map<const void*, std::string> first;  // a tensor's first name in `own`
  std::vector<std::string> differ;
  for (const auto& [name, tensor] : own) {
    const auto [it, fresh] = first.emplace(tensor.unsafeGetTensorImpl(), name);
    if (fresh) continue;
    const auto ga = given.find(it->second), gb = given.find(name);
    if (ga == given.end() || gb == given.end()) continue;  // a skipped head keeps its values
    const auto& a = ga->second;
    const auto& b = gb->second;
    if (a.sizes() != b.sizes() || !torch::equal(a, b.to(a.device(), a.scalar_type()))) {
      differ.push_back(it->second + " and " + name);
    }
  }
  std::string out;
  for (const auto& d : differ) out += (out.empty() ? "" : ", ") + d;
  return out;
}

}  // namespace

std::string load_weights(torch::nn::Module& module,
                         const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                         bool skip_head, const std::string& untie_hint,
                         std::vector<std::string>* kept_initial) {
  const auto own = state_dict(module);
  const std::string head = skip_head ? head_prefix(module) : "";
  auto in_head = [&](const std::string& name) {
    return !head.empty() && name.compare(0, head.size(), head) == 0;
  };
  std::map<std::string, torch::Tensor> given(weights.begin(), weights.end());
  std::vector<std::string> missing, unexpected, mismatched;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (destination, source)
  std::set<const void*> reported;  // a tensor given under two names (a tied one) reported once
  for (const auto& [name, tensor] : own) {
    auto it = given.find(name);
    if (it == given.end()) {
      if (!in_head(name)) missing.push_back(name);
      if (in_head(name) && kept_initial) kept_initial->push_back(name);
      continue;
    }
    if (it->second.sizes() != tensor.sizes()) {
      if (!in_head(name) && reported.insert(it->second.unsafeGetTensorImpl()).second) {
        mismatched.push_back(name + " " + shape_of(it->second) + " in the file, " +
                             shape_of(tensor) + " in the model");
      }
      if (in_head(name) && kept_initial) kept_initial->push_back(name);
    } else {
      copies.emplace_back(tensor, it->second);
    }
    given.erase(it);
  }
  std::set<std::string> own_names;
  for (const auto& [name, tensor] : own) own_names.insert(name);
  for (const auto& [name, tensor] : given) {
    // A zero bias of a layer the model has without one (a model.bias: false gpt exported to
    // Hugging Face's layout, which has every bias) changes nothing: left out.
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (bias && own_names.count(name.substr(0, name.size() - 5) + ".weight") &&
        !tensor.ne(0).any().item<bool>()) {
      continue;
    }
    unexpected.push_back(name);
  }
  std::string problems;
  auto add = [&](const std::string& what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    problems += (problems.empty() ? "" : "; ") + std::to_string(names.size()) + " " + what + ": " +
                list(names);
  };
  add("missing", missing);
  add("unexpected", unexpected);
  add("with other shapes", mismatched);
  if (!problems.empty()) return problems;
  const std::string tied = differing_tied_names(own, weights);
  if (!tied.empty()) {
    return tied + ": one tensor in the model (tied), two different ones in the file" +
           (untie_hint.empty() ? "" : "; " + untie_hint);
  }
  torch::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.copy_(src);
  return "";
}

}  // namespace trainer::models
