// Tensor parallelism as a model sees it (Megatron-LM's layers): the collectives its split layers
// compute with, which distributed/tensor_parallel.h implements over a group of consecutive
// ranks, the plan a model declares of how its parameters split, and the two parallel linears.
//
//   y = row_parallel(act(column_parallel(x)))   // x and y whole on every rank of the group
//
// One all-reduce in the forward (row_parallel's) and one in the backward (column_parallel's).
//
// A tensor whole on every rank that split layers use enters them through copy_in: the layers'
// input, and any parameter the plan leaves whole that they compute with (Qwen 3's per-head norm
// weights, which scale only this rank's heads; a LoRA adapter's A before a column-parallel B).
// Each rank computes only its heads' or rows' share of such a parameter's gradient, and copy_in's
// backward sums the shares, so every rank holds the whole gradient, as one process computes it.
// A whole parameter used outside the split layers (a block's RMSNorm, a row-parallel layer's bias
// added after reduce_out) gets the whole gradient on every rank as it is.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <map>
#include <string>

#include "util/tensor_split.h"

namespace trainer::nn {

class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  // This rank's place in the group, and the group's size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // `x` as it is; its gradient summed over the group in the backward pass (the whole input of
  // layers split over the group, or a whole parameter they compute with). Every rank of the group
  // must run the backward through it, in the same order.
  virtual torch::Tensor copy_in(const torch::Tensor& x) = 0;
  // `x` summed over the group (the partial outputs of a layer split along its input); its
  // gradient passed on as it is. Every rank of the group must call this, in the same order.
  virtual torch::Tensor reduce_out(const torch::Tensor& x) = 0;
  // The embeddings [N..., C] of token `ids` [N...] from a vocabulary-parallel table: this rank
  // holds rows [rank * V / size, (rank + 1) * V / size) (`weight`, [V / size, C]). Every rank of
  // the group must call this, in the same order.
  virtual torch::Tensor embedding(const torch::Tensor& ids, const torch::Tensor& weight) = 0;
};

// How a model's parameters split over the group: state-dict name -> split (every name of a tied
// parameter). A parameter not named is whole on every rank, and its gradient must be whole on
// every rank too (the same on each): one that split layers use enters them through copy_in.
using SplitPlan = std::map<std::string, TensorSplit>;

// Replaces each parameter of `module` that `plan` names by rank `rank` of `parts`' part of it (a
// tied parameter once). Under nn::Deferral::unwritten (nn/deferred_init.h) the parts are
// allocated and not written: the files about to fill them give their values. Throws
// std::invalid_argument naming the parameter and the sizes when a dimension does not divide,
// before changing anything.
void keep_parts(torch::nn::Module& module, const SplitPlan& plan, int rank, int parts);

// A column-parallel linear: x [..., in] whole on every rank, `weight` this rank's rows [out / tp,
// in] and `bias` [out / tp] (undefined: none) -> this rank's outputs [..., out / tp].
torch::Tensor column_parallel(TensorParallel& tp, const torch::Tensor& x,
                              const torch::Tensor& weight, const torch::Tensor& bias);

// A row-parallel linear: x [..., in / tp] this rank's inputs, `weight` its columns [out, in / tp],
// `bias` [out] whole (undefined: none) -> y [..., out], whole on every rank (summed over the
// group). Every rank of the group must call this, in the same order.
torch::Tensor row_parallel(TensorParallel& tp, const torch::Tensor& x, const torch::Tensor& weight,
                           const torch::Tensor& bias);

}  // namespace trainer::nn
