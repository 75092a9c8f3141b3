// gpt's weights in Hugging Face Transformers' GPT-2 layout (GPT2LMHeadModel): the same names as
// nanoGPT's, but the four projections are Conv1D weights, [in, out], the transpose of a Linear's;
// lm_head.weight is stored only when it is not tied to wte (tie_word_embeddings: false); every
// linear layer and layer norm has a bias.
#include <torch/torch.h>

#include <string>

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
  if (head.defined() || wte.defined()) out.emplace_back("lm_head.weight", head.defined() ? head : wte);
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
  const bool tied = !config.count("model.tie_embeddings") || config.at("model.tie_embeddings") != "false";
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

}  // namespace

ForeignFormat gpt2_hf_format() {
  ForeignFormat f;
  f.name = "Hugging Face GPT-2";
  f.matches = is_hf;
  f.to_trainer = from_hf;
  f.from_trainer = to_hf;
  return f;
}

}  // namespace trainer::models
