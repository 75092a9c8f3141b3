#include "engine/setup/quantized_base.h"

#include <torch/torch.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/lora.h"
#include "nn/parameters.h"
#include "nn/quant/nf4.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

[[noreturn]] void config_error(const config::LoadedConfig& loaded, const std::string& message) {
  const std::string key = "model.lora.base_quant";
  throw config::ConfigError({config::Issue{loaded.where(key), key, message}});
}

// The quantizable layers of `model`; ConfigError when it has none.
std::vector<std::pair<std::string, nn::LinearImpl*>> layers_to_quantize(
    const models::NetImpl& model, const config::LoadedConfig& loaded) {
  auto layers = nn::quantizable_layers(model);
  if (layers.empty()) {
    config_error(loaded, "model " + loaded.cfg.model.name +
                             " has no linear layer but its output layer to quantize; set "
                             "model.lora.base_quant: none");
  }
  return layers;
}

void quantize_layer(const std::string& name, nn::LinearImpl& layer, nn::quant::QuantKind kind,
                    const config::LoadedConfig& loaded) {
  try {
    layer.quantize_weight(kind);
  } catch (const std::invalid_argument& e) {
    config_error(loaded, "cannot quantize " + name + ".weight: " + e.what());
  }
}

// The layer's weight as folder model.pretrained holds it in NF4 (no quantization here).
void take_saved(const std::string& name, nn::LinearImpl* layer,
                const nn::quant::Nf4SavedTensors& tensors, const config::LoadedConfig& loaded) {
  const std::string folder = loaded.cfg.model.pretrained;
  if (!layer) {
    throw config::ConfigError({config::Issue{
        loaded.where("model.pretrained"), "model.pretrained",
        folder + " holds " + name +
            " quantized, but it is not the weight of a linear layer that model.lora.base_quant "
            "quantizes (every one but the output layer); save the model with that layer "
            "unquantized (llm_int8_skip_modules)"}});
  }
  try {
    layer->set_quantized(nn::quant::quantized(nn::quant::nf4_from_saved(tensors, name)));
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError({config::Issue{loaded.where("model.pretrained"), "model.pretrained",
                                             folder + ": " + e.what()}});
  }
}

void log_quantized(const models::NetImpl& model, const config::LoadedConfig& loaded,
                   size_t layers) {
  const int64_t params = nn::quantized_parameters(model);
  const int64_t bytes = nn::quantized_bytes(model);
  log::info(strprintf("QLoRA: %zu linear layers of the base held in %s: %" PRId64
                      " parameters in %.1f MB (%.4f bytes a parameter)",
                      layers, loaded.cfg.model.lora.base_quant.c_str(), params,
                      static_cast<double>(bytes) / 1e6,
                      params ? static_cast<double>(bytes) / static_cast<double>(params) : 0.0));
}

}  // namespace

void quantize_base(models::NetImpl& model, const config::LoadedConfig& loaded) {
  const auto kind = nn::quant::quant_kind(loaded.cfg.model.lora.base_quant);
  const auto layers = layers_to_quantize(model, loaded);
  for (const auto& [name, layer] : layers) quantize_layer(name, *layer, kind, loaded);
  log_quantized(model, loaded, layers.size());
}

void fill_quantized(models::NetImpl& model, const ParameterFill& fill,
                    const SavedQuantizedRead& saved, const config::LoadedConfig& loaded) {
  const auto kind = nn::quant::quant_kind(loaded.cfg.model.lora.base_quant);
  const auto layers = layers_to_quantize(model, loaded);
  std::map<std::string, nn::LinearImpl*> quantized_weight;  // parameter name -> its layer
  for (const auto& [name, layer] : layers) quantized_weight[name + ".weight"] = layer;
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : nn::unique_named_parameters(model)) {
    const auto it = quantized_weight.find(name);
    const auto as_saved = saved(name);
    if (as_saved.weight.defined()) {
      take_saved(name, it == quantized_weight.end() ? nullptr : it->second, as_saved, loaded);
      continue;
    }
    if (!p.is_contiguous()) throw std::logic_error("fill_quantized: " + name + " not contiguous");
    fill(name, 0, p.view({-1}));
    if (it != quantized_weight.end()) quantize_layer(name, *it->second, kind, loaded);
  }
  log_quantized(model, loaded, layers.size());
}

}  // namespace trainer::engine
