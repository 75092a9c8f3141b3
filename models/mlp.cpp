// mlp: a multi-layer perceptron over flattened samples.
#include <torch/torch.h>

#include "models/builtin.h"

namespace trainer::models {
namespace {

class MlpImpl : public NetImpl {
 public:
  MlpImpl(const config::ModelConfig& cfg, const InputSpec& input)
      : activation_(cfg.activation), dropout_(cfg.dropout) {
    int64_t width = 1;
    for (int64_t d : input.sample_shape) width *= d;
    for (size_t i = 0; i < cfg.hidden.size(); ++i) {
      layers_.push_back(
          register_module("fc" + std::to_string(i + 1), torch::nn::Linear(width, cfg.hidden[i])));
      width = cfg.hidden[i];
    }
    head_ = register_module("head", torch::nn::Linear(width, input.num_classes));
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = x.flatten(/*start_dim=*/1);  // [B, D]
    for (auto& layer : layers_) {
      x = activate(activation_, layer->forward(x));  // [B, hidden_i]
      x = torch::dropout(x, dropout_, is_training());
    }
    return head_->forward(x);  // [B, num_classes]
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
  registry.add("mlp", [](const config::ModelConfig& cfg, const InputSpec& input) -> Net {
    checkpoint_policy(cfg, /*has_blocks=*/false);
    return Mlp(cfg, input).ptr();
  });
}

}  // namespace trainer::models
