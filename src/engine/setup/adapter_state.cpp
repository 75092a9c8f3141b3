#include "engine/setup/adapter_state.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "checkpoint/hf_folder.h"
#include "nn/lora.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kChunk = 64 << 10;  // bytes hashed at each sampled offset
constexpr uint64_t kChunks = 64;       // sampled offsets per file or tensor

[[noreturn]] void config_error(const config::LoadedConfig& loaded, const std::string& key,
                               const std::string& message) {
  throw config::ConfigError({config::Issue{loaded.where(key), key, message}});
}

// Appends `bytes` [0, size) to `out`: whole when small, else kChunks chunks spread evenly over
// them (the first and the last included), so that two different weights differ in the sample.
void sample_into(std::vector<uint8_t>& out, uint64_t size,
                 const std::function<void(uint64_t offset, uint64_t n, uint8_t* dst)>& read) {
  const auto append = [&](uint64_t offset, uint64_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    read(offset, n, out.data() + at);
  };
  if (size <= kChunk * kChunks) return append(0, size);
  for (uint64_t i = 0; i < kChunks; ++i) append((size - kChunk) / (kChunks - 1) * i, kChunk);
}

void append_text(std::vector<uint8_t>& out, const std::string& text) {
  out.insert(out.end(), text.begin(), text.end());
  out.push_back(0);
}

// A file's name, size and sampled bytes.
void sample_file(std::vector<uint8_t>& out, const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (!in || ec) throw std::runtime_error(file.string() + ": cannot be read");
  append_text(out, file.filename().string() + ":" + std::to_string(size));
  sample_into(out, size, [&](uint64_t offset, uint64_t n, uint8_t* dst) {
    in.seekg(static_cast<std::streamoff>(offset));
    in.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in) throw std::runtime_error(file.string() + ": cannot be read");
  });
}

// The files that define model.pretrained's weights: a folder's config.json and the weight files
// that loading reads (checkpoint::hf_weight_files: model.safetensors, else the index and its
// shards), by name; or the one file.
std::vector<fs::path> base_files(const std::string& pretrained) {
  if (!checkpoint::is_directory(pretrained)) return {pretrained};
  std::vector<fs::path> out;
  const fs::path config = fs::path(pretrained) / "config.json";
  std::error_code ec;
  if (fs::is_regular_file(config, ec)) out.push_back(config);
  for (const auto& file : checkpoint::hf_weight_files(pretrained)) out.emplace_back(file);
  std::sort(out.begin(), out.end());
  return out;
}

// The frozen parameters' names, shapes, dtypes and sampled bytes.
std::vector<uint8_t> sample_weights(const torch::nn::Module& model) {
  std::vector<uint8_t> out;
  for (const auto& [name, p] : nn::unique_named_parameters(model)) {
    if (p.requires_grad()) continue;
    const auto host = p.detach().to(torch::kCPU).contiguous();
    append_text(out, name + ":" + c10::toString(host.scalar_type()) + ":" + c10::str(host.sizes()));
    const auto* data = static_cast<const uint8_t*>(host.data_ptr());
    sample_into(out, host.nbytes(), [&](uint64_t offset, uint64_t n, uint8_t* dst) {
      std::memcpy(dst, data + offset, n);
    });
  }
  return out;
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
  int64_t trainable = 0, total = 0;
  for (const auto& p : nn::unique_parameters(*parts.model)) {
    total += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
  log::info(strprintf("LoRA: %zu layers adapted (%s), rank %" PRId64 ", scaling %s; %" PRId64
                      " of %" PRId64 " parameters train (%.2f%%), the base frozen in %s",
                      layers.size(), target_list(layers).c_str(), cfg.rank,
                      format_number(nn::lora_options(cfg).scaling()).c_str(), trainable, total,
                      100.0 * static_cast<double>(trainable) / static_cast<double>(total),
                      cfg.base_dtype.c_str()));
}

}  // namespace

std::string pretrained_identity(const std::string& pretrained) {
  std::vector<uint8_t> bytes;
  for (const auto& file : base_files(pretrained)) sample_file(bytes, file);
  return checkpoint::xxh64_hex(bytes);
}

std::string base_identity(const torch::nn::Module& model, const std::string& pretrained) {
  if (!pretrained.empty()) return pretrained_identity(pretrained);
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
  if (base != parts.lora_base) {
    config_error(loaded, "model.pretrained",
                 "the checkpoint " + path + "'s adapters were trained on another base than " + of +
                     " (base identity " + base + ", here " + parts.lora_base +
                     "); use the base it was trained on, or start a new run");
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
