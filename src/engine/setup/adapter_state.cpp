#include "engine/setup/adapter_state.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "checkpoint/pretrained_identity.h"
#include "nn/lora.h"
#include "nn/rng.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

[[noreturn]] void config_error(const config::LoadedConfig& loaded, const std::string& key,
                               const std::string& message) {
  throw config::ConfigError({config::Issue{loaded.where(key), key, message}});
}

// The frozen parameters' names, shapes, dtypes and sampled bytes.
std::vector<uint8_t> sample_weights(const torch::nn::Module& model) {
  std::vector<uint8_t> out;
  for (const auto& [name, p] : nn::unique_named_parameters(model)) {
    if (p.requires_grad()) continue;
    const auto host = p.detach().to(torch::kCPU).contiguous();
    checkpoint::append_identity_text(
        out, name + ":" + c10::toString(host.scalar_type()) + ":" + c10::str(host.sizes()));
    const auto* data = static_cast<const uint8_t*>(host.data_ptr());
    checkpoint::append_identity_sample(
        out, host.nbytes(),
        [&](uint64_t offset, uint64_t n, uint8_t* dst) { std::memcpy(dst, data + offset, n); });
  }
  return out;
}

// Whether the checkpoint's `recorded` base identity is the base's, `here` (base_identity's):
// equal, or the identity checkpoints of a weights file model.pretrained recorded before it left
// the file's name out.
bool same_base(const std::string& recorded, const std::string& here,
               const std::string& pretrained) {
  if (recorded == here) return true;
  try {
    return !pretrained.empty() && checkpoint::is_pretrained_identity(pretrained, recorded);
  } catch (const std::exception&) {
    return false;  // read already for `here`
  }
}

// "q_proj, v_proj" of the adapted layers' names.
std::string target_list(const std::vector<std::string>& layers) {
  std::set<std::string> parts;
  for (const auto& name : layers) parts.insert(name.substr(name.rfind('.') + 1));
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

void log_adapters(const Components& parts, const config::LoraConfig& cfg,
                  const std::vector<std::string>& layers) {
  int64_t trainable = 0, total = nn::quantized_parameters(*parts.model);
  for (const auto& p : nn::unique_parameters(*parts.model)) {
    total += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
  log::info(strprintf(
      "LoRA: %zu layers adapted (%s), rank %" PRId64 ", scaling %s; %" PRId64 " of %" PRId64
      " parameters train (%.2f%%), the base frozen in %s%s",
      layers.size(), target_list(layers).c_str(), cfg.rank,
      format_number(nn::lora_options(cfg).scaling()).c_str(), trainable, total,
      100.0 * static_cast<double>(trainable) / static_cast<double>(total), cfg.base_dtype.c_str(),
      cfg.base_quant == "none" ? "" : (", linear layers in " + cfg.base_quant).c_str()));
}

}  // namespace

std::string base_identity(const torch::nn::Module& model, const std::string& pretrained) {
  if (!pretrained.empty()) return checkpoint::pretrained_identity(pretrained);
  const auto params = model.parameters(/*recurse=*/true);
  if (!params.empty() && params.front().is_meta()) return "planned";  // no values to hash
  return checkpoint::xxh64_hex(sample_weights(model));
}

void add_lora(Components& parts, const config::LoadedConfig& loaded) {
  const auto& cfg = loaded.cfg.model.lora;
  std::vector<std::string> layers;
  try {
    layers = nn::add_adapters(*parts.model, cfg.targets, nn::lora_options(cfg),
                              nn::lora_base_dtype(cfg.base_dtype));
  } catch (const nn::LoraTargetError& e) {
    config_error(loaded, "model.lora.targets",
                 std::string(e.what()) + " (model " + loaded.cfg.model.name + ")");
  } catch (const nn::LoraRankError& e) {
    config_error(loaded, "model.lora.rank", e.what());
  }
  try {
    parts.lora_base = base_identity(*parts.model, loaded.cfg.model.pretrained);
  } catch (const std::exception& e) {
    config_error(loaded, "model.pretrained", e.what());
  }
  log_adapters(parts, cfg, layers);
}

void add_seeded_lora(Components& parts, const config::LoadedConfig& loaded) {
  constexpr uint64_t kAdapterStream = 0x9E3779B97F4A7C15ULL;  // a seed apart from the model's
  nn::SeededDraws draws(static_cast<uint64_t>(loaded.cfg.seed) ^ kAdapterStream);
  add_lora(parts, loaded);
}

ParameterFill with_adapters(ParameterFill fill, const models::NetImpl& model) {
  auto drawn = std::make_shared<std::map<std::string, torch::Tensor>>();
  for (const auto& [name, p] : models::unique_named_parameters(model)) {
    if (nn::is_adapter_tensor(name)) (*drawn)[name] = p.detach().reshape({-1}).clone();  // [n]
  }
  return [fill = std::move(fill), drawn](const std::string& name, int64_t first,
                                         const torch::Tensor& dst) {
    const auto it = drawn->find(name);
    if (it == drawn->end()) return fill(name, first, dst);
    dst.copy_(it->second.narrow(0, first, dst.numel()).view(dst.sizes()));
  };
}

void split_adapters(Components& parts) {
  if (parts.lora_base.empty() || !parts.tp) return;
  const auto plan = nn::adapter_splits(*parts.model, parts.tp_plan);
  nn::keep_parts(*parts.model, plan, parts.tp->rank(), parts.tp->size());
  parts.tp_plan.insert(plan.begin(), plan.end());
}

checkpoint::NamedTensors saved_model_state(const Components& parts) {
  auto all = models::state_dict(*parts.model);
  if (parts.lora_base.empty()) return all;
  checkpoint::NamedTensors out;
  for (auto& [name, t] : all) {
    if (nn::is_adapter_tensor(name)) out.emplace_back(name, std::move(t));
  }
  return out;
}

void add_adapter_meta(const Components& parts, nlohmann::json& meta) {
  if (parts.lora_base.empty()) return;
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& [name, layer] : nn::adapted_layers(*parts.model)) layers.push_back(name);
  meta["lora"] = {{"base", parts.lora_base}, {"layers", layers}};
  // model.lora.base_quant: the layers the run computed with quantized weights (export --merge
  // merges into their dequantized weights).
  nlohmann::json quantized = nlohmann::json::array();
  for (const auto& [name, layer] : nn::quantizable_layers(*parts.model)) {
    if (layer->quantized()) quantized.push_back(name);
  }
  if (!quantized.empty()) meta["lora"]["quantized"] = quantized;
}

std::string load_adapters(Components& parts, const config::LoadedConfig& loaded,
                          const nlohmann::json& meta, const checkpoint::NamedTensors& weights,
                          const std::string& path) {
  const auto& m = loaded.cfg.model;
  const std::string base = meta.contains("lora") && meta["lora"].is_object()
                               ? meta["lora"].value("base", std::string())
                               : std::string();
  const std::string of =
      m.pretrained.empty() ? "the model built from the seed" : "model.pretrained " + m.pretrained;
  if (base.empty()) {
    config_error(loaded, "model.lora.rank",
                 "the checkpoint " + path +
                     " holds no LoRA adapters (its run trained without model.lora); load it "
                     "without model.lora, or start a new run");
  }
  if (!same_base(base, parts.lora_base, m.pretrained)) {
    config_error(loaded, "model.pretrained",
                 "the checkpoint " + path + "'s adapters were trained on another base than " + of +
                     " (base identity " + base + ", here " + parts.lora_base +
                     "); use the base it was trained on (a copy of it at any path: "
                     "--set model.pretrained=PATH), or start a new run");
  }
  const std::map<std::string, torch::Tensor> given(weights.begin(), weights.end());
  std::set<std::string> unused;
  for (const auto& [name, t] : weights) unused.insert(name);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // model's, checkpoint's
  std::string problems;
  const auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : ", ") + p; };
  // (Under fsdp the adapters' shapes are known while their memory is not gathered.)
  for (const auto& [name, t] : saved_model_state(parts)) {
    const auto it = given.find(name);
    if (it == given.end()) {
      add("missing " + name);
    } else if (it->second.sizes() != t.sizes()) {
      add(name + " of shape " + c10::str(it->second.sizes()) + ", the model's " +
          c10::str(t.sizes()));
    } else {
      copies.emplace_back(t, it->second);
    }
    unused.erase(name);
  }
  for (const auto& name : unused) add("unexpected " + name);
  if (!problems.empty()) return problems;
  if (parts.fsdp) {  // the adapters are the shards' trainable parameters
    return parts.fsdp->load_parameters([&](const std::string& name) {
      const auto it = given.find(name);
      return it == given.end() ? torch::Tensor() : it->second;
    });
  }
  torch::NoGradGuard no_grad;
  for (auto& [mine, theirs] : copies) mine.copy_(theirs);
  return "";
}

}  // namespace trainer::engine
