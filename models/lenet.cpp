// lenet: two convolution + max-pooling stages, a hidden fully connected layer and a classifier.
#include <torch/torch.h>

#include "models/builtin.h"

namespace trainer::models {
namespace {

// The `model.` keys of lenet.
struct LenetOptions {
  std::vector<int64_t> channels = {32, 64};  // output channels of the two conv layers
  int64_t kernel_size = 5;                   // conv kernel size (odd; padded to keep size)
  int64_t fc_hidden = 128;                   // width of the hidden fully connected layer
  double dropout = 0.0;                      // dropout rate after the hidden layer
  std::string activation = "relu";           // hidden activation: relu|gelu|tanh
  bool channels_last = false;                // NHWC memory format

  template <class V>
  void visit(V& v) {
    v("channels", channels);
    v("kernel_size", kernel_size);
    v("fc_hidden", fc_hidden);
    v("dropout", dropout);
    v("activation", activation);
    v("channels_last", channels_last);
  }
  void validate(config::Checks& c) const {
    if (channels.size() != 2) {
      c.add("channels", "must have exactly 2 entries, got " + std::to_string(channels.size()) +
                            " (e.g. [32, 64])");
    } else {
      c.each_at_least("channels", channels, 1);
    }
    if (kernel_size < 1 || kernel_size % 2 == 0) {
      c.add("kernel_size", "must be odd and >= 1, got " + std::to_string(kernel_size));
    }
    c.at_least("fc_hidden", fc_hidden, 1);
    c.fraction("dropout", dropout);
    c.one_of("activation", activation, activation_names());
  }
};

class LenetImpl : public NetImpl {
 public:
  LenetImpl(const LenetOptions& o, const InputSpec& input)
      : activation_(o.activation), dropout_(o.dropout), channels_last_(o.channels_last) {
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
          torch::nn::Conv2dOptions(in, out, o.kernel_size).padding(o.kernel_size / 2));
    };
    conv1_ = register_module("conv1", conv(channels, o.channels[0]));
    conv2_ = register_module("conv2", conv(o.channels[0], o.channels[1]));
    fc_ = register_module("fc", torch::nn::Linear(o.channels[1] * height * width, o.fc_hidden));
    head_ = register_module("head", torch::nn::Linear(o.fc_hidden, input.num_classes));
    if (channels_last_) {
      for (auto* conv : {&conv1_, &conv2_}) {
        auto& w = (*conv)->weight;
        w.set_data(w.data().contiguous(torch::MemoryFormat::ChannelsLast));
      }
    }
  }

  torch::Tensor forward(torch::Tensor x) override {
    // x: [B, C, H, W]
    if (channels_last_) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
    x = conv_block(conv1_->forward(x));                                        // [B, c1, H/2, W/2]
    x = conv_block(conv2_->forward(x));                                        // [B, c2, H/4, W/4]
    x = activate(activation_, apply_linear(fc_, x.flatten(/*start_dim=*/1)));  // [B, fc_hidden]
    x = drop(x, dropout_, is_training());
    return apply_linear(head_, x);  // [B, num_classes]
  }

 private:
  // Activation, then 2x2 max pooling. A non-decreasing activation (relu, tanh) commutes with the
  // max, so it runs after the pooling on a quarter of the values: the same outputs and gradients.
  torch::Tensor conv_block(const torch::Tensor& x) const {
    if (activation_ == "relu" || activation_ == "tanh") {
      return activate(activation_, torch::max_pool2d(x, /*kernel_size=*/2));
    }
    return torch::max_pool2d(activate(activation_, x), /*kernel_size=*/2);
  }

  std::string activation_;
  double dropout_;
  bool channels_last_;  // NHWC convolutions (faster in oneDNN on the CPU)
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::Linear fc_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Lenet);

}  // namespace

void register_lenet(ModelRegistry& registry) {
  const auto make = [](const config::ModelConfig& cfg, const InputSpec& input) -> Net {
    checkpoint_policy(cfg, /*has_blocks=*/false);
    return Lenet(cfg.own<LenetOptions>(), input).ptr();
  };
  registry.add("lenet", ModelKind(make), config::options_of<LenetOptions>());
}

}  // namespace trainer::models
