// llama in Hugging Face's layout: the weights have the model's own names (LlamaForCausalLM's,
// MistralForCausalLM's, Qwen2ForCausalLM's, Qwen3ForCausalLM's); a tied model's file lacks
// lm_head.weight. config.json's fields map to the model's options; a field that would make the
// model compute something llama does not (another rope scaling, a sliding window, biases it lacks,
// another activation) is an error naming it (models/llama_hf_config.h reads the fields as
// transformers 4.57 and 5.x do). Defaults of absent fields are those of transformers' config
// class of the model_type. The export writes config.json in the layout of the folder the run
// started from (transformers 5's rope_parameters or 4's rope_theta and rope_scaling).
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "models/builtin.h"
#include "models/llama_hf_config.h"

namespace trainer::models {
namespace {

using llama_hf::bool_field;
using llama_hf::int_field;
using llama_hf::number_field;
using llama_hf::present;
using nlohmann::json;

// A config class's defaults, for the fields a config.json may leave out.
struct TypeDefaults {
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads, positions;
  int64_t head_dim;  // 0: hidden / heads
};

TypeDefaults defaults_of(const std::string& type) {
  if (type == "mistral") return {32000, 4096, 14336, 32, 32, 8, 4096 * 32, 0};
  if (type == "qwen2") return {151936, 4096, 22016, 32, 32, 32, 32768, 0};
  if (type == "qwen3") return {151936, 4096, 22016, 32, 32, 32, 32768, 128};
  return {32000, 4096, 11008, 32, 32, 0, 2048, 0};  // llama; kv heads 0: the heads'
}

// The parameters of the model `o` (options_of_config's) builds, biases and q/k norms left out.
double config_parameters(const json& o) {
  const auto d = [&](const char* key) { return static_cast<double>(o[key].get<int64_t>()); };
  const double hidden = d("n_embd"), heads = d("n_head"), head_dim = d("head_dim");
  const double kv = d("n_kv_head") > 0 ? d("n_kv_head") : heads;
  const double layer =
      hidden * head_dim * (2 * heads + 2 * kv) + 3 * hidden * d("intermediate_size") + 2 * hidden;
  const double embeddings = d("vocab_size") * hidden * (o["tie_embeddings"].get<bool>() ? 1 : 2);
  return embeddings + d("n_layer") * layer + hidden;
}

json options_of_config(const json& file, std::vector<std::string>& errors,
                       std::vector<std::string>& warnings) {
  const std::string type = file.value("model_type", std::string());
  const TypeDefaults d = defaults_of(type);
  json o;
  const auto i = [&](const char* key, int64_t fallback) {  // every size is positive
    const int64_t v = int_field(file, key, fallback, "", errors);
    if (v <= 0 && present(file, key)) {
      errors.push_back(std::string(key) + " is " + file[key].dump() +
                       ", expected a positive integer");
    }
    return v;
  };
  o["n_layer"] = i("num_hidden_layers", d.layers);
  o["n_embd"] = i("hidden_size", d.hidden);
  o["n_head"] = i("num_attention_heads", d.heads);
  // An explicit null: as many as the heads, in every config class.
  const bool kv_default = !file.contains("num_key_value_heads") && d.kv_heads > 0;
  o["n_kv_head"] = i("num_key_value_heads", kv_default ? d.kv_heads : o["n_head"].get<int64_t>());
  const int64_t heads = std::max<int64_t>(1, o["n_head"].get<int64_t>());
  o["head_dim"] = i("head_dim", d.head_dim > 0 && !file.contains("head_dim")
                                    ? d.head_dim
                                    : o["n_embd"].get<int64_t>() / heads);
  o["intermediate_size"] = i("intermediate_size", d.intermediate);
  o["vocab_size"] = i("vocab_size", d.vocab);
  o["block_size"] = i("max_position_embeddings", d.positions);
  o["rms_norm_eps"] = number_field(file, "rms_norm_eps", 1e-6, "", errors);
  o["tie_embeddings"] = bool_field(file, "tie_word_embeddings", false, errors);
  o["qkv_bias"] = type == "qwen2";
  o["qk_norm"] = type == "qwen3";
  llama_hf::rope_options(file, o, errors);
  llama_hf::check_known_fields(file, type, errors, warnings);
  return o;
}

// The run's value of option `key` ("model." + key in the flattened config) against `want`.
bool same_option(const std::string& ours, const json& want) {
  if (want.is_boolean()) return ours == (want.get<bool>() ? "true" : "false");
  if (want.is_string()) return ours == want.get<std::string>();
  try {
    const double a = std::stod(ours), b = want.get<double>();
    return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
  } catch (const std::exception&) {
    return false;
  }
}

// A config.json beside a weights file (model.pretrained: FILE) against the run's options.
void check_config(const json& file, const std::map<std::string, std::string>& config,
                  std::vector<std::string>& errors, std::vector<std::string>& warnings) {
  const auto o = options_of_config(file, errors, warnings);
  for (auto it = o.begin(); it != o.end(); ++it) {
    const auto ours = config.find("model." + it.key());
    if (ours == config.end()) continue;
    std::string value = ours->second;
    // 0: derived (the data's vocabulary, as many kv heads as heads, n_embd / n_head).
    if (value == "0" && it.key() == "vocab_size") continue;
    if (value == "0" && it.key() == "n_kv_head" && config.count("model.n_head")) {
      value = config.at("model.n_head");
    }
    if (value == "0" && it.key() == "head_dim" && config.count("model.n_embd") &&
        config.count("model.n_head") && std::stoll(config.at("model.n_head")) > 0) {
      value = std::to_string(std::stoll(config.at("model.n_embd")) /
                             std::stoll(config.at("model.n_head")));
    }
    if (!same_option(value, *it)) {
      errors.push_back("model." + it.key() + " is " + ours->second + ", the file's config.json " +
                       "makes it " + it->dump());
    }
  }
}

bool is_llama_layout(const NamedWeights& weights) {
  for (const auto& [name, t] : weights) {
    if (name == "model.embed_tokens.weight") return true;
  }
  return false;
}

// A tied model's file has no lm_head.weight: the embedding's, which loading ties.
NamedWeights fill_tied_head(const NamedWeights& weights) {
  NamedWeights out = weights;
  torch::Tensor embed;
  for (const auto& [name, t] : weights) {
    if (name == "lm_head.weight") return out;
    if (name == "model.embed_tokens.weight") embed = t;
  }
  if (embed.defined()) out.emplace_back("lm_head.weight", embed);
  return out;
}

// Option `key` of the run's flattened config ("model." + key), "" when absent.
std::string option(const std::map<std::string, std::string>& config, const std::string& key) {
  const auto it = config.find("model." + key);
  return it == config.end() ? std::string() : it->second;
}

int64_t int_option(const std::map<std::string, std::string>& config, const std::string& key,
                   int64_t fallback) {
  const std::string v = option(config, key);
  return v.empty() ? fallback : std::stoll(v);
}

double double_option(const std::map<std::string, std::string>& config, const std::string& key,
                     double fallback) {
  const std::string v = option(config, key);
  return v.empty() ? fallback : std::stod(v);
}

// The Hugging Face model type that computes the model: qwen3 with q/k norms, qwen2 with q/k/v
// biases, else llama. Throws ModelError for both.
std::string model_type_of(const std::map<std::string, std::string>& config) {
  const bool bias = option(config, "qkv_bias") == "true",
             norm = option(config, "qk_norm") == "true";
  if (bias && norm) {
    throw ModelError("model.qkv_bias",
                     "a llama with q/k/v biases (model.qkv_bias) and q/k norms (model.qk_norm) "
                     "has no Hugging Face model type (qwen2 has the biases, qwen3 the norms); "
                     "export it with --format pt");
  }
  return norm ? "qwen3" : bias ? "qwen2" : "llama";
}

json rope_scaling_json(const std::map<std::string, std::string>& config) {
  if (option(config, "rope_scaling") != "llama3") return nullptr;
  return {{"rope_type", "llama3"},
          {"factor", double_option(config, "rope_factor", 8.0)},
          {"low_freq_factor", double_option(config, "rope_low_freq_factor", 1.0)},
          {"high_freq_factor", double_option(config, "rope_high_freq_factor", 4.0)},
          {"original_max_position_embeddings", int_option(config, "rope_original_context", 8192)}};
}

// config.json for the model: every field its model type's config class reads for the
// architecture, the token ids unknown (null).
json hf_config_json(const std::map<std::string, std::string>& config, int64_t vocab, int64_t width,
                    int64_t layers) {
  const std::string type = model_type_of(config);
  const int64_t heads = int_option(config, "n_head", 4), kv = int_option(config, "n_kv_head", 0);
  const int64_t head_dim = int_option(config, "head_dim", 0);
  const char* arch = type == "qwen3"   ? "Qwen3ForCausalLM"
                     : type == "qwen2" ? "Qwen2ForCausalLM"
                                       : "LlamaForCausalLM";
  json c = {{"architectures", {arch}},
            {"model_type", type},
            {"vocab_size", vocab},
            {"hidden_size", width},
            {"intermediate_size", int_option(config, "intermediate_size", 172)},
            {"num_hidden_layers", layers},
            {"num_attention_heads", heads},
            {"num_key_value_heads", kv > 0 ? kv : heads},
            {"head_dim", head_dim > 0 ? head_dim : width / std::max<int64_t>(1, heads)},
            {"hidden_act", "silu"},
            {"max_position_embeddings", int_option(config, "block_size", 2048)},
            {"rms_norm_eps", double_option(config, "rms_norm_eps", 1e-5)},
            {"rope_theta", double_option(config, "rope_theta", 10000.0)},
            {"rope_scaling", rope_scaling_json(config)},
            {"tie_word_embeddings", option(config, "tie_embeddings") == "true"},
            {"attention_dropout", 0.0},
            {"initializer_range", 0.02},
            {"use_cache", true},
            {"bos_token_id", nullptr},
            {"eos_token_id", nullptr},
            {"torch_dtype", "float32"}};
  if (type != "qwen2") c["attention_bias"] = false;
  if (type == "llama") c["mlp_bias"] = false;
  if (type != "llama") {
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["max_window_layers"] = layers;
  }
  return c;
}

// The model's weights as save_pretrained writes them (a tied model without lm_head.weight) and
// their config.json.
std::pair<NamedWeights, json> to_hf(const NamedWeights& weights,
                                    const std::map<std::string, std::string>& config) {
  const bool tied = option(config, "tie_embeddings") == "true";
  NamedWeights out;
  int64_t vocab = 0, width = 0, layers = 0;
  for (const auto& [name, t] : weights) {
    if (name == "lm_head.weight" && tied) continue;
    out.emplace_back(name, t.contiguous());
    if (name == "model.embed_tokens.weight") vocab = t.size(0), width = t.size(1);
    const std::string norm = ".input_layernorm.weight";
    if (name.size() > norm.size() &&
        name.compare(name.size() - norm.size(), norm.size(), norm) == 0) {
      ++layers;
    }
  }
  return {out, hf_config_json(config, vocab, width, layers)};
}

}  // namespace

ForeignFormat llama_hf_format() {
  ForeignFormat f;
  f.name = "Hugging Face Llama";
  f.matches = is_llama_layout;
  f.to_trainer = fill_tied_head;
  f.from_trainer = to_hf;
  f.in_layout_of = llama_hf::in_layout_of;
  f.check_config = check_config;
  f.model_types = {"llama", "mistral", "qwen2", "qwen3"};
  f.options_of_config = options_of_config;
  f.parameter_count = config_parameters;
  return f;
}

}  // namespace trainer::models
