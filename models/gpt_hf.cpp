// gpt's weights in Hugging Face Transformers' GPT-2 layout (GPT2LMHeadModel): the same names as
// nanoGPT's, but the four projections are Conv1D weights, [in, out], the transpose of a Linear's;
// lm_head.weight is stored only when it is not tied to wte (tie_word_embeddings: false); every
// linear layer and layer norm has a bias.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "models/builtin.h"

namespace trainer::models {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The weights stored transposed in GPT-2's Conv1D layers.
bool conv1d_weight(const std::string& name) {
  for (const char* tail :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (ends_with(name, tail)) return true;
  }
  return false;
}

// Whether `weights` are GPT-2's: the first block's c_attn weight is [C, 3C], not [3C, C].
bool is_hf(const NamedWeights& weights) {
  for (const auto& [name, t] : weights) {
    if (ends_with(name, "h.0.attn.c_attn.weight") && t.dim() == 2) {
      return t.size(1) == 3 * t.size(0);
    }
  }
  return false;
}

NamedWeights from_hf(const NamedWeights& weights) {
  NamedWeights out;
  torch::Tensor wte, head;
  for (const auto& [hf_name, t] : weights) {
    // GPT2Model's names lack the "transformer." of GPT2LMHeadModel's; the causal masks some
    // versions store are not weights.
    const std::string name = hf_name.rfind("transformer.", 0) == 0 || hf_name == "lm_head.weight"
                                 ? hf_name
                                 : "transformer." + hf_name;
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;
    if (name == "lm_head.weight") {
      head = t;
      continue;
    }
    out.emplace_back(name, conv1d_weight(name) ? t.t().contiguous() : t);
    if (name == "transformer.wte.weight") wte = t;
  }
  // The file's head where it stores one (an untied model's, or a tied one's copy), else wte's:
  // loading checks that a tied model gets equal tensors.
  if (head.defined() || wte.defined())
    out.emplace_back("lm_head.weight", head.defined() ? head : wte);
  return out;
}

// The biases a model with model.bias: false lacks, as zeros: its layers' outputs unchanged.
void add_zero_biases(NamedWeights& out) {
  std::map<std::string, torch::Tensor> have(out.begin(), out.end());
  NamedWeights extra;
  for (const auto& [name, t] : out) {
    if (!ends_with(name, ".weight") || name == "transformer.wte.weight" ||
        name == "transformer.wpe.weight" || name == "lm_head.weight") {
      continue;
    }
    const std::string bias = name.substr(0, name.size() - 6) + "bias";
    // A Conv1D weight is [in, out], a layer norm's [C]: the bias has the last size.
    if (!have.count(bias)) extra.emplace_back(bias, torch::zeros({t.size(-1)}, t.options()));
  }
  out.insert(out.end(), extra.begin(), extra.end());
}

int64_t config_int(const std::map<std::string, std::string>& config, const std::string& key,
                   int64_t fallback) {
  const auto it = config.find(key);
  return it == config.end() ? fallback : std::stoll(it->second);
}

std::pair<NamedWeights, nlohmann::json> to_hf(const NamedWeights& weights,
                                              const std::map<std::string, std::string>& config) {
  NamedWeights out;
  int64_t layers = 0, vocab = 0, positions = 0, width = 0;
  const bool tied =
      !config.count("model.tie_embeddings") || config.at("model.tie_embeddings") != "false";
  for (const auto& [name, t] : weights) {
    // Tied to wte: from_pretrained ties it again.
    if (name == "lm_head.weight" && tied) continue;
    out.emplace_back(name, conv1d_weight(name) ? t.t().contiguous() : t.contiguous());
    if (ends_with(name, ".ln_1.weight")) ++layers;
    if (name == "transformer.wte.weight") vocab = t.size(0), width = t.size(1);
    if (name == "transformer.wpe.weight") positions = t.size(0);
  }
  add_zero_biases(out);
  const nlohmann::json end_of_text = vocab > 50256 ? nlohmann::json(50256) : nlohmann::json();
  const double dropout = config.count("model.dropout") ? std::stod(config.at("model.dropout")) : 0;
  const nlohmann::json hf_config = {{"architectures", {"GPT2LMHeadModel"}},
                                    {"model_type", "gpt2"},
                                    {"vocab_size", vocab},
                                    {"n_positions", positions},
                                    {"n_ctx", positions},
                                    {"n_embd", width},
                                    {"n_layer", layers},
                                    {"n_head", config_int(config, "model.n_head", 12)},
                                    {"n_inner", nullptr},
                                    {"activation_function", "gelu_new"},
                                    {"resid_pdrop", dropout},
                                    {"embd_pdrop", dropout},
                                    {"attn_pdrop", dropout},
                                    {"layer_norm_epsilon", 1e-5},
                                    {"initializer_range", 0.02},
                                    {"tie_word_embeddings", tied},
                                    // GPT-2's <|endoftext|>, where the vocabulary has it.
                                    {"bos_token_id", end_of_text},
                                    {"eos_token_id", end_of_text},
                                    {"torch_dtype", "float32"}};
  return {out, hf_config};
}

// Hugging Face GPT-2's config.json against the model: the architecture's settings must be the
// trainer's gpt's (its GELU is the tanh approximation, its layer norms' epsilon 1e-5).
void check_hf_config(const nlohmann::json& file, const std::map<std::string, std::string>& config,
                     std::vector<std::string>& errors, std::vector<std::string>& warnings) {
  const auto model = [&](const std::string& key) {
    const auto it = config.find("model." + key);
    return it == config.end() ? std::string() : it->second;
  };
  const auto is = [&](const char* key, const nlohmann::json& want, const std::string& what) {
    if (!file.contains(key) || file[key].is_null()) return;
    const auto& v = file[key];
    const bool same = v.is_number() && want.is_number()
                          ? std::abs(v.get<double>() - want.get<double>()) <=
                                1e-12 * std::max(1.0, std::abs(want.get<double>()))
                          : v == want;
    if (!same) errors.push_back(std::string(key) + " is " + v.dump() + ", " + what);
  };
  if (file.contains("activation_function") && file["activation_function"].is_string()) {
    const auto f = file["activation_function"].get<std::string>();
    if (f != "gelu_new" && f != "gelu_pytorch_tanh" && f != "gelu_fast") {
      errors.push_back("activation_function is \"" + f +
                       "\", gpt computes GELU's tanh approximation (gelu_new)");
    }
  }
  is("layer_norm_epsilon", 1e-5, "gpt's layer norms use 1e-5");
  for (const auto& [key, ours] : {std::pair<const char*, const char*>{"n_embd", "n_embd"},
                                  {"n_layer", "n_layer"},
                                  {"n_head", "n_head"},
                                  {"n_positions", "block_size"}}) {
    if (!model(ours).empty()) {
      is(key, std::stoll(model(ours)), std::string("model.") + ours + " is " + model(ours));
    }
  }
  if (!model("n_embd").empty()) {
    is("n_inner", 4 * std::stoll(model("n_embd")), "gpt's MLP is 4 x model.n_embd wide");
  }
  if (model("vocab_size") != "" && model("vocab_size") != "0") {
    is("vocab_size", std::stoll(model("vocab_size")), "model.vocab_size is " + model("vocab_size"));
  }
  if (!model("tie_embeddings").empty()) {
    const bool tied = model("tie_embeddings") == "true";
    is("tie_word_embeddings", tied,
       tied ? "lm_head.weight is a tensor of its own: set model.tie_embeddings: false"
            : "lm_head.weight is transformer.wte.weight: set model.tie_embeddings: true");
  }
  is("scale_attn_weights", true, "gpt divides attention scores by sqrt(head size)");
  is("scale_attn_by_inverse_layer_idx", false, "gpt does not scale them by the layer's depth");
  is("add_cross_attention", false, "gpt has no cross-attention");
  if (!model("dropout").empty()) {
    const double dropout = std::stod(model("dropout"));
    for (const char* key : {"attn_pdrop", "resid_pdrop", "embd_pdrop"}) {
      if (file.contains(key) && file[key].is_number() &&
          std::abs(file[key].get<double>() - dropout) > 1e-12) {
        warnings.push_back(std::string(key) + " is " + file[key].dump() +
                           ", training uses model.dropout " + model("dropout"));
      }
    }
  }
}

}  // namespace

ForeignFormat gpt2_hf_format() {
  ForeignFormat f;
  f.name = "Hugging Face GPT-2";
  f.matches = is_hf;
  f.to_trainer = from_hf;
  f.from_trainer = to_hf;
  f.check_config = check_hf_config;
  return f;
}

}  // namespace trainer::models
