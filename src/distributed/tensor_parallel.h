// Megatron-LM's tensor-parallel regions: the two collectives a column-parallel linear followed by
// a row-parallel one needs, as autograd functions, and the slices of a whole layer's weights each
// rank of a tensor-parallel group holds.
//
//   y = reduce_from_group(row_parallel(act(column_parallel(copy_to_group(x)))))
//
// One all-reduce in the forward (reduce_from_group) and one in the backward (copy_to_group's).
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "distributed/process_group.h"

namespace trainer::distributed {

// `x` as it is; its gradient summed over `group` in the backward pass (every rank of the group
// holds the whole input and a part of the layers after it). Every rank of `group` must run the
// backward through it, in the same order.
torch::Tensor copy_to_group(const torch::Tensor& x, Group& group);

// `x` summed over `group` (each rank holds a partial sum, a row-parallel layer's output); its
// gradient passed on as it is. Every rank of `group` must call this, in the same order.
torch::Tensor reduce_from_group(const torch::Tensor& x, Group& group);

// Rank `rank` of `parts`' share of `whole` along `dim`: a column-parallel weight's rows (dim 0),
// a row-parallel weight's columns (dim 1). Throws std::invalid_argument naming the sizes when
// the dimension does not divide by `parts`.
torch::Tensor shard_of(const torch::Tensor& whole, int64_t dim, int rank, int parts);

}  // namespace trainer::distributed
