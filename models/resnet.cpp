// resnet18/34/50/101/152: torchvision's ResNet v1.5 (stride on the 3x3 conv of the bottleneck).
//
// Submodules carry torchvision's names, so state dicts match key for key (conv1, bn1,
// layer1.0.conv1, layer1.0.downsample.0, ..., fc) and its initialisation: kaiming-normal
// (fan_out, relu) convolutions, batch norms at weight 1 and bias 0, and with zero_init_residual
// the last batch norm of each residual block at weight 0. Residual blocks live in the
// Sequentials layer1..layer4 as ResidualBlockImpl, the unit of activation checkpointing.
#include <torch/torch.h>

#include "models/builtin.h"
#include "nn/batch_norm.h"

namespace trainer::models {
namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

// Batch norm that a data-parallel job can synchronise (dist.sync_bn).
nn::BatchNorm2d norm(int64_t channels) {
  return nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(channels).eps(1e-5).momentum(0.1));
}

// 1x1 conv + batch norm on the shortcut where the block changes shape; empty where it does not.
torch::nn::Sequential downsample(int64_t in, int64_t out, int64_t stride) {
  if (stride == 1 && in == out) return torch::nn::Sequential{nullptr};
  return torch::nn::Sequential(conv(in, out, /*kernel=*/1, stride), norm(out));
}

// A residual block: relu(body(x) + shortcut(x)).
class ResidualBlockImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
  // The batch norm ending the residual branch, zeroed by zero_init_residual.
  virtual nn::BatchNorm2d last_norm() const = 0;
};

// Two 3x3 convolutions (resnet18/34).
class BasicBlockImpl : public ResidualBlockImpl {
 public:
  static constexpr int64_t kExpansion = 1;

  BasicBlockImpl(int64_t in, int64_t planes, int64_t stride) {
    conv1_ = register_module("conv1", conv(in, planes, /*kernel=*/3, stride));
    bn1_ = register_module("bn1", norm(planes));
    conv2_ = register_module("conv2", conv(planes, planes, /*kernel=*/3, /*stride=*/1));
    bn2_ = register_module("bn2", norm(planes));
    downsample_ = downsample(in, planes * kExpansion, stride);
    if (!downsample_.is_empty()) register_module("downsample", downsample_);
  }

  torch::Tensor forward(torch::Tensor x) override {
    // x: [B, in, H, W]
    // In place where torchvision is (ReLU and the residual sum on fresh batch-norm outputs,
    // which no backward needs): fewer tensors allocated and written.
    auto out = bn1_->forward(conv1_->forward(x)).relu_();  // [B, planes, H/s, W/s]
    out = bn2_->forward(conv2_->forward(out));             // [B, planes, H/s, W/s]
    out += downsample_.is_empty() ? x : downsample_->forward(x);
    return out.relu_();  // [B, planes, H/s, W/s]
  }

  nn::BatchNorm2d last_norm() const override { return bn2_; }

 private:
  torch::nn::Conv2d conv1_{nullptr};
  nn::BatchNorm2d bn1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  nn::BatchNorm2d bn2_{nullptr};
  torch::nn::Sequential downsample_{nullptr};
};

// 1x1 reduce, 3x3 (carrying the stride), 1x1 expand by 4 (resnet50/101/152).
class BottleneckImpl : public ResidualBlockImpl {
 public:
  static constexpr int64_t kExpansion = 4;

  BottleneckImpl(int64_t in, int64_t planes, int64_t stride) {
    conv1_ = register_module("conv1", conv(in, planes, /*kernel=*/1, /*stride=*/1));
    bn1_ = register_module("bn1", norm(planes));
    conv2_ = register_module("conv2", conv(planes, planes, /*kernel=*/3, stride));
    bn2_ = register_module("bn2", norm(planes));
    conv3_ =
        register_module("conv3", conv(planes, planes * kExpansion, /*kernel=*/1, /*stride=*/1));
    bn3_ = register_module("bn3", norm(planes * kExpansion));
    downsample_ = downsample(in, planes * kExpansion, stride);
    if (!downsample_.is_empty()) register_module("downsample", downsample_);
  }

  torch::Tensor forward(torch::Tensor x) override {
    // x: [B, in, H, W]
    // In place as in BasicBlock.
    auto out = bn1_->forward(conv1_->forward(x)).relu_();  // [B, planes, H, W]
    out = bn2_->forward(conv2_->forward(out)).relu_();     // [B, planes, H/s, W/s]
    out = bn3_->forward(conv3_->forward(out));             // [B, 4 planes, H/s, W/s]
    out += downsample_.is_empty() ? x : downsample_->forward(x);
    return out.relu_();  // [B, 4 planes, H/s, W/s]
  }

  nn::BatchNorm2d last_norm() const override { return bn3_; }

 private:
  torch::nn::Conv2d conv1_{nullptr};
  nn::BatchNorm2d bn1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  nn::BatchNorm2d bn2_{nullptr};
  torch::nn::Conv2d conv3_{nullptr};
  nn::BatchNorm2d bn3_{nullptr};
  torch::nn::Sequential downsample_{nullptr};
};

// The `model.` keys of the ResNets.
struct ResNetOptions {
  int64_t in_channels = 0;          // input channels; 0 = the data's channels
  std::string stem = "imagenet";    // imagenet (7x7/2 + max-pool)|cifar (3x3/1)
  bool zero_init_residual = false;  // zero the last norm of each residual block
  bool channels_last = false;       // NHWC memory format

  template <class V>
  void visit(V& v) {
    v("in_channels", in_channels);
    v("stem", stem);
    v("zero_init_residual", zero_init_residual);
    v("channels_last", channels_last);
  }
  void validate(config::Checks& c) const {
    c.at_least("in_channels", in_channels, 0);
    c.one_of("stem", stem, {"imagenet", "cifar"});
  }
};

template <class Block>
class ResNetImpl : public NetImpl {
 public:
  ResNetImpl(const std::string& name, const std::vector<int64_t>& blocks, const ResNetOptions& cfg,
             const nn::CheckpointPolicy& policy, const InputSpec& input)
      : cifar_stem_(cfg.stem == "cifar"), channels_last_(cfg.channels_last) {
    runner_ = nn::BlockRunner(policy);
    if (input.sample_shape.size() != 3) {
      throw ModelError("data.shape", name + " needs image samples (C, H, W); got " +
                                         std::to_string(input.sample_shape.size()) + " dims");
    }
    if (cfg.stem != "imagenet" && cfg.stem != "cifar") {
      throw ModelError("model.stem", "unknown stem '" + cfg.stem + "'; expected imagenet|cifar");
    }
    const int64_t channels = cfg.in_channels > 0 ? cfg.in_channels : input.sample_shape[0];
    conv1_ = register_module("conv1", cifar_stem_ ? conv(channels, 64, /*kernel=*/3, /*stride=*/1)
                                                  : conv(channels, 64, /*kernel=*/7, /*stride=*/2));
    bn1_ = register_module("bn1", norm(64));
    int64_t in = 64;
    const int64_t planes[] = {64, 128, 256, 512};
    for (size_t i = 0; i < 4; ++i) {
      torch::nn::Sequential layer;
      for (int64_t b = 0; b < blocks[i]; ++b) {
        const int64_t stride = (i > 0 && b == 0) ? 2 : 1;
        auto block = std::make_shared<Block>(in, planes[i], stride);
        layer->push_back(block);
        blocks_.push_back(block);
        in = planes[i] * Block::kExpansion;
      }
      register_module("layer" + std::to_string(i + 1), layer);
    }
    fc_ = register_module("fc", torch::nn::Linear(in, input.num_classes));

    torch::NoGradGuard no_grad;
    for (const auto& module : modules(/*include_self=*/false)) {
      if (auto* c = module->as<torch::nn::Conv2d>()) {
        torch::nn::init::kaiming_normal_(c->weight, /*a=*/0, torch::kFanOut, torch::kReLU);
      }
    }
    if (cfg.zero_init_residual) {
      for (const auto& module : modules(/*include_self=*/false)) {
        if (auto block = std::dynamic_pointer_cast<ResidualBlockImpl>(module)) {
          torch::nn::init::zeros_(block->last_norm()->weight);
        }
      }
    }
    if (channels_last_) {
      for (auto& p : parameters()) {
        if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
      }
    }
  }

  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const override {
    return {blocks_.begin(), blocks_.end()};
  }

  torch::Tensor forward(torch::Tensor x) override {
    // x: [B, C, H, W]
    if (channels_last_) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
    x = bn1_->forward(conv1_->forward(x)).relu_();
    if (!cifar_stem_) {
      // x: [B, 64, H/2, W/2]
      x = torch::max_pool2d(x, /*kernel_size=*/3, /*stride=*/2, /*padding=*/1);
    }
    // x: [B, 64, H', W'] with H' = H (cifar) or H/4 (imagenet)
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const auto& block = blocks_[i];
      x = runner_.run(
          static_cast<int64_t>(i), *block,
          [block](const torch::Tensor& in) { return block->forward(in); }, x);
    }
    // x: [B, 512 e, H'/8, W'/8], e = 1 (basic) or 4 (bottleneck)
    x = torch::adaptive_avg_pool2d(x, /*output_size=*/{1, 1}).flatten(/*start_dim=*/1);
    // x: [B, 512 e]
    return apply_linear(fc_, x);  // [B, num_classes]
  }

 private:
  bool cifar_stem_;
  bool channels_last_;
  torch::nn::Conv2d conv1_{nullptr};
  nn::BatchNorm2d bn1_{nullptr};
  std::vector<std::shared_ptr<Block>> blocks_;  // the blocks of layer1..layer4 (registered there)
  torch::nn::Linear fc_{nullptr};
};

template <class Block>
void add(ModelRegistry& registry, const std::string& name, std::vector<int64_t> blocks) {
  const auto make = [name, blocks](const config::ModelConfig& cfg, const InputSpec& input) -> Net {
    return std::make_shared<ResNetImpl<Block>>(name, blocks, cfg.own<ResNetOptions>(),
                                               checkpoint_policy(cfg, /*has_blocks=*/true), input);
  };
  registry.add(name, ModelKind(make), config::options_of<ResNetOptions>());
}

}  // namespace

void register_resnet(ModelRegistry& registry) {
  add<BasicBlockImpl>(registry, "resnet18", {2, 2, 2, 2});
  add<BasicBlockImpl>(registry, "resnet34", {3, 4, 6, 3});
  add<BottleneckImpl>(registry, "resnet50", {3, 4, 6, 3});
  add<BottleneckImpl>(registry, "resnet101", {3, 4, 23, 3});
  add<BottleneckImpl>(registry, "resnet152", {3, 8, 36, 3});
}

}  // namespace trainer::models
