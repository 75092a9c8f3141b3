#include "engine/persist/tensor_parallel_state.h"

#include <torch/torch.h>

#include <cinttypes>
#include <map>
#include <tuple>
#include <utility>

#include "util/format.h"

namespace trainer::engine {
namespace {

// The sum of the squares of `grads`; undefined when there are none.
torch::Tensor squared_norm(const std::vector<torch::Tensor>& grads) {
  if (grads.empty()) return {};
  const auto norms = at::_foreach_norm(grads, 2.0);  // each [], per gradient
  return at::stack(norms).square().sum();
}

}  // namespace

std::optional<TensorSplit> split_of(const nn::SplitPlan& plan, const std::string& name,
                                    int64_t dims) {
  const auto dot = name.find('.');
  if (dot == std::string::npos) return std::nullopt;
  std::string key = name.substr(dot + 1);
  auto it = plan.find(key);
  if (it == plan.end()) {  // an optimizer's or an average's field of the parameter
    const auto last = key.rfind('.');
    if (last == std::string::npos) return std::nullopt;
    it = plan.find(key.substr(0, last));
  }
  if (it == plan.end() || dims <= it->second.dim) return std::nullopt;
  return it->second;
}

torch::Tensor tensor_parallel_grad_norm(const Components& parts) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> split, whole;
  if (parts.fsdp) {
    const auto& views = parts.fsdp->views();
    for (size_t v = 0; v < views.size(); ++v) {
      const auto& grad = views[v].tensor.grad();
      if (!grad.defined()) continue;
      for (const auto& piece : parts.fsdp->view_pieces(v, grad, "")) {
        (parts.tp_plan.count(piece.name) ? split : whole).push_back(piece.data);
      }
    }
  } else {
    for (const auto& [name, p] : models::unique_named_parameters(*parts.model)) {
      if (p.grad().defined()) (parts.tp_plan.count(name) ? split : whole).push_back(p.grad());
    }
  }
  // Summed over every rank below: a whole parameter's square counted 1 / tp on each of the
  // group's ranks, which hold the same gradient.
  auto total = torch::zeros({}, torch::TensorOptions(torch::kFloat).device(parts.device));
  if (const auto s = squared_norm(split); s.defined()) total = total + s.to(torch::kFloat);
  if (const auto w = squared_norm(whole); w.defined()) {
    total = total + w.to(torch::kFloat) / static_cast<double>(parts.tp_size());
  }
  if (parts.fsdp) total = parts.fsdp->reduce_over_shards(total, distributed::Reduce::sum);
  total = total.contiguous();
  parts.tp_group->all_reduce({total}, distributed::Reduce::sum);
  return total.sqrt();
}

checkpoint::NamedTensors joined_over_group(const Components& parts,
                                           checkpoint::NamedTensors tensors) {
  // A tied tensor joined once, shared by its names (the checkpoint stores it once).
  std::map<std::tuple<const void*, int64_t, int64_t>, torch::Tensor> joined;
  for (auto& [name, t] : tensors) {
    if (const auto split = split_of(parts.tp_plan, name, t.dim())) {
      const auto key = std::make_tuple(static_cast<const void*>(t.unsafeGetTensorImpl()),
                                       split->dim, split->groups);
      auto [it, fresh] = joined.emplace(key, torch::Tensor());
      if (fresh) it->second = distributed::join_over(t, *split, *parts.tp_group);
      t = it->second;
    }
  }
  return tensors;
}

std::vector<checkpoint::ShardPiece> tensor_parallel_pieces(
    const Components& parts, std::vector<checkpoint::ShardPiece> pieces) {
  const int rank = parts.tp->rank();
  std::vector<checkpoint::ShardPiece> out;
  for (auto& piece : pieces) {
    const auto split =
        split_of(parts.tp_plan, piece.name, static_cast<int64_t>(piece.shape.size()));
    if (!split) {
      if (rank == 0) out.push_back(std::move(piece));
      continue;
    }
    piece.name += strprintf("@tp%d/%d/%" PRId64 "/%" PRId64, rank, parts.tp_size(), split->dim,
                            split->groups);
    out.push_back(std::move(piece));
  }
  return out;
}

checkpoint::NamedTensors local_parts(const Components& parts, checkpoint::NamedTensors tensors) {
  for (auto& [name, t] : tensors) {
    if (const auto split = split_of(parts.tp_plan, name, t.dim())) {
      try {
        t = split_part(t, *split, parts.tp->rank(), parts.tp_size()).contiguous();
      } catch (const std::invalid_argument& e) {
        throw checkpoint::CorruptCheckpoint("'" + name + "' " + e.what());
      }
    }
  }
  return tensors;
}

}  // namespace trainer::engine
