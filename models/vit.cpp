// vit: a Vision Transformer (Dosovitskiy et al., 2021) with torchvision's layout and parameter
// names (torchvision.models.VisionTransformer), so that weights move between the two. The
// defaults are ViT-Tiny/16 (DeiT-Tiny's 192 wide, 12 blocks of 3 heads).
//
// Input: images [B, C, H, W] with H and W multiples of model.patch_size. Output: logits
// [B, num_classes] from the class token.
#include <torch/torch.h>

#include "models/builtin.h"

namespace trainer::models {
namespace {

// The `model.` keys of vit.
struct VitOptions {
  int64_t patch_size = 16;  // side of the square patches the image is cut into
  int64_t embed_dim = 192;  // token width
  int64_t depth = 12;       // encoder blocks
  int64_t num_heads = 3;    // attention heads (must divide embed_dim)
  double mlp_ratio = 4.0;   // hidden width of each block's MLP, as a multiple of embed_dim
  double dropout = 0.0;     // dropout rate after the embeddings, attention and MLP

  template <class V>
  void visit(V& v) {
    v("patch_size", patch_size);
    v("embed_dim", embed_dim);
    v("depth", depth);
    v("num_heads", num_heads);
    v("mlp_ratio", mlp_ratio);
    v("dropout", dropout);
  }
  void validate(config::Checks& c) const {
    c.at_least("patch_size", patch_size, 1);
    c.at_least("embed_dim", embed_dim, 1);
    c.at_least("depth", depth, 1);
    c.at_least("num_heads", num_heads, 1);
    if (num_heads >= 1 && embed_dim % num_heads != 0) {
      c.add("embed_dim", "must be a multiple of model.num_heads (" + std::to_string(num_heads) +
                             "), got " + std::to_string(embed_dim));
    }
    c.above("mlp_ratio", mlp_ratio, 0.0);
    c.fraction("dropout", dropout);
  }
};

torch::nn::LayerNorm layer_norm(int64_t dim) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(1e-6));
}

// nn.MultiheadAttention's parameters (in_proj_weight, in_proj_bias, out_proj) over batch-first
// tokens.
class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(int64_t dim, int64_t heads) : heads_(heads) {
    in_proj_weight = register_parameter("in_proj_weight", torch::empty({3 * dim, dim}));
    in_proj_bias = register_parameter("in_proj_bias", torch::zeros({3 * dim}));
    out_proj = register_module("out_proj", torch::nn::Linear(dim, dim));
    torch::nn::init::xavier_uniform_(in_proj_weight);
    torch::nn::init::zeros_(out_proj->bias);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // x: [B, T, C]
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    const auto qkv = torch::linear(x, in_proj_weight, in_proj_bias).split(C, /*dim=*/2);
    const auto split_heads = [&](const torch::Tensor& t) {
      return t.view({B, T, heads_, C / heads_}).transpose(1, 2);  // [B, h, T, C/h]
    };
    auto y = at::scaled_dot_product_attention(split_heads(qkv[0]), split_heads(qkv[1]),
                                              split_heads(qkv[2]));       // [B, h, T, C/h]
    return apply_linear(out_proj, y.transpose(1, 2).reshape({B, T, C}));  // [B, T, C]
  }

  torch::Tensor in_proj_weight, in_proj_bias;
  torch::nn::Linear out_proj{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(SelfAttention);

// Pre-norm encoder block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class EncoderBlockImpl : public torch::nn::Module {
 public:
  EncoderBlockImpl(const VitOptions& o, int64_t mlp_dim) : dropout_(o.dropout) {
    ln_1 = register_module("ln_1", layer_norm(o.embed_dim));
    self_attention = register_module("self_attention", SelfAttention(o.embed_dim, o.num_heads));
    ln_2 = register_module("ln_2", layer_norm(o.embed_dim));
    // torchvision's MLPBlock: Linear, GELU, Dropout, Linear, Dropout (mlp.0 and mlp.3).
    fc1_ = torch::nn::Linear(o.embed_dim, mlp_dim);
    fc2_ = torch::nn::Linear(mlp_dim, o.embed_dim);
    mlp = register_module(
        "mlp", torch::nn::Sequential(fc1_, torch::nn::GELU(), torch::nn::Dropout(o.dropout), fc2_,
                                     torch::nn::Dropout(o.dropout)));
  }

  torch::Tensor forward(torch::Tensor x) {
    // x: [B, T, C]
    const auto attended = self_attention->forward(ln_1->forward(x));
    x = x + drop(attended, dropout_, is_training());  // [B, T, C]
    auto h = drop(torch::gelu(apply_linear(fc1_, ln_2->forward(x))), dropout_,
                  is_training());                                     // [B, T, M]
    return x + drop(apply_linear(fc2_, h), dropout_, is_training());  // [B, T, C]
  }

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  SelfAttention self_attention{nullptr};
  torch::nn::Sequential mlp{nullptr};

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};  // mlp's two layers
  double dropout_;
};
TORCH_MODULE(EncoderBlock);

class VitImpl : public NetImpl {
 public:
  VitImpl(const VitOptions& o, const nn::CheckpointPolicy& policy, const InputSpec& input)
      : embed_dim_(o.embed_dim), dropout_(o.dropout) {
    runner_ = nn::BlockRunner(policy);
    const auto& shape = input.sample_shape;  // [C, H, W]
    if (shape.size() != 3 || shape[1] % o.patch_size != 0 || shape[2] % o.patch_size != 0) {
      throw ModelError("model.patch_size",
                       "vit needs images (C, H, W) whose sides are multiples of model.patch_size " +
                           std::to_string(o.patch_size));
    }
    const int64_t tokens = (shape[1] / o.patch_size) * (shape[2] / o.patch_size) + 1;
    conv_proj = register_module(
        "conv_proj",
        torch::nn::Conv2d(
            torch::nn::Conv2dOptions(shape[0], o.embed_dim, o.patch_size).stride(o.patch_size)));
    class_token = register_parameter("class_token", torch::zeros({1, 1, o.embed_dim}));
    auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
    pos_embedding = encoder->register_parameter("pos_embedding",
                                                torch::randn({1, tokens, o.embed_dim}).mul_(0.02));
    auto layers = encoder->register_module("layers", std::make_shared<torch::nn::Module>());
    const auto mlp_dim = static_cast<int64_t>(o.mlp_ratio * static_cast<double>(o.embed_dim));
    for (int64_t i = 0; i < o.depth; ++i) {
      blocks_.push_back(
          layers->register_module("encoder_layer_" + std::to_string(i), EncoderBlock(o, mlp_dim)));
    }
    ln = encoder->register_module("ln", layer_norm(o.embed_dim));
    auto heads = register_module("heads", std::make_shared<torch::nn::Module>());
    head = heads->register_module("head", torch::nn::Linear(o.embed_dim, input.num_classes));
  }

  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const override {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (const auto& block : blocks_) out.push_back(block.ptr());
    return out;
  }

  torch::Tensor forward(torch::Tensor x) override {
    // x: [B, C, H, W]
    const int64_t B = x.size(0);
    x = conv_proj->forward(x).flatten(/*start_dim=*/2).transpose(1, 2);      // [B, P, D]
    x = torch::cat({class_token.expand({B, 1, embed_dim_}), x}, /*dim=*/1);  // [B, P + 1, D]
    x = drop(x + pos_embedding, dropout_, is_training());
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const auto block = blocks_[i].ptr();
      x = runner_.run(
          static_cast<int64_t>(i), *block,
          [block](const torch::Tensor& in) { return block->forward(in); }, x);  // [B, P + 1, D]
    }
    x = ln->forward(x).select(/*dim=*/1, /*index=*/0);  // [B, D]: the class token
    return apply_linear(head, x);                       // [B, num_classes]
  }

 private:
  int64_t embed_dim_;
  double dropout_;
  torch::nn::Conv2d conv_proj{nullptr};
  torch::Tensor class_token, pos_embedding;
  std::vector<EncoderBlock> blocks_;  // encoder.layers.encoder_layer_<i>
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear head{nullptr};
};

}  // namespace

void register_vit(ModelRegistry& registry) {
  const auto make = [](const config::ModelConfig& cfg, const InputSpec& input) -> Net {
    return std::make_shared<VitImpl>(cfg.own<VitOptions>(),
                                     checkpoint_policy(cfg, /*has_blocks=*/true), input);
  };
  registry.add("vit", ModelKind(make), config::options_of<VitOptions>());
}

}  // namespace trainer::models
