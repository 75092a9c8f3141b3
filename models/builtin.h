// What the built-in models' files share: the checkpointing policy and the options of the models'
// common keys.
#pragma once

#include "models/model.h"
#include "nn/activation_checkpoint.h"

#include <torch/nn/modules/linear.h>

namespace trainer::models {

// `layer` applied as PyTorch's nn.Linear applies it, one aten::linear (LibTorch's Linear module
// dispatches aten::t and aten::addmm separately).
inline torch::Tensor apply_linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return torch::linear(x, layer->weight, layer->bias);
}

// Dropout at rate `p` while training; nothing dispatched when p is 0.
inline torch::Tensor drop(const torch::Tensor& x, double p, bool training) {
  return p > 0.0 ? torch::dropout(x, p, training) : x;
}

// The blocks `model.checkpointing` selects. Throws ModelError when the setting is malformed, or
// when it asks for checkpointing and `has_blocks` is false.
nn::CheckpointPolicy checkpoint_policy(const config::ModelConfig& cfg, bool has_blocks);

// gpt's weights in Hugging Face's GPT-2 layout (models/gpt_hf.cpp).
ForeignFormat gpt2_hf_format();

}  // namespace trainer::models
