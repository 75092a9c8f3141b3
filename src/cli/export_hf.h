// trainer export --format hf: a checkpoint's model as a Hugging Face folder, as transformers'
// save_pretrained writes it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "checkpoint/safetensors.h"

namespace trainer::cli {

struct HfExport {
  std::string checkpoint;        // the checkpoint file, for messages
  std::string out;               // the folder to write
  std::string model;             // model.name
  nlohmann::json config;         // the run's flattened config (meta["config"])
  uint64_t max_shard_bytes = 0;  // --max-shard-size
  std::string dtype = "auto";    // --dtype: auto|float32|bfloat16|float16
  std::string tokenizer;         // --tokenizer: the tokenizer files' source, or "" (the run's)
};

// --max-shard-size: a size as transformers writes it ("5GB", "500MB", "1.5GB": decimal units
// TB, GB, MB, KB) or a number of bytes. Throws UsageError.
uint64_t parse_shard_size(const std::string& text);

// Writes `weights` (the trainer's names) into e.out: the weights in the model's Hugging Face
// layout (model.safetensors, or shards of at most e.max_shard_bytes and their index),
// config.json, generation_config.json, the tokenizer files (of e.tokenizer, else the run's
// data.tokenizer, else its model.pretrained folder, as transformers' AutoTokenizer reads them) and,
// when the run started from a Hugging Face folder (model.pretrained: DIR), that folder's
// generation_config.json and its token ids, and config.json in that folder's config.json's
// layout (ForeignFormat::in_layout_of: transformers 5's rope_parameters, or 4's rope_theta and
// rope_scaling). --dtype auto writes the dtype of that folder's config.json, else the weights'.
// Throws UsageError for a model without a Hugging Face layout or one no Hugging Face model type
// computes. Returns the exit code.
int export_hf(const HfExport& e, const checkpoint::NamedTensors& weights);

}  // namespace trainer::cli
