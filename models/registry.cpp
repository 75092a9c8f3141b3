#include <torch/torch.h>

#include <sstream>

#include "models/builtin.h"

namespace trainer::models {

// The built-in models, a line each: X(name) for the register_<name> function in models/<name>.cpp.
#define TRAINER_BUILTIN_MODELS(X) \
  X(mlp)                          \
  X(lenet)                        \
  X(gpt)                          \
  X(llama)                        \
  X(resnet)                       \
  X(vit)                          \
  /* end of the list */

using R = ModelRegistry;
TRAINER_BUILTIN_MODELS(TRAINER_DECLARE_REGISTER_FN)

const ModelRegistry& model_registry() {
  static const auto registry =
      make_registry<ModelRegistry>("model", {TRAINER_BUILTIN_MODELS(TRAINER_REGISTER_FN)});
  return registry;
}

Net build_model(const config::ModelConfig& cfg, const InputSpec& input) {
  return model_registry().get(cfg.name).make(cfg, input);
}

nn::SplitPlan NetImpl::split_over(std::shared_ptr<nn::TensorParallel> /*tp*/) {
  throw ModelError("dist.tp_size",
                   "this model does not split its layers over tensor-parallel ranks; use "
                   "dist.tp_size: 1 (gpt splits)");
}

torch::Tensor NetImpl::forward_packed(torch::Tensor x, const torch::Tensor& positions) {
  if (!positions.defined()) return forward(std::move(x));
  throw ModelError("data.pack",
                   "this model cannot keep attention inside packed documents; set data.pack: "
                   "false (llama and gpt take packed rows)");
}

torch::Tensor NetImpl::forward_hidden(torch::Tensor /*x*/, const torch::Tensor& /*positions*/) {
  throw std::logic_error("this model's output layer is not a plain product (no output_weight)");
}

NamedWeights to_trainer_layout(const std::string& name, const NamedWeights& weights) {
  const auto& hf = model_registry().get(name).hf;
  return hf && hf->matches(weights) ? hf->to_trainer(weights) : weights;
}

config::ModelConfig default_model_config(const std::string& name) {
  config::ModelConfig cfg;
  cfg.name = name;
  cfg.options = model_registry().options();
  return cfg;
}

const std::vector<std::string>& activation_names() {
  static const std::vector<std::string> names = {"relu", "gelu", "tanh"};
  return names;
}

nn::CheckpointPolicy checkpoint_policy(const config::ModelConfig& cfg, bool has_blocks) {
  const auto period = config::checkpoint_period(cfg.checkpointing);
  if (!period) {
    throw ModelError(
        "model.checkpointing",
        "must be none, blocks, offload or every:N with N >= 1, got '" + cfg.checkpointing + "'");
  }
  if (*period > 0 && !has_blocks) {
    throw ModelError("model.checkpointing", "model '" + cfg.name +
                                                "' has no blocks to checkpoint; use none "
                                                "(resnet and gpt models have them)");
  }
  return nn::CheckpointPolicy(*period, /*offload=*/cfg.checkpointing == "offload");
}

torch::Tensor activate(const std::string& name, const torch::Tensor& x) {
  if (name == "gelu") return torch::gelu(x);
  if (name == "tanh") return torch::tanh(x);
  return torch::relu(x);
}

namespace {

// A module's line without its C++ type's namespaces and `Impl` suffix: "GptTransformer" for
// trainer::models::(anonymous namespace)::GptTransformerImpl.
std::string readable_line(const torch::nn::Module& module) {
  std::ostringstream out;
  module.pretty_print(out);
  std::string line = out.str();
  const std::string& type = module.name();
  if (line.compare(0, type.size(), type) != 0) return line;
  std::string plain = type.substr(type.rfind("::") == std::string::npos ? 0 : type.rfind("::") + 2);
  if (plain.size() > 4 && plain.compare(plain.size() - 4, 4, "Impl") == 0)
    plain.resize(plain.size() - 4);
  return plain + line.substr(type.size());
}

}  // namespace

std::string summary(const torch::nn::Module& module, const std::string& name) {
  std::ostringstream out;
  out << "model: " << name << "\n";
  for (const auto& child : module.named_children()) {
    out << "  " << child.key() << ": " << readable_line(*child.value()) << "  ("
        << parameter_count(*child.value()) << " parameters)\n";
  }
  out << "parameters: " << parameter_count(module) << "\n";
  return out.str();
}

}  // namespace trainer::models
