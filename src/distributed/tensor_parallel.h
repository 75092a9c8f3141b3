// Megatron-LM's tensor-parallel regions: the two collectives a column-parallel linear followed by
// a row-parallel one needs, as autograd functions, the vocabulary-parallel embedding and
// cross-entropy, and nn::TensorParallel over a process group.
//
//   y = reduce_from_group(row_parallel(act(column_parallel(copy_to_group(x)))))
//
// One all-reduce in the forward (reduce_from_group) and one in the backward (copy_to_group's).
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "distributed/process_group.h"
#include "nn/tensor_parallel.h"
#include "util/tensor_split.h"

namespace trainer::distributed {

// `x` as it is; its gradient summed over `group` in the backward pass (every rank of the group
// holds the whole input and a part of the layers after it). Every rank of `group` must run the
// backward through it, in the same order.
torch::Tensor copy_to_group(const torch::Tensor& x, Group& group);

// `x` summed over `group` (each rank holds a partial sum, a row-parallel layer's output); its
// gradient passed on as it is. Every rank of `group` must call this, in the same order.
torch::Tensor reduce_from_group(const torch::Tensor& x, Group& group);

// The embeddings [N..., C] of token `ids` [N...] from a vocabulary-parallel table: this rank
// holds rows [first, first + weight.size(0)) of the whole table (`weight`, [V / tp, C]); ids
// outside them look up nothing here, and the ranks' lookups are summed over `group`. Every rank
// of `group` must call this, in the same order.
torch::Tensor vocab_parallel_embedding(const torch::Tensor& ids, const torch::Tensor& weight,
                                       int64_t first, Group& group);

// Megatron's vocabulary-parallel cross-entropy: the per-token loss [N] of `logits` [N, V / tp]
// (this rank's vocabulary columns [first, first + V / tp)) against `targets` [N] (ids in the whole
// vocabulary), without gathering the logits: the maximum, the target's logit and the sum of
// exponentials are all-reduced over `group` (three all-reduces of N values). Targets -100
// (PyTorch's ignore_index, losses::kIgnoreIndex) have loss 0 and no gradient. The backward needs
// no collective. Every rank of `group` must call this, in the same order.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t first,
                                           Group& group);

// The whole tensor from every rank of `group`'s part (`part`, split as `split` says), on every
// rank; not differentiable. Every rank of `group` must call this, in the same order.
torch::Tensor join_over(const torch::Tensor& part, const TensorSplit& split, Group& group);

// nn::TensorParallel over a process group: the collectives above, for a model's split layers.
// The group must outlive it.
class GroupTensorParallel : public nn::TensorParallel {
 public:
  explicit GroupTensorParallel(Group& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.world_size(); }
  torch::Tensor copy_in(const torch::Tensor& x) override { return copy_to_group(x, group_); }
  torch::Tensor reduce_out(const torch::Tensor& x) override { return reduce_from_group(x, group_); }
  torch::Tensor embedding(const torch::Tensor& ids, const torch::Tensor& weight) override {
    return vocab_parallel_embedding(ids, weight, rank() * weight.size(0), group_);
  }
  Group& group() const { return group_; }

 private:
  Group& group_;
};

}  // namespace trainer::distributed
