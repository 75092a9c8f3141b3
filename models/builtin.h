// Registration functions of the built-in models, called once by model_registry().
#pragma once

#include "models/model.h"
#include "nn/activation_checkpoint.h"

namespace trainer::models {

void register_mlp(ModelRegistry& registry);
void register_lenet(ModelRegistry& registry);
void register_gpt(ModelRegistry& registry);
void register_resnet(ModelRegistry& registry);

// The blocks `model.checkpointing` selects. Throws ModelError when the setting is malformed, or
// when it asks for checkpointing and `has_blocks` is false.
nn::CheckpointPolicy checkpoint_policy(const config::ModelConfig& cfg, bool has_blocks);

}  // namespace trainer::models
