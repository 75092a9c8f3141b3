// A small llama for the model's tests: its config and sizes.
#pragma once

#include <cstdint>

#include "models/model.h"

namespace trainer::models::test_support {

constexpr int64_t kLlamaVocab = 61, kLlamaContext = 24;

// 2 blocks, 4 query heads sharing 2 key/value heads, head_dim 12 (not 32 / 4), llama3 rope
// scaling with a short original context (so that every band of wavelengths occurs), untied.
inline config::ModelConfig small_llama_config() {
  config::ModelConfig cfg = default_model_config("llama");
  cfg.options.set("n_layer", int64_t{2});
  cfg.options.set("n_head", int64_t{4});
  cfg.options.set("n_kv_head", int64_t{2});
  cfg.options.set("n_embd", int64_t{32});
  cfg.options.set("head_dim", int64_t{12});
  cfg.options.set("intermediate_size", int64_t{48});
  cfg.options.set("block_size", kLlamaContext);
  cfg.options.set("vocab_size", kLlamaVocab);
  cfg.options.set("rope_theta", 500000.0);
  cfg.options.set("rope_scaling", "llama3");
  cfg.options.set("rope_original_context", int64_t{64});
  cfg.options.set("tie_embeddings", false);
  return cfg;
}

}  // namespace trainer::models::test_support
