// What the built-in models' files share: the checkpointing policy and the options of the models'
// common keys.
#pragma once

#include "models/model.h"
#include "nn/activation_checkpoint.h"

namespace trainer::models {

// The blocks `model.checkpointing` selects. Throws ModelError when the setting is malformed, or
// when it asks for checkpointing and `has_blocks` is false.
nn::CheckpointPolicy checkpoint_policy(const config::ModelConfig& cfg, bool has_blocks);

}  // namespace trainer::models
