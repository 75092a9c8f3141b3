// The checkpoint side of sharded training (dist.strategy fsdp): each rank's pieces of the model's
// parameters and of the optimizer's state, named as a checkpoint names the whole tensors, and the
// way back from whole tensors into the shards, so that a checkpoint resumes on any number of
// ranks and under either strategy.
#pragma once

#include <torch/types.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/setup/components.h"

namespace trainer::engine {

// This rank's pieces: `model_prefix` + the name of every parameter (a tied one under each of its
// names), and `optim_prefix` + "<parameter name>.<field>" of the optimizer's state.
// Synchronises the device (the optimizer's state, engine/optim state()).
std::vector<checkpoint::ShardPiece> sharded_pieces(const Components& parts,
                                                   const std::string& model_prefix,
                                                   const std::string& optim_prefix);

// Every name of each parameter: its canonical one (unique_named_parameters) -> all its state-dict
// names.
std::map<std::string, std::vector<std::string>> parameter_names(const torch::nn::Module& model);

// The names in models::state_dict(model) that are parameters (the others are buffers).
std::set<std::string> parameter_entries(const torch::nn::Module& model);

// Copies whole `weights` (state-dict names) into this rank's shards and the buffers into the
// model. Returns "" or a description of what is missing or mis-shaped, and then copies nothing.
std::string load_sharded_weights(Components& parts, const checkpoint::NamedTensors& weights);

// The optimizer's state for this rank's shards from whole per-parameter `state`
// ("<parameter name>.<field>"), as Optimizer::load_state takes it.
std::map<std::string, torch::Tensor> sharded_optimizer_state(
    const Components& parts, const std::map<std::string, torch::Tensor>& state);

}  // namespace trainer::engine
