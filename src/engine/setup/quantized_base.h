// model.lora.base_quant (QLoRA): the frozen base's linear layers, every one but the output layer
// (nn::quantizable_layers), held quantized as bitsandbytes holds them (nn/quant/); the
// embeddings, norms and the output layer stay in model.lora.base_dtype.
#pragma once

#include "config/loader.h"
#include "engine/setup/hf_pretrained.h"
#include "models/model.h"

namespace trainer::engine {

// Quantizes the weight of every quantizable layer of `model` (written: built, loaded and cast to
// model.lora.base_dtype), freeing the unquantized weights. ConfigError naming
// model.lora.base_quant when the model has no layer to quantize.
void quantize_base(models::NetImpl& model, const config::LoadedConfig& loaded);

// Fills the parameters of `model` (built unwritten, nn/deferred_init.h, in
// model.lora.base_dtype) from `fill`, one at a time, each quantizable layer's weight quantized as
// soon as it is read and its unquantized storage freed: the base's linear weights never exist
// together unquantized. A weight `saved` gives (the folder holds it quantized) is taken as it is;
// one that is no quantizable layer's, or malformed, is a ConfigError naming model.pretrained.
// Throws what `fill` throws.
void fill_quantized(models::NetImpl& model, const ParameterFill& fill,
                    const SavedQuantizedRead& saved, const config::LoadedConfig& loaded);

}  // namespace trainer::engine
