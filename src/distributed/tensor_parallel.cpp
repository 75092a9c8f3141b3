#include "distributed/tensor_parallel.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace trainer::distributed {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// A target left out of the loss: PyTorch's ignore_index (losses::kIgnoreIndex,
// data::kIgnoreTarget; distributed includes neither).
constexpr int64_t kIgnoredTarget = -100;

// The group travels through the autograd context as its address.
Group& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Group* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return x;  // autograd makes the returned input a view of it, no copy
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto grad = grads[0].contiguous();
    group_of(ctx).all_reduce({grad}, Reduce::sum);
    return {grad, torch::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static torch::Tensor forward(AutogradContext* /*ctx*/, const torch::Tensor& x, Group* group) {
    auto out = x.contiguous().clone();
    group->all_reduce({out}, Reduce::sum);
    return out;
  }
  static tensor_list backward(AutogradContext* /*ctx*/, tensor_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t first, Group* group) {
    torch::NoGradGuard no_grad;
    const int64_t v = logits.size(1);
    auto max = std::get<0>(logits.max(/*dim=*/1)).contiguous();  // [N]
    group->all_reduce({max}, Reduce::max);
    const auto shifted = logits - max.unsqueeze(1);                              // [N, V/tp]
    const auto mine = (targets >= first) & (targets < first + v);                // [N]
    const auto local = (targets - first).clamp(0, v - 1).masked_fill(~mine, 0);  // [N]
    auto target_logit =
        shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(~mine, 0.0).contiguous();
    const auto exp = shifted.exp();                  // [N, V/tp]
    auto sum_exp = exp.sum(/*dim=*/1).contiguous();  // [N]
    group->all_reduce({target_logit, sum_exp}, Reduce::sum);
    // Targets left out (kIgnoreTarget): loss 0 and no gradient, as PyTorch's ignore_index.
    const auto kept = targets.ne(kIgnoredTarget).to(logits.scalar_type());  // [N]
    ctx->save_for_backward({exp / sum_exp.unsqueeze(1), local, mine, kept});
    return (sum_exp.log() - target_logit) * kept;  // [N]
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto grad = saved[0].clone();  // softmax [N, V/tp]
    const auto& local = saved[1];
    const auto& mine = saved[2];
    grad.scatter_add_(1, local.unsqueeze(1), -mine.to(grad.scalar_type()).unsqueeze(1));
    const auto scale = (grads[0] * saved[3]).unsqueeze(1);  // [N, 1]: 0 for targets left out
    return {grad * scale, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_embedding(const torch::Tensor& ids, const torch::Tensor& weight,
                                       int64_t first, Group& group) {
  const int64_t v = weight.size(0);
  const auto mine = (ids >= first) & (ids < first + v);                    // [N...]
  const auto local = (ids - first).clamp(0, v - 1).masked_fill(~mine, 0);  // [N...]
  const auto looked_up =
      torch::embedding(weight, local) * mine.unsqueeze(-1).to(weight.scalar_type());  // [N..., C]
  return reduce_from_group(looked_up, group);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t first,
                                           Group& group) {
  return VocabParallelCrossEntropy::apply(logits, targets, first, &group);
}

torch::Tensor copy_to_group(const torch::Tensor& x, Group& group) {
  return CopyToGroup::apply(x, &group);
}

torch::Tensor reduce_from_group(const torch::Tensor& x, Group& group) {
  return ReduceFromGroup::apply(x, &group);
}

torch::Tensor join_over(const torch::Tensor& part, const TensorSplit& split, Group& group) {
  torch::NoGradGuard no_grad;
  const auto mine = part.detach().contiguous();
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < group.world_size(); ++r) parts.push_back(torch::empty_like(mine));
  group.all_gather(mine, parts);
  return join_parts(parts, split);
}

}  // namespace trainer::distributed
