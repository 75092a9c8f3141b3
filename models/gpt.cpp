// gpt: a GPT-2-style decoder-only transformer (nanoGPT's layout and parameter names).
//
// Input: token ids [B, T] (int64, T <= block_size). Output: next-token logits [B, T, vocab].
// The vocabulary is `model.vocab_size`; when that is 0 the InputSpec's num_classes is used instead.
// Token samples longer than block_size, or ids beyond a set vocab_size, are rejected at build.
//
// lm_head's weight is tied to transformer.wte.weight (model.tie_embeddings, the default): the same
// tensor, registered under both names (as in a PyTorch state_dict), so Module::parameters() lists
// it twice; parameter_count() counts it once. Untied, lm_head has a weight of its own.
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <utility>

#include "models/builtin.h"
#include "models/decoder.h"
#include "nn/fused/fused_gpt_ops.h"
#include "nn/fused/fused_ops.h"
#include "nn/init_replay.h"

namespace trainer::models {
namespace {

// The `model.` keys of gpt.
struct GptOptions {
  int64_t n_layer = 12;        // transformer blocks
  int64_t n_head = 12;         // attention heads (must divide n_embd)
  int64_t n_embd = 768;        // embedding width
  int64_t block_size = 1024;   // context length in tokens
  int64_t vocab_size = 50257;  // vocabulary size; 0 = the data's class count
  bool bias = true;            // biases in linear layers and layer norms
  double dropout = 0.0;        // dropout rate on embeddings, attention and residuals
  bool tie_embeddings = true;  // lm_head's weight is transformer.wte's (GPT-2's tie)
  // auto (the fused kernels and the chunked output loss on a GPU) | on (the chunked output loss on
  // the CPU too) | off
  std::string fused_kernels = "off";

  template <class V>
  void visit(V& v) {
    v("n_layer", n_layer);
    v("n_head", n_head);
    v("n_embd", n_embd);
    v("block_size", block_size);
    v("vocab_size", vocab_size);
    v("bias", bias);
    v("dropout", dropout);
    v("tie_embeddings", tie_embeddings);
    v("fused_kernels", fused_kernels);
  }
  void validate(config::Checks& c) const {
    c.at_least("n_layer", n_layer, 1);
    c.at_least("n_head", n_head, 1);
    c.at_least("n_embd", n_embd, 1);
    if (n_head >= 1 && n_embd % n_head != 0) {
      c.add("n_embd", "must be a multiple of model.n_head (" + std::to_string(n_head) + "), got " +
                          std::to_string(n_embd));
    }
    c.at_least("block_size", block_size, 1);
    c.at_least("vocab_size", vocab_size, 0);
    c.fraction("dropout", dropout);
    // llama's values too: the key is shared, and every model's checks see it.
    c.one_of("fused_kernels", fused_kernels, {"auto", "on", "off"});
  }
  // Whether LayerNorm, its residual add and the MLP's bias + GELU take nn/fused/fused_gpt_ops.h's
  // kernels where their tensors allow (CUDA).
  bool fused() const { return fused_kernels != "off"; }
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// LayerNorm over the last dimension whose bias is optional (torch::nn::LayerNorm always has one).
// `fused`: on a CUDA device one kernel each way (nn/fused/fused_gpt_ops.h), giving what ATen's
// gives: the dtype (float32 under autocast, whose layer_norm runs in float32) and the values within
// rounding.
class GptLayerNormImpl : public torch::nn::Module {
 public:
  GptLayerNormImpl(int64_t dim, bool bias, bool fused = false) : dim_(dim), fused_(fused) {
    weight = register_parameter("weight", torch::ones({dim}));
    if (bias) this->bias = register_parameter("bias", torch::zeros({dim}));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // x: [..., C]; an undefined bias means none.
    if (fused_ && x.is_cuda()) {
      const auto [w, b] = kernel_params(x, x.scalar_type());
      if (w.defined() && nn::fused_layer_norm_supports(x, w, b)) {
        return nn::fused_layer_norm(x, w, b, kEps);  // [..., C]
      }
    }
    return torch::layer_norm(x, {dim_}, weight, bias, kEps);  // [..., C]
  }

  // {x + residual, forward(x + residual)}: the sum for the next residual and its norm, [..., C]
  // each; with `fused` on a CUDA device the add and the norm are one kernel.
  std::pair<torch::Tensor, torch::Tensor> forward_add(const torch::Tensor& x,
                                                      const torch::Tensor& residual) {
    if (fused_ && x.is_cuda()) {
      const auto type = torch::promote_types(x.scalar_type(), residual.scalar_type());
      const auto [w, b] = kernel_params(x, type);
      if (w.defined() && nn::fused_add_layer_norm_supports(x, residual, w, b)) {
        return nn::fused_add_layer_norm(x, residual, w, b, kEps);
      }
    }
    auto sum = x + residual;  // [..., C]
    return {sum, forward(sum)};
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "LayerNorm(" << dim_ << ", bias=" << (bias.defined() ? "true" : "false") << ")";
  }

  torch::Tensor weight;
  torch::Tensor bias;

 private:
  static constexpr double kEps = 1e-5;

  // The weight and bias the kernel takes to normalise an input of `type` as ATen's layer_norm
  // does: under autocast on x's device ATen's runs in float32 (the input and parameters cast), so
  // float32 ones; otherwise only parameters of the input's dtype (ATen's mixed cases stay
  // ATen's): {undefined, undefined} else.
  std::pair<torch::Tensor, torch::Tensor> kernel_params(const torch::Tensor& x,
                                                        torch::ScalarType type) const {
    if (at::autocast::is_autocast_enabled(x.device().type())) {
      return {weight.to(torch::kFloat), bias.defined() ? bias.to(torch::kFloat) : bias};
    }
    if (weight.scalar_type() != type) return {};
    return {weight, bias};
  }

  int64_t dim_;
  bool fused_;
};
TORCH_MODULE(GptLayerNorm);

// A linear layer that LoRA may adapt (nn/lora.h).
nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// Multi-head causal self-attention with fused q, k, v projection.
class GptAttentionImpl : public torch::nn::Module {
 public:
  explicit GptAttentionImpl(const GptOptions& cfg)
      : head_size_(cfg.n_embd / cfg.n_head), dropout_(cfg.dropout) {
    c_attn = register_module("c_attn", linear(cfg.n_embd, 3 * cfg.n_embd, cfg.bias));
    c_proj = register_module("c_proj", linear(cfg.n_embd, cfg.n_embd, cfg.bias));
  }

  // With tensor parallelism (`tp`) this rank computes its n_head / tp heads: C' = C / tp below,
  // else C' = C. Causal, or under `mask` [B, 1, T, T] bool (packed rows' block-causal mask,
  // models/builtin.h; every head takes it).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask = {}) {
    // x: [B, T, C]
    const int64_t B = x.size(0), T = x.size(1);
    const auto qkv = project_in(x);                            // [B, T, 3C']
    const auto q_k_v = qkv.split(qkv.size(2) / 3, /*dim=*/2);  // 3 x [B, T, C']
    const bool masked = mask.defined();
    auto y = at::scaled_dot_product_attention(
        heads(q_k_v[0]), heads(q_k_v[1]), heads(q_k_v[2]),
        masked ? std::optional<torch::Tensor>(mask) : std::nullopt,
        /*dropout_p=*/is_training() ? dropout_ : 0.0, /*is_causal=*/!masked);  // [B, nh', T, hs]
    y = y.transpose(1, 2).contiguous().view({B, T, -1});                       // [B, T, C']
    return drop(project_out(y), dropout_, is_training());                      // [B, T, C]
  }

  // Decoding: x [B, T, C] the new positions after those whose keys and values `cache` holds
  // ([B, nh, P, hs] each, undefined when none), which grows by them. T > 1 only when it is empty.
  torch::Tensor forward_cached(const torch::Tensor& x, KeyValueCache& cache) {
    const int64_t B = x.size(0), T = x.size(1);
    const auto qkv = project_in(x);                            // [B, T, 3C']
    const auto q_k_v = qkv.split(qkv.size(2) / 3, /*dim=*/2);  // 3 x [B, T, C']
    auto& [k, v] = cache;
    const bool first = !k.defined();
    k = first ? heads(q_k_v[1]) : torch::cat({k, heads(q_k_v[1])}, /*dim=*/2);  // [B, nh', P+T, hs]
    v = first ? heads(q_k_v[2]) : torch::cat({v, heads(q_k_v[2])}, /*dim=*/2);  // [B, nh', P+T, hs]
    auto y = at::scaled_dot_product_attention(heads(q_k_v[0]), k, v, /*attn_mask=*/{},
                                              /*dropout_p=*/0.0,
                                              /*is_causal=*/first);  // [B, nh', T, hs]
    y = y.transpose(1, 2).contiguous().view({B, T, -1});             // [B, T, C']
    return project_out(y);                                           // [B, T, C]
  }

  nn::Linear c_attn{nullptr};
  nn::Linear c_proj{nullptr};
  std::shared_ptr<nn::TensorParallel> tp;  // the group c_attn and c_proj split over; null: whole

 private:
  // [B, T, C'] -> [B, nh', T, hs]
  torch::Tensor heads(const torch::Tensor& t) const {
    return t.view({t.size(0), t.size(1), -1, head_size_}).transpose(1, 2);
  }
  // c_attn, column-parallel by heads under tp: [B, T, C] -> [B, T, 3C']
  torch::Tensor project_in(const torch::Tensor& x) {
    return tp ? c_attn->column_parallel(*tp, x) : apply_linear(c_attn, x);
  }
  // c_proj, row-parallel under tp: [B, T, C'] -> [B, T, C]
  torch::Tensor project_out(const torch::Tensor& y) {
    return tp ? c_proj->row_parallel(*tp, y) : apply_linear(c_proj, y);
  }

  int64_t head_size_;
  double dropout_;
};
TORCH_MODULE(GptAttention);

class GptMlpImpl : public torch::nn::Module {
 public:
  explicit GptMlpImpl(const GptOptions& cfg) : dropout_(cfg.dropout), fused_(cfg.fused()) {
    c_fc = register_module("c_fc", linear(cfg.n_embd, 4 * cfg.n_embd, cfg.bias));
    c_proj = register_module("c_proj", linear(4 * cfg.n_embd, cfg.n_embd, cfg.bias));
  }

  // With tensor parallelism (`tp`) c_fc is column-parallel and c_proj row-parallel: this rank
  // computes 4C' = 4C / tp of the hidden units.
  torch::Tensor forward(const torch::Tensor& x) {
    // x: [B, T, C]
    const auto h = hidden(x);  // [B, T, 4C']
    return drop(tp ? c_proj->row_parallel(*tp, h) : apply_linear(c_proj, h), dropout_,
                is_training());  // [B, T, C]
  }

  nn::Linear c_fc{nullptr};
  nn::Linear c_proj{nullptr};
  std::shared_ptr<nn::TensorParallel> tp;  // the group c_fc and c_proj split over; null: whole

 private:
  // gelu_tanh(c_fc(x)): [B, T, C] -> [B, T, 4C']. With model.fused_kernels on a CUDA device and
  // c_fc a whole layer without a LoRA adapter, c_fc's product without its bias, then the bias add
  // and the GELU in one kernel each way (nn/fused/fused_gpt_ops.h; under autocast the bias cast to
  // the product's dtype, as autocast's linear casts it).
  torch::Tensor hidden(const torch::Tensor& x) {
    if (fused_ && !tp && !c_fc->adapted() && x.is_cuda() && nn::fused_kernels_built()) {
      const auto h = torch::linear(x, c_fc->weight);  // [B, T, 4C]
      const auto& bias = c_fc->bias;
      const auto b = bias.defined() ? bias.to(h.scalar_type()) : bias;
      if (nn::fused_bias_gelu_supports(h, b)) return nn::fused_bias_gelu(h, b);
      return torch::gelu(b.defined() ? h + b : h, /*approximate=*/"tanh");
    }
    const auto h = tp ? c_fc->column_parallel(*tp, x) : apply_linear(c_fc, x);
    return torch::gelu(h, /*approximate=*/"tanh");
  }

  double dropout_;
  bool fused_;
};
TORCH_MODULE(GptMlp);

// What gpt's blocks take of the tokens' positions: nothing (learned position embeddings are added
// to the input, DecoderModelImpl::place).
struct NoPosition {};

// Pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). With model.fused_kernels
// on a CUDA device the LayerNorms, the add before ln_2 and the MLP's bias + GELU are fused kernels.
class GptBlockImpl : public torch::nn::Module {
 public:
  explicit GptBlockImpl(const GptOptions& cfg) {
    ln_1 = register_module("ln_1", GptLayerNorm(cfg.n_embd, cfg.bias, cfg.fused()));
    attn = register_module("attn", GptAttention(cfg));
    ln_2 = register_module("ln_2", GptLayerNorm(cfg.n_embd, cfg.bias, cfg.fused()));
    mlp = register_module("mlp", GptMlp(cfg));
  }

  // mask: packed rows' block-causal mask [B, 1, T, T], or undefined (causal).
  torch::Tensor forward(torch::Tensor x, NoPosition /*unused*/, const torch::Tensor& mask) {
    // x: [B, T, C]; the attention's residual add and ln_2 after it are one kernel where fused:
    // h = x + attn(...), [B, T, C] each.
    auto [h, normed] = ln_2->forward_add(x, attn->forward(ln_1->forward(x), mask));
    return h + mlp->forward(normed);  // [B, T, C]
  }

  torch::Tensor forward_cached(torch::Tensor x, NoPosition /*unused*/, KeyValueCache& cache) {
    auto [h, normed] =
        ln_2->forward_add(x, attn->forward_cached(ln_1->forward(x), cache));  // [B, T, C] x 2
    return h + mlp->forward(normed);                                          // [B, T, C]
  }

  GptLayerNorm ln_1{nullptr};
  GptAttention attn{nullptr};
  GptLayerNorm ln_2{nullptr};
  GptMlp mlp{nullptr};
};
TORCH_MODULE(GptBlock);

// nanoGPT's `transformer` ModuleDict: embeddings, blocks `h`, final norm.
class GptTransformerImpl : public torch::nn::Module {
 public:
  GptTransformerImpl(const GptOptions& cfg, int64_t vocab) {
    wte = register_module("wte", torch::nn::Embedding(vocab, cfg.n_embd));
    wpe = register_module("wpe", torch::nn::Embedding(cfg.block_size, cfg.n_embd));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layer; ++i) {
      blocks.push_back(GptBlock(cfg));
      h->push_back(blocks.back());
      if (nn::replaying()) nn::release_matrices(*blocks.back());
    }
    ln_f = register_module("ln_f", GptLayerNorm(cfg.n_embd, cfg.bias, cfg.fused()));
  }

  torch::nn::Embedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<GptBlock> blocks;  // the modules in h, typed
  GptLayerNorm ln_f{nullptr};
};
TORCH_MODULE(GptTransformer);

class GptImpl : public DecoderModelImpl<GptBlock, GptLayerNorm, NoPosition> {
 public:
  GptImpl(const GptOptions& cfg, const nn::CheckpointPolicy& policy, const InputSpec& input)
      : DecoderModelImpl("gpt", cfg.fused_kernels, cfg.block_size),
        n_head_(cfg.n_head),
        dropout_(cfg.dropout) {
    runner_ = nn::BlockRunner(policy);
    const int64_t vocab = decoder_vocabulary("gpt", cfg.vocab_size, input);
    check_token_input(cfg.block_size, cfg.vocab_size, input);
    if (cfg.n_layer <= 0) throw ModelError("model.n_layer", "gpt needs n_layer > 0");
    if (cfg.n_head <= 0) throw ModelError("model.n_head", "gpt needs n_head > 0");
    if (cfg.block_size <= 0) throw ModelError("model.block_size", "gpt needs block_size > 0");
    if (cfg.n_embd <= 0 || cfg.n_embd % cfg.n_head != 0) {
      throw ModelError("model.n_embd", "gpt needs n_embd (" + std::to_string(cfg.n_embd) +
                                           ") to be a positive multiple of n_head (" +
                                           std::to_string(cfg.n_head) + ")");
    }
    transformer = register_module("transformer", GptTransformer(cfg, vocab));
    set_stack(transformer->wte, transformer->blocks, transformer->ln_f);
    add_head(cfg.tie_embeddings, transformer->wte->weight, torch::TensorOptions());
    init_weights(cfg.n_layer);
  }

  // Megatron-LM's splits: attention column-parallel by heads (c_attn's query, key and value rows
  // of this rank's heads) then row-parallel (c_proj's columns), the MLP column- then
  // row-parallel, the token embedding and lm_head (tied or not) vocabulary-parallel; layer norms,
  // position embeddings and the row-parallel layers' biases whole on every rank.
  nn::SplitPlan split_over(std::shared_ptr<nn::TensorParallel> tp) override {
    const int n = tp->size();
    check_tp_split("model.n_head", n_head_, n);
    check_tp_split("the MLP's width (4 x model.n_embd)",
                   transformer->blocks[0]->mlp->c_fc->weight.size(0), n);
    check_tp_split("model.vocab_size", vocabulary(), n,
                   " or a vocabulary padded to a multiple of it (GPT-2's 50257 padded: 50304)");
    nn::SplitPlan plan{{"transformer.wte.weight", {0, 1}}, {"lm_head.weight", {0, 1}}};
    for (size_t i = 0; i < transformer->blocks.size(); ++i) {
      const std::string p = "transformer.h." + std::to_string(i) + ".";
      plan[p + "attn.c_attn.weight"] = plan[p + "attn.c_attn.bias"] = {0, 3};
      plan[p + "attn.c_proj.weight"] = plan[p + "mlp.c_proj.weight"] = {1, 1};
      plan[p + "mlp.c_fc.weight"] = plan[p + "mlp.c_fc.bias"] = {0, 1};
    }
    nn::keep_parts(*this, plan, tp->rank(), n);
    for (auto& block : transformer->blocks) block->attn->tp = block->mlp->tp = tp;
    tp_ = std::move(tp);
    return plan;
  }

 private:
  // Packed rows: each token's position embedding that of its position within its document.
  NoPosition place(torch::Tensor& h, const torch::Tensor& positions, int64_t start,
                   int64_t T) override {
    // [B, T] or [T]
    const auto pos = positions.defined()
                         ? positions
                         : torch::arange(start, start + T, h.options().dtype(torch::kLong));
    h = drop(h + transformer->wpe->forward(pos), dropout_, is_training());  // [B, T, C]
    return {};
  }

  // GPT-2 init: Linear and Embedding weights N(0, 0.02), biases 0, LayerNorm 1/0, and the residual
  // projections c_proj.weight N(0, 0.02/sqrt(2*n_layer)); while nn::replaying(), the matrices'
  // draws are recorded.
  void init_weights(int64_t n_layer) {
    torch::NoGradGuard no_grad;
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer));
    for (auto& p : named_parameters()) {
      if (p.value().dim() == 2) {
        nn::normal_or_record(p.value(), /*mean=*/0.0,
                             ends_with(p.key(), "c_proj.weight") ? proj_std : 0.02);
      } else if (ends_with(p.key(), ".bias")) {
        p.value().zero_();
      }
    }
  }

  int64_t n_head_;
  double dropout_;
  GptTransformer transformer{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace

void register_gpt(ModelRegistry& registry) {
  registry.add("gpt", decoder_kind<GptOptions, Gpt>(gpt2_hf_format()),
               config::options_of<GptOptions>());
}

}  // namespace trainer::models
