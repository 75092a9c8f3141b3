// Classification networks and their registry, keyed by the YAML `model.name`.
//
// Adding a model: one file with a `register_<name>(ModelRegistry&)` function, and one line in
// models/registry.cpp calling it.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "config/config.h"
#include "util/registry.h"

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
using ModelRegistry = Registry<ModelFactory>;

// The built-in models.
const ModelRegistry& model_registry();

// Hidden-layer activation by name (relu|gelu|tanh).
torch::Tensor activate(const std::string& name, const torch::Tensor& x);

// The parameters of `module`, each tensor once under its first name (tied weights appear under
// several names).
std::vector<std::pair<std::string, torch::Tensor>> unique_named_parameters(
    const torch::nn::Module& module);
std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module);

// Total number of parameter elements, tied weights counted once.
int64_t parameter_count(const torch::nn::Module& module);

// Parameters, then buffers, under their dotted state-dict names (torchvision's and nanoGPT's
// spelling for the built-in models; a tied weight appears under each of its names).
std::vector<std::pair<std::string, torch::Tensor>> state_dict(const torch::nn::Module& module);

// Copies `weights` into the parameters and buffers of `module` by name, converting dtype and
// device. Every name must match in both directions with equal shapes; with `skip_head`, the
// tensors of the final layer (the prefix of the last parameter, e.g. `fc.`) may be missing or
// differ in shape and keep their initial values. Returns "" on success, else a description of
// every missing, unexpected and mis-shaped name, and then copies nothing.
std::string load_weights(torch::nn::Module& module,
                         const std::vector<std::pair<std::string, torch::Tensor>>& weights,
                         bool skip_head);

// One line per direct submodule plus `parameters: <N>`.
std::string summary(const torch::nn::Module& module, const std::string& name);

}  // namespace trainer::models
