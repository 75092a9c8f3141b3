// mlp: a multi-layer perceptron over flattened samples.
#include <torch/torch.h>

#include "models/builtin.h"

namespace trainer::models {
namespace {

// The `model.` keys of mlp.
struct MlpOptions {
  std::vector<int64_t> hidden = {256, 128};  // hidden layer widths
  double dropout = 0.0;                      // dropout rate after each hidden layer
  std::string activation = "relu";           // hidden activation: relu|gelu|tanh

  template <class V>
  void visit(V& v) {
    v("hidden", hidden);
    v("dropout", dropout);
    v("activation", activation);
  }
  void validate(config::Checks& c) const {
    c.each_at_least("hidden", hidden, 1, "every width");
    c.fraction("dropout", dropout);
    c.one_of("activation", activation, activation_names());
  }
};

class MlpImpl : public NetImpl {
 public:
  MlpImpl(const MlpOptions& o, const InputSpec& input)
      : activation_(o.activation), dropout_(o.dropout) {
    int64_t width = 1;
    for (int64_t d : input.sample_shape) width *= d;
    for (size_t i = 0; i < o.hidden.size(); ++i) {
      layers_.push_back(
          register_module("fc" + std::to_string(i + 1), torch::nn::Linear(width, o.hidden[i])));
      width = o.hidden[i];
    }
    head_ = register_module("head", torch::nn::Linear(width, input.num_classes));
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = x.flatten(/*start_dim=*/1);  // [B, D]
    for (auto& layer : layers_) {
      x = activate(activation_, apply_linear(layer, x));  // [B, hidden_i]
      x = drop(x, dropout_, is_training());
    }
    return apply_linear(head_, x);  // [B, num_classes]
  }

 private:
  std::string activation_;
  double dropout_;
  std::vector<torch::nn::Linear> layers_;
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Mlp);

}  // namespace

void register_mlp(ModelRegistry& registry) {
  const auto make = [](const config::ModelConfig& cfg, const InputSpec& input) -> Net {
    checkpoint_policy(cfg, /*has_blocks=*/false);
    return Mlp(cfg.own<MlpOptions>(), input).ptr();
  };
  registry.add("mlp", ModelKind(make), config::options_of<MlpOptions>());
}

}  // namespace trainer::models
