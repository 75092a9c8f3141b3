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

// The block-causal attention mask of packed rows (data::Batch::positions): with doc(t) the number
// of zeros in positions[b, 0..t], query t attends to key u only if u <= t and doc(u) == doc(t).
// positions [B, T] int64 -> [B, 1, T, T] bool (true: attends), an SDPA attn_mask shared by heads.
inline torch::Tensor block_causal_mask(const torch::Tensor& positions) {
  const int64_t T = positions.size(1);
  const auto doc = positions.eq(0).cumsum(/*dim=*/1);              // [B, T]: doc(t)
  const auto same = doc.unsqueeze(2).eq(doc.unsqueeze(1));         // [B, T, T]: [b, t, u]
  const auto causal = torch::ones({T, T}, same.options()).tril();  // [T, T]: u <= t
  return same.logical_and(causal).unsqueeze(1);                    // [B, 1, T, T]
}

// Throws ModelError (key dist.tp_size) when `size` (named `what`, e.g. "model.vocab_size") does
// not split into `parts` equal parts over the tensor-parallel ranks; `remedy` ends the message.
inline void check_tp_split(const std::string& what, int64_t size, int parts,
                           const std::string& remedy = "") {
  if (size % parts == 0) return;
  throw ModelError("dist.tp_size",
                   what + " " + std::to_string(size) + " does not split over dist.tp_size " +
                       std::to_string(parts) + "; use a tp_size that divides it" + remedy);
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
