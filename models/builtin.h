// What the built-in models' files share: the checkpointing policy and the options of the models'
// common keys.
#pragma once

#include "models/model.h"
#include "nn/activation_checkpoint.h"
#include "nn/lora.h"

#include <torch/nn/modules/linear.h>

namespace trainer::models {

// `layer` applied as PyTorch's nn.Linear applies it, one aten::linear (LibTorch's Linear module
// dispatches aten::t and aten::addmm separately).
inline torch::Tensor apply_linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return torch::linear(x, layer->weight, layer->bias);
}

// `layer`'s forward: its linear map, plus its LoRA adapter's update when it has one (nn/lora.h).
inline torch::Tensor apply_linear(const nn::Linear& layer, const torch::Tensor& x) {
  return layer->forward(x);
}

// `layer` as a column-parallel layer over `tp` (nn::LinearImpl::column_parallel; null: whole, as
// apply_linear) of x [..., in], `in` being x or tp->copy_in(x), made once for several layers.
inline torch::Tensor apply_column(const nn::Linear& layer,
                                  const std::shared_ptr<nn::TensorParallel>& tp,
                                  const torch::Tensor& x, const torch::Tensor& in) {
  return tp ? layer->column_parallel(*tp, x, in) : layer->forward(in);
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

// llama's Hugging Face layout: LlamaForCausalLM's, Qwen2's and Qwen3's names (the model's own),
// config.json of model_type llama, mistral, qwen2 and qwen3 (models/llama_hf.cpp).
ForeignFormat llama_hf_format();

}  // namespace trainer::models
