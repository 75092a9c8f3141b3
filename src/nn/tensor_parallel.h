// Tensor parallelism as a model sees it (Megatron-LM's layers): the collectives its split layers
// compute with, which distributed/tensor_parallel.h implements over a group of consecutive
// ranks, the plan a model declares of how its parameters split, and the two parallel linears.
//
//   y = row_parallel(act(column_parallel(x)))   // x and y whole on every rank of the group
//
// One all-reduce in the forward (row_parallel's) and one in the backward (column_parallel's).
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
  // layers split over the group). Every rank of the group must run the backward through it, in
  // the same order.
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
// parameter). A parameter not named is whole on every rank.
using SplitPlan = std::map<std::string, TensorSplit>;

// Replaces each parameter of `module` that `plan` names by rank `rank` of `parts`' part of it (a
// tied parameter once). Throws std::invalid_argument naming the parameter and the sizes when a
// dimension does not divide, before changing anything.
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
