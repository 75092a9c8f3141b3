// config.json's fields for llama, as transformers reads them (models/llama_hf_config.h).
#include "models/llama_hf_config.h"

#include <cmath>
#include <set>

namespace trainer::models::llama_hf {

bool present(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && !j[key].is_null();
}

int64_t int_field(const json& j, const char* key, int64_t fallback, const std::string& where,
                  std::vector<std::string>& errors) {
  if (!present(j, key)) return fallback;
  const auto& v = j[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
      std::abs(v.get<double>()) < 9e18) {
    return static_cast<int64_t>(v.get<double>());
  }
  errors.push_back(where + key + " is " + v.dump() + ", expected an integer");
  return fallback;
}

double number_field(const json& j, const char* key, double fallback, const std::string& where,
                    std::vector<std::string>& errors) {
  if (!present(j, key)) return fallback;
  if (j[key].is_number()) return j[key].get<double>();
  errors.push_back(where + key + " is " + j[key].dump() + ", expected a number");
  return fallback;
}

bool bool_field(const json& j, const char* key, bool fallback, std::vector<std::string>& errors) {
  if (!present(j, key)) return fallback;
  if (j[key].is_boolean()) return j[key].get<bool>();
  errors.push_back(std::string(key) + " is " + j[key].dump() + ", expected true or false");
  return fallback;
}

namespace {

// Whether config.json's quantization_config is bitsandbytes' 4-bit NF4, which the engine reads as
// a quantized LoRA base (model.lora.base_quant: nf4).
bool bnb_nf4(const nlohmann::json& q) {
  return q.is_object() && q.value("quant_method", "") == "bitsandbytes" &&
         q.value("load_in_4bit", false) && q.value("bnb_4bit_quant_type", "fp4") == "nf4";
}

// The scaling options of one rotary dict (`at`: "rope_scaling." or "rope_parameters."): none, or
// llama3's four numbers. Without a type the dict is unscaled when `untyped_default` (transformers
// 5's rope_parameters) and an error otherwise (transformers 4 fails on it).
json scaling_options(const json& r, const std::string& at, bool untyped_default,
                     std::vector<std::string>& errors) {
  json o = {{"rope_scaling", "none"}};
  const std::string name = at.substr(0, at.size() - 1);
  if (!r.is_object()) {
    errors.push_back(name + " is " + r.dump() + ", expected null or an object");
    return o;
  }
  if (present(r, "rope_type") && present(r, "type") && r["rope_type"] != r["type"]) {
    errors.push_back(at + "rope_type is " + r["rope_type"].dump() + " and " + at + "type is " +
                     r["type"].dump() +
                     ": transformers 4 computes the rotary embeddings of `type`, transformers 5 "
                     "those of `rope_type`; keep one of them");
    return o;
  }
  const double partial = number_field(r, "partial_rotary_factor", 1.0, at, errors);
  if (partial != 1.0) {
    errors.push_back(at + "partial_rotary_factor is " + r["partial_rotary_factor"].dump() +
                     ": llama rotates every dimension of a head");
  }
  const char* type_key = present(r, "rope_type") ? "rope_type" : "type";
  std::string type = untyped_default ? "default" : "";
  if (present(r, type_key)) {
    type = r[type_key].is_string() ? r[type_key].get<std::string>() : r[type_key].dump();
  }
  if (type == "default") return o;
  if (type != "llama3") {
    errors.push_back(at + type_key + " is \"" + type +
                     "\": llama computes rotary embeddings unscaled or with llama3's scaling only");
    return o;
  }
  for (const char* key :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    if (!present(r, key)) errors.push_back(at + key + " is missing (llama3 scaling needs it)");
  }
  o["rope_scaling"] = "llama3";
  o["rope_factor"] = number_field(r, "factor", 8.0, at, errors);
  o["rope_low_freq_factor"] = number_field(r, "low_freq_factor", 1.0, at, errors);
  o["rope_high_freq_factor"] = number_field(r, "high_freq_factor", 4.0, at, errors);
  o["rope_original_context"] = int_field(r, "original_max_position_embeddings", 8192, at, errors);
  return o;
}

// Whether `p` is rope_parameters with one entry per layer type ({"full_attention": {...}}).
bool per_layer_type(const json& p) {
  if (!p.is_object() || p.empty()) return false;
  for (const auto& [key, value] : p.items()) {
    if (!value.is_object()) return false;
  }
  return true;
}

// transformers 5's rope_parameters as one dict: itself, or the entry of every layer type when all
// are equal; null (an error) otherwise.
const json* one_rope_dict(const json& p, std::vector<std::string>& errors) {
  if (!per_layer_type(p)) return &p;
  std::string types;
  for (const auto& [key, value] : p.items()) types += (types.empty() ? "" : ", ") + key;
  for (const auto& [key, value] : p.items()) {
    if (value != p.begin().value()) {
      errors.push_back("rope_parameters has different settings per layer type (" + types +
                       "): llama computes one rotary embedding for every layer");
      return nullptr;
    }
  }
  return &p.begin().value();
}

std::string number_text(double v) {
  return json(v).dump();
}

}  // namespace

void rope_options(const json& file, json& o, std::vector<std::string>& errors) {
  const double top_theta = number_field(file, "rope_theta", 10000.0, "", errors);
  // A rope_scaling that is not empty is what transformers computes, with the top-level
  // rope_theta: transformers 4 knows nothing else, transformers 5 replaces rope_parameters by it.
  const bool legacy = present(file, "rope_scaling") &&
                      !(file["rope_scaling"].is_object() && file["rope_scaling"].empty());
  json scaling = legacy ? scaling_options(file["rope_scaling"], "rope_scaling.", false, errors)
                        : json{{"rope_scaling", "none"}};
  double theta = top_theta;
  const json* p =
      present(file, "rope_parameters") ? one_rope_dict(file["rope_parameters"], errors) : nullptr;
  if (p != nullptr) {
    const json from_parameters = scaling_options(*p, "rope_parameters.", true, errors);
    const double p_theta = number_field(*p, "rope_theta", top_theta, "rope_parameters.", errors);
    if (legacy && (from_parameters != scaling || p_theta != top_theta)) {
      errors.push_back("rope_scaling is " + file["rope_scaling"].dump() + " (rope_theta " +
                       number_text(top_theta) + ") and rope_parameters is " +
                       file["rope_parameters"].dump() +
                       ": transformers computes rope_scaling and rope_theta and ignores "
                       "rope_parameters; keep one of them");
    } else if (!legacy) {
      scaling = from_parameters;
      theta = p_theta;
      if (present(*p, "rope_theta") && present(file, "rope_theta") && p_theta != top_theta) {
        errors.push_back("rope_parameters.rope_theta is " + number_text(p_theta) +
                         " and rope_theta is " + number_text(top_theta) +
                         ": transformers 5 computes the first, transformers 4 the second; keep "
                         "one of them");
      }
    }
  }
  o["rope_theta"] = theta;
  o.update(scaling);
}

namespace {

// The fields of transformers' config class of `type` (4.57's __init__ parameters, 5.x's dataclass
// fields) and the fields its modeling code reads from any config (getattr): what llama reads
// (options_of_config), what it checks for the values it computes (hidden_act silu, no biases,
// no sliding window in use, ...), and what does not change the model.
std::set<std::string> type_fields(const std::string& type) {
  std::set<std::string> fields = {
      // read
      "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
      "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
      "tie_word_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
      // checked
      "hidden_act", "attention_dropout", "partial_rotary_factor", "quantization_config",
      // neutral (the rotary scalings that use it are refused)
      "initializer_range", "use_cache", "original_max_position_embeddings"};
  if (type == "llama") {
    fields.insert({"attention_bias", "mlp_bias"});  // checked
    fields.insert("pretraining_tp");                // neutral: transformers 4.57 does not read it
  }
  if (type == "mistral") fields.insert("sliding_window");  // checked
  if (type == "qwen2" || type == "qwen3") {
    fields.insert({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"});
  }
  if (type == "qwen3") fields.insert("attention_bias");  // checked
  return fields;
}

// PretrainedConfig's fields (4.57 and 5.x) and the keys transformers reads beside them: none
// changes what a causal language model computes (pruned_heads, checked, aside).
const std::set<std::string>& generic_fields() {
  // clang-format off
  static const std::set<std::string> fields = {
      "add_cross_attention", "architectures", "attn_implementation", "auto_map", "bad_words_ids",
      "begin_suppress_tokens", "bos_token_id", "chunk_size_feed_forward",
      "cross_attention_hidden_size", "decoder_start_token_id", "diversity_penalty", "do_sample",
      "dtype", "early_stopping", "encoder_no_repeat_ngram_size", "eos_token_id",
      "exponential_decay_length_penalty", "finetuning_task", "forced_bos_token_id",
      "forced_eos_token_id", "id2label", "is_decoder", "is_encoder_decoder", "label2id",
      "length_penalty", "max_length", "min_length", "model_type", "no_repeat_ngram_size",
      "num_beam_groups", "num_beams", "num_labels", "num_return_sequences", "output_attentions",
      "output_hidden_states", "output_scores", "pad_token_id", "prefix", "problem_type",
      "pruned_heads", "remove_invalid_values", "repetition_penalty", "return_dict",
      "return_dict_in_generate", "sep_token_id", "suppress_tokens", "task_specific_params",
      "temperature", "tf_legacy_loss", "tie_encoder_decoder", "tokenizer_class", "top_k", "top_p",
      "torch_dtype", "torchscript", "transformers_version", "typical_p", "use_bfloat16"};
  // clang-format on
  return fields;
}

// Mistral's sliding window whenever sliding_window is set (MistralConfig's default is 4096),
// Qwen 2's and 3's with use_sliding_window on the layers it applies to; an error when it is
// narrower than the context.
void check_sliding_window(const json& file, const std::string& type,
                          std::vector<std::string>& errors) {
  const bool qwen = type == "qwen2" || type == "qwen3";
  if (type != "mistral" && !qwen) return;
  std::vector<std::string> ignored;
  const int64_t layers = int_field(file, "num_hidden_layers", 32, "", ignored);
  const int64_t positions =
      int_field(file, "max_position_embeddings", qwen ? 32768 : 4096 * 32, "", ignored);
  const bool no_window = (qwen && !bool_field(file, "use_sliding_window", false, errors)) ||
                         (file.contains("sliding_window") && file["sliding_window"].is_null());
  if (no_window && qwen && present(file, "layer_types") && file["layer_types"].is_array()) {
    for (const auto& t : file["layer_types"]) {
      if (t != "sliding_attention") continue;
      errors.push_back(
          "layer_types has sliding_attention layers without a sliding window "
          "(use_sliding_window false or sliding_window null): transformers fails on it; "
          "make them full_attention");
      return;
    }
  }
  if (no_window) return;
  const int64_t window = int_field(file, "sliding_window", 4096, "", errors);
  bool sliding_layer = true;  // Mistral's every layer
  if (qwen && present(file, "layer_types") && file["layer_types"].is_array()) {
    sliding_layer = false;
    for (const auto& t : file["layer_types"]) sliding_layer |= t == "sliding_attention";
  } else if (qwen) {
    sliding_layer = int_field(file, "max_window_layers", 28, "", errors) < layers;
  }
  if (!sliding_layer || window >= positions) return;
  errors.push_back(std::string(qwen ? "use_sliding_window is true with " : "") + "sliding_window " +
                   std::to_string(window) + " < max_position_embeddings " +
                   std::to_string(positions) + ": attention would see the last " +
                   std::to_string(window) +
                   " tokens only, llama's sees the whole context (a config with " +
                   (qwen ? "use_sliding_window: false" : "sliding_window: null") + " loads)");
}

// The checked fields' values that llama does not compute: activation, biases, partial rotation,
// quantisation, pruned heads, layer types.
void check_math_fields(const json& file, const std::string& type, std::vector<std::string>& errors,
                       std::vector<std::string>& warnings) {
  if (present(file, "hidden_act")) {
    const auto& act = file["hidden_act"];
    if (act != "silu" && act != "swish") {
      errors.push_back("hidden_act is " + act.dump() + ": llama's MLP is SwiGLU (silu)");
    }
  }
  if ((type == "llama" || type == "qwen3") && bool_field(file, "attention_bias", false, errors)) {
    errors.push_back("attention_bias is true: " + type +
                     "'s q, k, v and o projections then have biases; llama has q/k/v biases only "
                     "(model.qkv_bias, as qwen2)");
  }
  if (type == "llama" && bool_field(file, "mlp_bias", false, errors)) {
    errors.push_back("mlp_bias is true: llama's MLP projections have no biases");
  }
  const double partial = number_field(file, "partial_rotary_factor", 1.0, "", errors);
  if (partial != 1.0) {
    errors.push_back("partial_rotary_factor is " + file["partial_rotary_factor"].dump() +
                     ": llama rotates every dimension of a head");
  }
  if (present(file, "quantization_config") && !bnb_nf4(file["quantization_config"])) {
    errors.push_back("quantization_config is " + file["quantization_config"].dump() +
                     ": llama loads unquantised weights and bitsandbytes' 4-bit NF4 ones "
                     "(quant_method bitsandbytes, load_in_4bit, bnb_4bit_quant_type nf4)");
  }
  if (present(file, "pruned_heads") && !file["pruned_heads"].empty()) {
    errors.push_back("pruned_heads is " + file["pruned_heads"].dump() +
                     ": llama keeps every attention head");
  }
  if ((type == "qwen2" || type == "qwen3") && present(file, "layer_types")) {
    const auto& types = file["layer_types"];
    for (size_t i = 0; types.is_array() && i < types.size(); ++i) {
      if (types[i] != "full_attention" && types[i] != "sliding_attention") {
        errors.push_back("layer_types[" + std::to_string(i) + "] is " + types[i].dump() +
                         ": llama's layers are full (or sliding-window) attention");
        break;
      }
    }
  }
  const double dropout = number_field(file, "attention_dropout", 0.0, "", errors);
  if (dropout != 0.0) {
    warnings.push_back("attention_dropout is " + file["attention_dropout"].dump() +
                       ": llama trains without dropout");
  }
}

}  // namespace

void check_known_fields(const json& file, const std::string& type, std::vector<std::string>& errors,
                        std::vector<std::string>& warnings) {
  check_sliding_window(file, type, errors);
  check_math_fields(file, type, errors, warnings);
  const auto fields = type_fields(type);
  std::string unknown;
  int count = 0;
  for (const auto& [key, value] : file.items()) {
    // Keys beginning with "_" are transformers' bookkeeping (_name_or_path, _attn_implementation).
    if (key.empty() || key[0] == '_' || fields.count(key) || generic_fields().count(key)) continue;
    unknown += (unknown.empty() ? "" : ", ") + key;
    ++count;
  }
  if (count == 0) return;
  warnings.push_back(std::string(count == 1 ? "field " : "fields ") + unknown +
                     (count == 1 ? " is not a field" : " are not fields") +
                     " of transformers' config of model_type " + type +
                     (count == 1 ? ": transformers ignores it" : ": transformers ignores them") +
                     ", and so does llama");
}

json in_layout_of(json config, const json& source) {
  if (!source.is_object() || !config.is_object()) return config;
  if (present(source, "rope_parameters")) {
    json p = {{"rope_type", "default"}, {"rope_theta", config.value("rope_theta", 10000.0)}};
    if (config.contains("rope_scaling") && config["rope_scaling"].is_object()) {
      for (const auto& [key, value] : config["rope_scaling"].items()) p[key] = value;
    }
    config.erase("rope_theta");
    config.erase("rope_scaling");
    if (per_layer_type(source["rope_parameters"])) {
      json nested = json::object();
      for (const auto& [key, value] : source["rope_parameters"].items()) nested[key] = p;
      config["rope_parameters"] = nested;
    } else {
      config["rope_parameters"] = p;
    }
  }
  return config;
}

}  // namespace trainer::models::llama_hf
