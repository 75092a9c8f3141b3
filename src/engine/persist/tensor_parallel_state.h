// The tensor-parallel side (dist.tp_size) of a step and of a checkpoint: the gradients' norm with
// each split parameter's parts summed over the group and each whole one counted once, and the
// conversions between this rank's parts and the whole tensors a checkpoint holds, so that a
// checkpoint resumes at any tensor-parallel size, under ddp or fsdp.
#pragma once

#include <torch/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/setup/components.h"

namespace trainer::engine {

// The split of the checkpoint tensor `name` ("<prefix>.<parameter>" or
// "<prefix>.<parameter>.<field>": model., optim., ema.) of `dims` dimensions under `plan`; none
// for a tensor whole on every rank (also a split parameter's 0-dim fields, such as a step count).
std::optional<TensorSplit> split_of(const nn::SplitPlan& plan, const std::string& name,
                                    int64_t dims);

// The L2 norm of every gradient of the model over the whole job (fsdp's shards and the
// tensor-parallel parts), a whole parameter's counted once. Every rank must call this, in the
// same order.
torch::Tensor tensor_parallel_grad_norm(const Components& parts);

// `tensors` with every split one replaced by the whole tensor, joined over the tensor-parallel
// group (a tied one once, shared by its names). Every rank of the group must call this, in the same
// order.
checkpoint::NamedTensors joined_over_group(const Components& parts,
                                           checkpoint::NamedTensors tensors);

// fsdp: this rank's shard `pieces` of its parts, as a checkpoint stores them: a split tensor's
// under "<name>@tp<rank>/<tp size>/<dim>/<groups>" (checkpoint::load joins them), a whole one's
// from the group's first rank only.
std::vector<checkpoint::ShardPiece> tensor_parallel_pieces(
    const Components& parts, std::vector<checkpoint::ShardPiece> pieces);

// Whole `tensors` (a checkpoint's) with every split one replaced by this rank's part.
checkpoint::NamedTensors local_parts(const Components& parts, checkpoint::NamedTensors tensors);

}  // namespace trainer::engine
