// model.lora's side of a run: the adapters attached to the built model (nn/lora.h), and what a
// checkpoint of a LoRA run holds of the model: the adapters alone (their optimizer state beside
// them as for any parameter), never the frozen base, with the base's identity, checked when the
// checkpoint is loaded again so that adapters never land on another base.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "checkpoint/checkpoint.h"
#include "config/loader.h"
#include "engine/setup/components.h"
#include "engine/setup/hf_pretrained.h"

namespace trainer::engine {

// model.lora.rank > 0: attaches the adapters to the layers model.lora.targets names, freezes the
// rest of the model and casts it to model.lora.base_dtype, records the base's identity in
// parts.lora_base and logs what trains. Call after the pretrained weights are loaded and before
// the model is split, moved or wrapped. Throws config::ConfigError naming model.lora.targets when
// a target names no linear layer.
void add_lora(Components& parts, const config::LoadedConfig& loaded);

// add_lora with the adapters drawn from the run's seed alone (a stream apart from the model's),
// not from how the model was built (drawn, unwritten, streamed into parts): every layout starts
// from the same adapters.
void add_seeded_lora(Components& parts, const config::LoadedConfig& loaded);

// `fill` that gives the adapters their values as drawn (whole, before any split), and every other
// parameter its value from `fill` (the files).
ParameterFill with_adapters(ParameterFill fill, const models::NetImpl& model);

// With LoRA under dist.tp_size: keeps this rank's part of each adapter as its layer splits
// (nn::adapter_splits; column-parallel layers' lora_B, row-parallel layers' lora_A) and adds
// them to parts.tp_plan. Call right after the model's split_over. Nothing otherwise.
void split_adapters(Components& parts);

// The frozen base's identity: checkpoint::pretrained_identity of model.pretrained's files (by
// content: the same files at another path are the same base), else a hash of the base's weights
// in memory. What a LoRA checkpoint records as meta["lora"]["base"].
std::string base_identity(const torch::nn::Module& model, const std::string& pretrained);

// The model's tensors a checkpoint holds, under their state-dict names: every one, or in a LoRA
// run the adapters' alone.
checkpoint::NamedTensors saved_model_state(const Components& parts);

// In a LoRA run: meta["lora"], the base's identity and the adapted layers. Nothing otherwise.
void add_adapter_meta(const Components& parts, nlohmann::json& meta);

// Loads a LoRA checkpoint's adapters (`weights`, state-dict names) into the model: "" or, as
// models::load_weights describes them, the adapters missing, the tensors that are no adapter of
// this model and those of another shape (then nothing is copied). Throws config::ConfigError
// naming model.pretrained when `meta` records another base (checkpoint::is_pretrained_identity
// decides for a base read from model.pretrained), or none (a checkpoint of a run without LoRA).
std::string load_adapters(Components& parts, const config::LoadedConfig& loaded,
                          const nlohmann::json& meta, const checkpoint::NamedTensors& weights,
                          const std::string& path);

}  // namespace trainer::engine
