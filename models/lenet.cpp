// lenet: two convolution + max-pooling stages, a hidden fully connected layer and a classifier.
#include <torch/torch.h>

#include "models/builtin.h"

namespace trainer::models {
namespace {

class LenetImpl : public NetImpl {
 public:
  LenetImpl(const config::ModelConfig& cfg, const InputSpec& input)
      : activation_(cfg.activation), dropout_(cfg.dropout) {
    if (input.sample_shape.size() != 3) {
      throw ModelError("data.shape", "lenet needs image samples (C, H, W); got " +
                                         std::to_string(input.sample_shape.size()) + " dims");
    }
    const int64_t channels = input.sample_shape[0];
    const int64_t height = input.sample_shape[1] / 4;  // two 2x2 poolings
    const int64_t width = input.sample_shape[2] / 4;
    if (height < 1 || width < 1) {
      throw ModelError("data.shape", "lenet needs images of at least 4x4 pixels");
    }
    const auto conv = [&](int64_t in, int64_t out) {
      return torch::nn::Conv2d(
          torch::nn::Conv2dOptions(in, out, cfg.kernel_size).padding(cfg.kernel_size / 2));
    };
    conv1_ = register_module("conv1", conv(channels, cfg.channels[0]));
    conv2_ = register_module("conv2", conv(cfg.channels[0], cfg.channels[1]));
    fc_ = register_module("fc", torch::nn::Linear(cfg.channels[1] * height * width, cfg.fc_hidden));
    head_ = register_module("head", torch::nn::Linear(cfg.fc_hidden, input.num_classes));
  }

  torch::Tensor forward(torch::Tensor x) override {
    // x: [B, C, H, W]
    x = torch::max_pool2d(activate(activation_, conv1_->forward(x)), /*kernel_size=*/2);
    // x: [B, c1, H/2, W/2]
    x = torch::max_pool2d(activate(activation_, conv2_->forward(x)), /*kernel_size=*/2);
    // x: [B, c2, H/4, W/4]
    x = activate(activation_, fc_->forward(x.flatten(/*start_dim=*/1)));  // [B, fc_hidden]
    x = torch::dropout(x, dropout_, is_training());
    return head_->forward(x);  // [B, num_classes]
  }

 private:
  std::string activation_;
  double dropout_;
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::Linear fc_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Lenet);

}  // namespace

void register_lenet(ModelRegistry& registry) {
  registry.add("lenet", [](const config::ModelConfig& cfg, const InputSpec& input) -> Net {
    checkpoint_policy(cfg, /*has_blocks=*/false);
    return Lenet(cfg, input).ptr();
  });
}

}  // namespace trainer::models
