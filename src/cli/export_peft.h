// trainer export of a LoRA run (model.lora): --format peft writes the adapters as PEFT's
// save_pretrained does (adapter_model.safetensors, adapter_config.json), which
// peft.PeftModel.from_pretrained(base, DIR) loads; --format hf --merge writes the base with the
// adapters merged into its weights (W += scaling * B @ A), a plain Hugging Face model.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "checkpoint/safetensors.h"

namespace trainer::cli {

// Whether the checkpoint's metadata `meta` is a LoRA run's (it holds adapters, not the model).
bool holds_adapters(const nlohmann::json& meta);

// Writes the adapters `weights` (the trainer's state-dict names, `<layer>.lora_A.weight`) of the
// LoRA checkpoint `checkpoint` (its metadata `meta`) into folder `out`: adapter_model.safetensors
// under PEFT's names (base_model.model.<layer>.lora_A.weight) and adapter_config.json (peft_type
// LORA, r, lora_alpha, lora_dropout, target_modules, use_rslora, base_model_name_or_path: the
// run's model.pretrained, task_type CAUSAL_LM). Throws UsageError for a checkpoint of a run
// without LoRA. Returns the exit code.
int export_peft(const std::string& checkpoint, const std::string& out, const nlohmann::json& meta,
                const checkpoint::NamedTensors& weights);

// The run's base weights (model.pretrained: a Hugging Face folder or a safetensors file) in the
// trainer's layout with the adapters `weights` merged into the layers they adapt, each in the
// base's dtype. Throws UsageError naming the problem: a run without LoRA, a base built from the
// seed (no model.pretrained), a model.pretrained that is gone or has changed since training.
checkpoint::NamedTensors merged_weights(const std::string& checkpoint, const nlohmann::json& meta,
                                        const checkpoint::NamedTensors& weights);

// What --format hf writes of a checkpoint's `weights`: a LoRA run's merged (`merge`), another
// run's as they are. Throws UsageError for --merge without LoRA and for a LoRA run without
// --merge (its adapters alone are no Hugging Face model).
checkpoint::NamedTensors hf_weights(const std::string& checkpoint, const nlohmann::json& meta,
                                    const checkpoint::NamedTensors& weights, bool merge);

}  // namespace trainer::cli
