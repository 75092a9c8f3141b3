#include "cli/export_peft.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "checkpoint/hf_folder.h"
#include "checkpoint/pretrained_identity.h"
#include "cli/commands.h"
#include "models/model.h"
#include "nn/lora.h"
#include "nn/quant/quantized_weight.h"
#include "util/fileio.h"
#include "util/format.h"

namespace trainer::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";
const std::string kA = ".lora_A.weight", kB = ".lora_B.weight";

// The run's flattened config value of `key` ("" when absent).
std::string config_value(const nlohmann::json& meta, const std::string& key) {
  const auto& c = meta.contains("config") ? meta["config"] : nlohmann::json();
  return c.is_object() && c.contains(key) && c[key].is_string() ? c[key].get<std::string>() : "";
}

double config_number(const nlohmann::json& meta, const std::string& key,
                     const std::string& checkpoint) {
  const std::string text = config_value(meta, key);
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    throw UsageError(checkpoint + ": its config's " + key + " is not a number ('" + text + "')");
  }
}

// The adapter options the run trained with.
nn::LoraOptions adapter_options(const nlohmann::json& meta, const std::string& checkpoint) {
  nn::LoraOptions o;
  o.rank = static_cast<int64_t>(config_number(meta, "model.lora.rank", checkpoint));
  o.alpha = config_number(meta, "model.lora.alpha", checkpoint);
  o.dropout = config_number(meta, "model.lora.dropout", checkpoint);
  o.rslora = config_value(meta, "model.lora.rslora") == "true";
  return o;
}

void require_adapters(const std::string& checkpoint, const nlohmann::json& meta,
                      const std::string& what) {
  if (holds_adapters(meta)) return;
  throw UsageError(what + ": " + checkpoint +
                   " was trained without model.lora: it holds the whole model, no adapters; "
                   "export it with --format pt or --format hf (without --merge)");
}

// The adapted layers' names: `<layer>` of every `<layer>.lora_A.weight`.
std::vector<std::string> adapted(const checkpoint::NamedTensors& weights) {
  std::vector<std::string> out;
  for (const auto& [name, t] : weights) {
    if (name.size() > kA.size() && name.compare(name.size() - kA.size(), kA.size(), kA) == 0) {
      out.push_back(name.substr(0, name.size() - kA.size()));
    }
  }
  return out;
}

// A number as JSON: an integer where it is one (PEFT writes lora_alpha as an int).
nlohmann::json number(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return static_cast<int64_t>(v);
  return v;
}

nlohmann::json adapter_config(const nlohmann::json& meta, const nn::LoraOptions& o,
                              const std::vector<std::string>& layers) {
  std::set<std::string> targets;
  for (const auto& layer : layers) targets.insert(layer.substr(layer.rfind('.') + 1));
  const std::string base = config_value(meta, "model.pretrained");
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", base.empty() ? nlohmann::json() : nlohmann::json(base)},
          {"revision", nullptr},
          {"inference_mode", true},
          {"r", o.rank},
          {"lora_alpha", number(o.alpha)},
          {"lora_dropout", o.dropout},
          {"target_modules", std::vector<std::string>(targets.begin(), targets.end())},
          // GPT-2's Hugging Face layers are Conv1D, their weights [in, out].
          {"fan_in_fan_out", config_value(meta, "model.name") == "gpt"},
          {"bias", "none"},
          {"use_rslora", o.rslora},
          {"use_dora", false},
          {"init_lora_weights", true},
          {"modules_to_save", nullptr},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()}};
}

// model.pretrained's tensors, in the trainer's layout of `model`.
models::NamedWeights base_weights(const std::string& pretrained, const std::string& model) {
  models::NamedWeights out;
  try {
    if (checkpoint::is_directory(pretrained)) {
      const auto folder = checkpoint::open_hf_weights(pretrained);
      for (const auto& [name, where] : folder.tensors) {
        out.emplace_back(name, folder.files[where.file].read(*where.entry));
      }
    } else {
      out = checkpoint::read_safetensors(pretrained).tensors;
    }
  } catch (const checkpoint::FormatError& e) {
    throw UsageError(std::string("--merge: the run's base: ") + e.what());
  }
  return models::to_trainer_layout(model, out);
}

// A QLoRA run's base (model.lora.base_quant; the checkpoint's lora.quantized names its layers):
// each quantized layer's weight as the run computed with it, quantized from the file's weight in
// model.lora.base_dtype and dequantized (float32, then the file's dtype), as PEFT merges into a
// dequantized bitsandbytes weight.
void dequantize_quantized(models::NamedWeights& base, const nlohmann::json& meta,
                          const std::string& checkpoint) {
  const auto& lora = meta["lora"];
  if (!lora.contains("quantized")) return;
  nn::quant::QuantKind kind;
  try {
    kind = nn::quant::quant_kind(config_value(meta, "model.lora.base_quant"));
  } catch (const std::invalid_argument& e) {
    throw UsageError("--merge: " + checkpoint + "'s model.lora.base_quant: " + e.what());
  }
  const auto dtype = nn::lora_base_dtype(config_value(meta, "model.lora.base_dtype"));
  std::map<std::string, torch::Tensor*> by_name;
  for (auto& [name, t] : base) by_name[name] = &t;
  torch::NoGradGuard no_grad;
  for (const auto& layer : lora["quantized"]) {
    const auto it = by_name.find(layer.get<std::string>() + ".weight");
    if (it == by_name.end() || !it->second->is_floating_point()) {
      throw UsageError("--merge: " + checkpoint + "'s run quantized " + layer.get<std::string>() +
                       ", which its base holds no float weight of (a folder saved quantized is "
                       "not merged yet); export the adapters with --format peft");
    }
    torch::Tensor& w = *it->second;
    w = nn::quant::quantize(w.to(dtype), kind)->dequantized(torch::kFloat).to(w.scalar_type());
  }
}

}  // namespace

bool holds_adapters(const nlohmann::json& meta) {
  return meta.is_object() && meta.contains("lora") && meta["lora"].is_object() &&
         meta["lora"].contains("base");
}

int export_peft(const std::string& checkpoint, const std::string& out, const nlohmann::json& meta,
                const checkpoint::NamedTensors& weights) {
  require_adapters(checkpoint, meta, "--format peft");
  const auto options = adapter_options(meta, checkpoint);
  checkpoint::NamedTensors tensors;
  for (const auto& [name, t] : weights) tensors.emplace_back(kPeftPrefix + name, t);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw UsageError("--out " + out + ": cannot create the folder: " + ec.message());
  const auto layers = adapted(weights);
  write_atomically((fs::path(out) / "adapter_model.safetensors").string(),
                   [&](const ByteSink& sink) {
                     checkpoint::write_safetensors(tensors, {{"format", "pt"}}, sink);
                   });
  write_text_atomically((fs::path(out) / "adapter_config.json").string(),
                        adapter_config(meta, options, layers).dump(2) + "\n");
  std::cout << "wrote " << out << ": LoRA adapters of " << layers.size() << " layers (rank "
            << options.rank << "), adapter_model.safetensors and adapter_config.json\n";
  return 0;
}

checkpoint::NamedTensors merged_weights(const std::string& checkpoint, const nlohmann::json& meta,
                                        const checkpoint::NamedTensors& weights) {
  require_adapters(checkpoint, meta, "--merge");
  const std::string pretrained = config_value(meta, "model.pretrained");
  if (pretrained.empty()) {
    throw UsageError("--merge: " + checkpoint +
                     "'s run adapted a base built from its seed (no model.pretrained), which the "
                     "checkpoint does not hold; export the adapters with --format peft");
  }
  bool same = false;
  try {
    same = checkpoint::is_pretrained_identity(pretrained, meta["lora"].value("base", ""));
  } catch (const std::exception& e) {
    throw UsageError("--merge: the run's base model.pretrained " + pretrained +
                     " cannot be read: " + e.what());
  }
  if (!same) {
    throw UsageError("--merge: the run's base model.pretrained " + pretrained +
                     " has changed since " + checkpoint +
                     " was trained on it; restore the base it was trained on");
  }
  auto base = base_weights(pretrained, config_value(meta, "model.name"));
  dequantize_quantized(base, meta, checkpoint);
  std::map<std::string, torch::Tensor> given(weights.begin(), weights.end());
  const double scaling = adapter_options(meta, checkpoint).scaling();
  std::map<std::string, torch::Tensor*> by_name;
  for (auto& [name, t] : base) by_name[name] = &t;
  torch::NoGradGuard no_grad;
  for (const auto& layer : adapted(weights)) {
    const auto w = by_name.find(layer + ".weight");
    const auto b = given.find(layer + kB);
    if (w == by_name.end() || b == given.end()) {
      throw UsageError("--merge: " + checkpoint + "'s adapter of " + layer +
                       " has no layer or no lora_B in the base " + pretrained);
    }
    torch::Tensor& weight = *w->second;
    try {
      weight = nn::merge_lora(weight, nn::lora_delta(given.at(layer + kA), b->second, scaling));
    } catch (const std::invalid_argument& e) {
      throw UsageError("--merge: " + checkpoint + "'s adapter of " + layer + ": " + e.what() +
                       "; merge it into the base it was trained on");
    }
  }
  return base;
}

checkpoint::NamedTensors hf_weights(const std::string& checkpoint, const nlohmann::json& meta,
                                    const checkpoint::NamedTensors& weights, bool merge) {
  if (merge) return merged_weights(checkpoint, meta, weights);
  if (holds_adapters(meta)) {
    throw UsageError("--format hf: " + checkpoint +
                     " holds the LoRA adapters of a run (model.lora), not a whole model; add "
                     "--merge to write its base with them merged, or use --format peft");
  }
  return weights;
}

}  // namespace trainer::cli
