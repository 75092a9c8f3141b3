// model.pretrained: DIR, a Hugging Face model folder (config.json and safetensors weights, one
// file or shards with their index): config.json picks the model and sets its keys, and the weights
// stream into the built model one tensor at a time, never the whole folder in memory.
#pragma once

#include <functional>
#include <string>

#include "config/loader.h"
#include "models/model.h"
#include "nn/quant/nf4.h"
#include "nn/tensor_parallel.h"

namespace trainer::engine {

// When model.pretrained names a folder: sets model.name to the model whose Hugging Face layout
// reads config.json's model_type (unless the config sets model.name) and the model's keys to the
// values config.json gives them, recording config.json as where they were set. Throws
// ConfigError naming the file and the field: no config.json, a model_type no model reads, a field
// the model does not compute (it would be another model), a key the config sets to another
// value than config.json's (naming both values), a folder without weights, or weights whose
// headers hold far fewer parameters than config.json's sizes make (checked before any model is
// built). Does nothing for a file or no model.pretrained.
void apply_hf_folder_config(config::LoadedConfig& loaded);

// Copies the weights of folder model.pretrained into `model`'s parameters and buffers (on the
// CPU), converted to their dtypes, one tensor of one file at a time. Every header is read and
// checked against the model first (names, shapes, dtypes; a tied model's file may hold one of its
// names), so that a folder that does not fit changes nothing: ConfigError naming the file and the
// tensor. A file that fails while it is read throws FormatError (exit 1). Buffers the files lack
// keep their values; with model.pretrained_skip_head, so do the head's tensors the files lack or
// give another shape.
void load_hf_folder(models::NetImpl& model, const config::LoadedConfig& loaded);

// load_hf_folder's checks alone, for a planned model (engine/setup/components.h's Build::plan):
// every header of folder model.pretrained against `model`'s shapes and dtypes; nothing is read
// beyond the headers and nothing copied. The same ConfigErrors.
void check_hf_folder(const models::NetImpl& model, const config::LoadedConfig& loaded);

// What a rank reads of a parameter: elements [first, first + dst.numel()) of parameter `name`
// (any of a tied tensor's names) flattened, into `dst` (1-D, contiguous, any device), converted
// to its dtype. distributed::FsdpOptions::fill.
using ParameterFill =
    std::function<void(const std::string& name, int64_t first, const torch::Tensor& dst)>;

// load_hf_folder for a model whose parameters are not written yet (nn/deferred_init.h) and
// are filled where they are kept (each rank its FSDP shards): the same checks and ConfigErrors,
// before anything is read, and the names of a tied tensor compared in the files; then nothing is
// copied but a reader of the folder's tensors by the model's parameter names is returned (it
// keeps the files open). Every parameter must be in the files (not with
// model.pretrained_skip_head). Reads that fail throw FormatError (exit 1).
//
// With model.lora.base_quant: nf4, weights the files hold in bitsandbytes' 4-bit form (as
// transformers saves a model loaded with BitsAndBytesConfig(load_in_4bit=True): P.weight packed,
// P.weight.absmax, ..., nn/quant/nf4.h's Nf4SavedTensors) are not filled: `saved_quantized`
// receives their reader (undefined tensors for every other name). Without `saved_quantized`, such
// a folder is a ConfigError.
using SavedQuantizedRead = std::function<nn::quant::Nf4SavedTensors(const std::string& name)>;
ParameterFill hf_folder_fill(const models::NetImpl& model, const config::LoadedConfig& loaded,
                             SavedQuantizedRead* saved_quantized = nullptr);

// `fill` of whole tensors as the fill of `model`'s parameters split by `plan` over `parts`
// tensor-parallel ranks (NetImpl::split_over): elements [first, first + n) of rank `rank`'s part
// of a parameter, flattened, each run of the part's elements that lies together in the whole
// tensor read on its own. FSDP over the data-parallel ranks of a tensor-parallel job fills its
// shards of the parts through it.
ParameterFill part_fill(ParameterFill fill, const models::NetImpl& model, const nn::SplitPlan& plan,
                        int rank, int parts);

// Fills every parameter of `model`, split by `plan` over `parts` tensor-parallel ranks, with rank
// `rank`'s part of the whole tensor `fill` reads (through part_fill): the whole never in memory.
// Throws what `fill` throws.
void fill_split_parameters(models::NetImpl& model, const ParameterFill& fill,
                           const nn::SplitPlan& plan, int rank, int parts);

}  // namespace trainer::engine
