// model.pretrained: DIR, a Hugging Face model folder (config.json and safetensors weights, one
// file or shards with their index): config.json picks the model and sets its keys, and the weights
// stream into the built model one tensor at a time, never the whole folder in memory.
#pragma once

#include "config/loader.h"
#include "models/model.h"

namespace trainer::engine {

// When model.pretrained names a folder: sets model.name to the model whose Hugging Face layout
// reads config.json's model_type (unless the config sets model.name) and the model's keys to the
// values config.json gives them, recording config.json as where they were set. Throws
// ConfigError naming the file and the field: no config.json, a model_type no model reads, a field
// the model does not compute (it would be another model), or a key the config sets to another
// value than config.json's (naming both values). Does nothing for a file or no model.pretrained.
void apply_hf_folder_config(config::LoadedConfig& loaded);

// Copies the weights of folder model.pretrained into `model`'s parameters and buffers (on the
// CPU), converted to their dtypes, one tensor of one file at a time. Every header is read and
// checked against the model first (names, shapes, dtypes; a tied model's file may hold one of its
// names), so that a folder that does not fit changes nothing: ConfigError naming the file and the
// tensor. A file that fails while it is read throws FormatError (exit 1). Buffers the files lack
// keep their values; with model.pretrained_skip_head, so do the head's tensors the files lack or
// give another shape.
void load_hf_folder(models::NetImpl& model, const config::LoadedConfig& loaded);

}  // namespace trainer::engine
