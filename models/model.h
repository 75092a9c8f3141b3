// Networks and their registry, keyed by the YAML `model.name`.
//
// Adding a model: one file with its options struct (its own `model.` keys, config/options.h), its
// network and a `register_<name>(ModelRegistry&)` function, and one line in models/registry.cpp
// naming it.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/registry.h"
#include "nn/blocks.h"
#include "nn/parameters.h"
#include "nn/tensor_parallel.h"

namespace trainer::models {

// What the data looks like to the model.
struct InputSpec {
  std::vector<int64_t> sample_shape;  // one sample, e.g. {1, 28, 28}
  int64_t num_classes = 0;            // logits per sample
};

// A network mapping inputs [B, ...sample_shape] to logits [B, num_classes].
class NetImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;

  // Whether forward_packed keeps packed documents apart (data.pack).
  virtual bool takes_positions() const { return false; }
  // The logits of token ids x [B, T] whose rows hold several documents, `positions` [B, T] each
  // token's position within its document (data::Batch::positions: rotations restart at each
  // document, attention stays inside it); forward(x) when positions is undefined. Throws
  // ModelError (key data.pack) for positions when the model does not take them.
  virtual torch::Tensor forward_packed(torch::Tensor x, const torch::Tensor& positions);

  // The weight [V, C] of a language model's output layer when it is a plain product
  // (logits = hidden · weightᵀ, no bias), so that a loss may take the hidden states and the
  // weight instead of the logits (losses/output_loss.h); undefined when the model has no such
  // layer (its rows split over a tensor-parallel group included).
  virtual torch::Tensor output_weight() const { return {}; }
  // forward_packed up to its output layer: the hidden states [B, T, C] it multiplies by
  // output_weight(). Throws std::logic_error when output_weight() is undefined.
  virtual torch::Tensor forward_hidden(torch::Tensor x, const torch::Tensor& positions);

  // The blocks in forward order (transformer layers, residual blocks): the units sharded training
  // gathers one at a time. None for models without blocks.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> blocks() const { return {}; }

  // Hooks around every block's forward from now on (null: none); they must outlive the model's
  // use.
  void set_block_hooks(nn::BlockHooks* hooks) { runner_.set_hooks(hooks); }

  // Tensor parallelism (dist.tp_size): keeps this rank's part of every layer the model splits
  // over `tp`'s group; from then on forward computes with the group's collectives, every rank of
  // the group given the same input, and returns this rank's part of the outputs (a
  // vocabulary-parallel [..., K / tp]). Returns how the parameters split. Throws ModelError
  // (key dist.tp_size) when the model does not split or its sizes do not divide by the group's.
  virtual nn::SplitPlan split_over(std::shared_ptr<nn::TensorParallel> tp);

 protected:
  nn::BlockRunner runner_;  // runs the blocks; a model with blocks gives it its checkpoint policy
};
using Net = std::shared_ptr<NetImpl>;

// Thrown when the configuration and the data do not fit the model (e.g. lenet on 1-D samples).
class ModelError : public std::invalid_argument {
 public:
  ModelError(std::string key, const std::string& message)
      : std::invalid_argument(message), key_(std::move(key)) {}
  // The config key the problem is about, e.g. "model.channels".
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

using ModelFactory = std::function<Net(const config::ModelConfig& cfg, const InputSpec& input)>;

// Tensors under their names.
using NamedWeights = std::vector<std::pair<std::string, torch::Tensor>>;

// Another library's layout of a model's weights (gpt: Hugging Face Transformers' GPT-2).
struct ForeignFormat {
  std::string name;  // e.g. "Hugging Face GPT-2"
  // Whether `weights` are in this layout rather than the trainer's.
  std::function<bool(const NamedWeights& weights)> matches;
  // The trainer's names and layout from this layout.
  std::function<NamedWeights(const NamedWeights& weights)> to_trainer;
  // This layout and its config file (Hugging Face's config.json) from the trainer's weights and
  // the run's flattened config ("model.n_head" -> "12").
  std::function<std::pair<NamedWeights, nlohmann::json>(
      const NamedWeights& weights, const std::map<std::string, std::string>& config)>
      from_trainer;
  // from_trainer's config file in the layout of `source_config`, the config file of the folder
  // the run started from (model.pretrained: DIR; null when none): e.g. the layout of the
  // transformers version that wrote it. Null: from_trainer's layout always.
  std::function<nlohmann::json(const nlohmann::json& config, const nlohmann::json& source_config)>
      in_layout_of;
  // The settings of this layout's config file (Hugging Face's config.json beside the weights)
  // against the model's (the run's flattened config, "model.n_head" -> "12"): `errors`, one line
  // each, for what would make the model compute something else; `warnings` for settings that only
  // training uses (dropout).
  std::function<void(const nlohmann::json& file_config,
                     const std::map<std::string, std::string>& config,
                     std::vector<std::string>& errors, std::vector<std::string>& warnings)>
      check_config;
  // Hugging Face folders (model.pretrained: DIR): the config.json model_type values this layout
  // reads (none: it loads from a weights file only).
  std::vector<std::string> model_types;
  // The model's own options (keys without "model.", e.g. {"n_layer": 2, "rms_norm_eps": 1e-5})
  // that `file`, a config.json of one of model_types, sets: `errors`, one line each naming the
  // field, for settings the model does not compute (it would be another model); `warnings` for
  // settings that only training uses.
  std::function<nlohmann::json(const nlohmann::json& file, std::vector<std::string>& errors,
                               std::vector<std::string>& warnings)>
      options_of_config;
  // The number of parameters of the model that options_of_config's `options` build (an estimate
  // within a few percent): weights files holding far fewer belong to another config.json.
  std::function<double(const nlohmann::json& options)> parameter_count;
};

// A language model decoding token by token (trainer generate).
class Decoder {
 public:
  virtual ~Decoder() = default;
  // The next-token logits [B, vocab] after `tokens` [B, T], which follow the tokens given since
  // reset(). With a key/value cache only the new positions are computed; without one, the whole
  // sequence again. A sequence reaching the context length keeps its last context - 1 tokens
  // (recomputed once), as nanoGPT's sampling crops it.
  virtual torch::Tensor next_logits(const torch::Tensor& tokens) = 0;
  // Forgets every token.
  virtual void reset() = 0;
  // The tokens the model knows (the logits' size).
  virtual int64_t vocabulary() const = 0;
};

// A registered model: how to build it and what the engine needs to know before it does.
struct ModelKind {
  ModelKind() = default;
  explicit ModelKind(ModelFactory make) : make(std::move(make)) {}

  ModelFactory make;
  // The tokens per sample a language model reads at most (gpt: model.block_size), the length the
  // token data sets cut samples to unless data.seq_len says otherwise; null for other models.
  std::function<int64_t(const config::ModelConfig& cfg)> context_length;
  // A decoder over a built model of this kind (`use_cache`: with a key/value cache); null for
  // models that are not language models.
  std::function<std::unique_ptr<Decoder>(NetImpl& net, bool use_cache)> decoder;
  // Hugging Face's layout of this model's weights; none for most models.
  std::optional<ForeignFormat> hf;
  // The option that unties weights the model ties (gpt: lm_head and wte), for messages about
  // files whose tied tensors differ; "" when it ties none.
  std::string untie_hint;
};
using ModelRegistry = Registry<ModelKind>;

// The built-in models.
const ModelRegistry& model_registry();

// `weights` for model `name` in the trainer's layout: converted when they are in the layout of
// the model's Hugging Face format, else unchanged.
NamedWeights to_trainer_layout(const std::string& name, const NamedWeights& weights);

// Builds the model cfg.name names. Throws ModelError for settings the model or `input` reject.
Net build_model(const config::ModelConfig& cfg, const InputSpec& input);

// The model section with every model's default options and name `name` (what a config file
// starts from).
config::ModelConfig default_model_config(const std::string& name = "mlp");

// The hidden-layer activations activate() knows (relu, gelu, tanh).
const std::vector<std::string>& activation_names();

// Hidden-layer activation by name (relu|gelu|tanh).
torch::Tensor activate(const std::string& name, const torch::Tensor& x);

// A module's parameters with tied weights once (nn/parameters.h).
using nn::parameter_count;
using nn::unique_named_parameters;
using nn::unique_parameters;

// Parameters, then buffers, under their dotted state-dict names (torchvision's and nanoGPT's
// spelling for the built-in models; a tied weight appears under each of its names).
std::vector<std::pair<std::string, torch::Tensor>> state_dict(const torch::nn::Module& module);

// Copies `weights` into the parameters and buffers of `module` by name, converting dtype and
// device. Every name must match in both directions with equal shapes (a zero bias of a layer the
// model has without bias is left out), and the names of one tied
// tensor must be given equal values; with `skip_head`, the tensors of the final layer (the prefix
// of the last parameter, e.g. `fc.`) may be missing or differ in shape and keep their initial
// values. Returns "" on success, else a description of every missing, unexpected and mis-shaped
// name and of tied names given different values (followed by `untie_hint`), and then copies
// nothing. `kept_initial` (may be null) receives the head's names that kept their initial values.
std::string load_weights(torch::nn::Module& module,
                         const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                         bool skip_head, const std::string& untie_hint = "",
                         std::vector<std::string>* kept_initial = nullptr);

// The prefix of the model's final layer, that of its last parameter (e.g. "fc."): what
// load_weights' skip_head leaves out.
std::string head_prefix(const torch::nn::Module& module);

// One line per direct submodule plus `parameters: <N>`.
std::string summary(const torch::nn::Module& module, const std::string& name);

}  // namespace trainer::models
